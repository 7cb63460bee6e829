"""training/schedule.py: the learning rate schedules, cosine as nanoGPT's and wsd; the sliding window's warmup."""
import math

import pytest

from training.schedule import attn_window_at, cosine_lr, wsd_lr


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


def test_window_warmup_is_modded_nanogpts_and_reaches_attn_window():
    """The record of 24 Nov 2024: 64 * ((step / 1750 * (1792 - 64) + 64) // 64) at each of its 1,750 steps."""
    windows = [attn_window_at(it, 1792, 64, 1750) for it in range(1800)]
    assert windows[:1751] == [64 * int((it / 1750 * (1792 - 64) + 64) // 64) for it in range(1751)]
    assert windows[0] == 64 and windows[1750:] == [1792] * 50
    assert all(w % 64 == 0 for w in windows) and windows == sorted(windows) and len(set(windows)) == 28
    # a start that does not divide attn_window: multiples of it on the way, attn_window at the end
    assert [attn_window_at(it, 10, 4, 4) for it in range(6)] == [4, 4, 4, 8, 10, 10]  # 4 + it / 4 * 6, floored


def test_a_window_warmup_aimed_past_attn_window_is_capped_there():
    """The record of 4 Jan 2025: blocks of 128, int(((1 - x) * 128 + x * 1856) // 128) of them at progress x, which
    reach 14 (1,792) at step 1,339 of 1,390; a line aimed at attn_window itself reaches it only at the end."""
    windows = [attn_window_at(it, 1792, 128, 1390, 1856) for it in range(1391)]
    assert windows == [128 * int(((1 - it / 1390) * 128 + it / 1390 * 1856) // 128) for it in range(1391)]
    assert windows.index(1792) == 1339 and max(windows) == 1792
    assert [attn_window_at(it, 1792, 128, 1390) for it in (1339, 1389)] == [1664, 1664]


def test_without_window_warmup_the_window_is_attn_window():
    assert [attn_window_at(it, 1024, 64, 0) for it in (0, 1, 1000)] == [1024] * 3
    assert attn_window_at(0, 0, 64, 0) == 0  # no window: GPT-2's attention over the block
