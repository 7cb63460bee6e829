"""training/schedule.py: the learning rate schedules, cosine as nanoGPT's and wsd."""
import math

import pytest

from training.schedule import cosine_lr, wsd_lr


def nanogpt_get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT's train.py get_lr, as it is (it divides by zero where warmup_iters == lr_decay_iters == it)."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def test_schedule_is_nanogpts_and_defined_where_nanogpts_divides_by_zero():
    for it in range(0, 120):
        assert cosine_lr(it, 6e-4, 6e-5, 10, 100) == pytest.approx(nanogpt_get_lr(it, 6e-4, 6e-5, 10, 100), abs=1e-15)
    assert [cosine_lr(it, 1.0, 0.1, 1, 1) for it in range(3)] == [0.5, 0.1, 0.1]  # nanoGPT: ZeroDivisionError at 1
    assert [cosine_lr(it, 1.0, 0.1, 4, 2) for it in (3, 4, 5)] == [0.8, 0.1, 0.1]  # decay ends before warmup does


def test_wsd_warms_up_as_cosine_holds_then_decays_linearly_to_min_lr():
    lrs = [wsd_lr(it, 1.0, 0.1, 2, 10, 0.3) for it in range(12)]
    assert lrs[:2] == [cosine_lr(it, 1.0, 0.1, 2, 10) for it in range(2)]  # the same warmup
    assert lrs[2:7] == [1.0] * 5  # stable until the last 30% of lr_decay_iters
    assert lrs[7:] == pytest.approx([1.0, 0.7, 0.4, 0.1, 0.1])  # linear from iter 7 to min_lr at 10, then held
    # a cooldown longer than what follows the warmup starts right after it
    assert [wsd_lr(it, 1.0, 0.0, 4, 8, 1.0) for it in (3, 4, 6, 8)] == pytest.approx([0.8, 1.0, 0.5, 0.0])
