"""training/memory/fit.py: train.py's auto_batch_size (the largest micro-batch whose estimate fits the free memory,
the tokens per step kept), its run's estimate against the card, and the ladder of memory levers, on tiny models."""
import pytest

from training.errors import ConfigError
from training.memory import estimate as em, fit

GIB = 2 ** 30


def test_pick_batch_size_keeps_tokens_per_step_and_fails_clearly(tiny, trace_once):
    free = em.total_bytes(em.trace(fit.rebatched(tiny, 3), evaluate=False, warm_start=True)['train']['peak_bytes'],
                          cuda_context=False)
    train_keys = {k: v for k, v in tiny.items() if k not in em.ESTIMATOR_DEFAULTS}  # as train.py passes it
    # the free memory less gpu_headroom_gb, left to other programs, is the budget
    headroom = int(tiny['gpu_headroom_gb'] * GIB)
    assert headroom > 0
    assert fit.pick_batch_size(train_keys, free + headroom) == (3, 3)  # 3 x 3 >= the config's 4 x 2 samples per step
    assert fit.pick_batch_size(train_keys, free + headroom - 1) != (3, 3)
    with pytest.raises(ConfigError, match='even batch_size=1 needs'):
        fit.pick_batch_size(tiny, 1000)


def test_run_summary_gives_the_estimate_in_gib_against_the_card(tiny):
    train_keys = {k: v for k, v in tiny.items() if k not in em.ESTIMATOR_DEFAULTS}  # as train.py passes it
    roomy = fit.run_summary(train_keys, 80 * GIB)
    assert roomy['card_gib'] == 80 and roomy['fits']
    # the traced tensors, then the CUDA context, workspace and fragmentation on top of them
    assert 0 < roomy['train_peak_gib'] < roomy['total_gib'] and 0 < roomy['eval_total_gib']
    assert not fit.run_summary(train_keys, roomy['total_gib'] * GIB / 2)['fits']


def test_ladder_climbs_to_the_first_rung_that_fits(tiny, trace_once):
    """A budget between micro-batch 1's total without activation checkpointing and with it: the ladder stops at
    checkpointing, with the largest micro-batch that fits there and at least the config's samples per step."""
    tiny = {**tiny, 'n_layer': 2, 'block_size': 256, 'batch_size': 4, 'gradient_accumulation_steps': 2}

    def total(config):
        return em.total_bytes(em.trace(config, evaluate=False, warm_start=True)['train']['peak_bytes'])

    plain, checkpointed = (total(fit.rebatched({**tiny, 'activation_checkpointing': on}, 1)) for on in (False, True))
    budget = (plain + checkpointed) // 2
    steps = fit.ladder(tiny, budget)
    # smaller loss chunks change nothing where the loss runs in one piece (a 96-token vocabulary)
    assert [(step['rung'], step['fits']) for step in steps] == [('as configured', False),
                                                                 ('smaller loss chunks', False),
                                                                 ('activation checkpointing', True)]
    last = steps[-1]
    assert last['batch_1_total_bytes'] == checkpointed and last['total_bytes'] <= budget
    assert last['batch_size'] * last['gradient_accumulation_steps'] >= 8
    assert last['batch_size'] <= last['largest_batch_size']
    largest = fit.rebatched({**tiny, 'activation_checkpointing': True}, last['largest_batch_size'])
    assert total(largest) <= budget < total(fit.rebatched(largest, last['largest_batch_size'] + 1))


def test_under_torchrun_the_ladder_splits_the_optimizer_state_before_recomputing(tiny, trace_once):
    """world_size=2 under ddp: a budget between micro-batch 1's total per process under ddp and under zero1 stops the
    ladder at zero1, which costs no compute, before activation checkpointing; where the config is zero1 already (and
    with one process: the ladder of test_ladder_climbs_to_the_first_rung_that_fits) the rung is not tried."""
    tiny = {**tiny, 'n_layer': 2, 'block_size': 256, 'batch_size': 2, 'gradient_accumulation_steps': 2,
            'world_size': 2}

    def total(config):
        return em.total_bytes(em.trace(config, evaluate=False, warm_start=True)['train']['peak_bytes'])

    ddp, zero1 = (total(fit.rebatched({**tiny, 'parallelism': mode}, 1)) for mode in ('ddp', 'zero1'))
    budget = (ddp + zero1) // 2
    steps = fit.ladder(tiny, budget)
    assert [(step['rung'], step['fits']) for step in steps] == [
        ('as configured', False), ('smaller loss chunks', False), ('optimizer state split over the processes', True)]
    assert steps[-1]['command']['parallelism'] == 'zero1' and steps[-1]['batch_1_total_bytes'] == zero1
    assert 'optimizer state split over the processes' not in [
        step['rung'] for step in fit.ladder({**tiny, 'parallelism': 'zero1'}, budget)]


def test_a_record_model_is_offered_no_activation_checkpointing(tiny, monkeypatch):
    """gpt2026.py's training is the record's, without activation checkpointing: find_batch_size searches with it off
    alone, and auto_batch_size's error does not name it (under torchrun's ddp it names zero1); model.py's GPT gets
    both."""
    found = {}

    def largest_batch(config, budget_bytes, loss='chunked', progress=None, cuda_context=True):
        found.setdefault(config['model_file'], []).append(config['activation_checkpointing'])
        return (None, {1: 3 * GIB}) if budget_bytes < GIB else (2, {2: GIB})
    monkeypatch.setattr(fit, 'largest_batch', largest_batch)
    record = {**tiny, 'model_file': 'gpt2026.py'}
    assert [choice['activation_checkpointing'] for choice in fit.find_batch_sizes(record, 8 * GIB)] == [False]
    assert [choice['activation_checkpointing'] for choice in fit.find_batch_sizes(tiny, 8 * GIB)] == [False, True]
    assert found == {'gpt2026.py': [False], 'model.py': [False, True]}
    with pytest.raises(ConfigError, match=r'\): try a smaller model or block_size$'):
        fit.pick_batch_size(record, GIB // 2)
    with pytest.raises(ConfigError, match=r'\): try --activation_checkpointing=True, a smaller model or block_size$'):
        fit.pick_batch_size(tiny, GIB // 2)
    # under torchrun's ddp, zero1 first: it splits the optimizer state at no compute
    with pytest.raises(ConfigError, match=r'\): try --parallelism=zero1, a smaller model or block_size$'):
        fit.pick_batch_size({**record, 'world_size': 2, 'gradient_accumulation_steps': 2}, GIB // 2)
