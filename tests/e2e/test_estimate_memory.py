"""The estimator's slow checks, in this process: every card preset fits its card, GPT-2 124M's logits at batch 64 exist
only with nanoGPT's loss, and every rung of the ladder passes train.py's checks and fits."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from helpers import ROOT, check_only_the_naive_loss_holds_the_logits, trace_card_preset
from training import rules
from training.memory import estimate as em


GIB = 2 ** 30
CARD_PRESETS = sorted((ROOT / 'config').glob('*_[0-9]*gb.py'))  # each named for its card: *_12gb.py, *_24gb.py


@pytest.fixture(scope='module')
def card_preset_traces():
    """{preset: future of helpers.trace_card_preset}, two at a time: a trace is single-threaded Python (FakeTensorMode
    computes nothing), and each gpt2-xl preset's takes most of a minute. A failed trace fails its own test."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn')) as pool:
        yield {path: pool.submit(trace_card_preset, path) for path in CARD_PRESETS}


@pytest.mark.parametrize('path', CARD_PRESETS, ids=lambda path: path.name)
def test_card_presets_fit_their_card(card_preset_traces, path):
    """Training and evaluation, with the allowance, within the card each preset is named for, less the memory left to
    other programs (gpu_headroom_gb). Traced warm-started: the same peak (see
    test_warm_start_trace_has_the_same_peak_as_two_full_iterations) in half the time."""
    budget_bytes, result = card_preset_traces[path].result()
    train, evaluation = (em.total_bytes(result[phase]['peak_bytes']) for phase in ('train', 'eval'))
    assert train <= budget_bytes and evaluation <= budget_bytes
    assert train > result['train']['peak_bytes'] + em.CUDA_CONTEXT_BYTES


def test_gpt2_at_batch_64_naive_loss_builds_the_full_logits_and_chunked_does_not():
    """The seeds' "Tried to allocate 6.14 GiB": nanoGPT's logits of GPT-2 124M at batch 64 x 1024; model.py's loss holds
    nothing of them beyond a chunk, the largest tensor of its trace an MLP activation."""
    _, chunked, logits = check_only_the_naive_loss_holds_the_logits(64, n_layer=12)
    assert round(logits['bytes'] / GIB, 2) == 6.14
    assert chunked['largest_allocations'][0]['bytes'] < GIB // 2


def passes_train_py_checks(config, command):
    """`config` with the printed --key=value `command` applied, checked by train.py's own rules (training.rules) for
    its world_size on a GPU; the applied config."""
    applied = {**config, **command}
    rules.check_config(applied, applied['world_size'], 'cuda')
    return applied


def climb_every_rung(config):
    """The ladder at ever smaller budgets: each just below micro-batch 1's total at the rung the ladder before stopped
    at, so that each climbs past it, until none fits. The ladders, each with its budget. The ladders retrace the same
    configs: the test's trace_once makes each trace once."""
    ladders = []
    budget = em.total_bytes(em.trace(config, evaluate=False)['train']['peak_bytes']) - 1  # below as configured
    while True:
        steps = em.ladder(config, budget)
        ladders.append((budget, steps))
        if not steps[-1]['fits']:
            return ladders
        budget = steps[-1]['batch_1_total_bytes'] - 1


@pytest.mark.parametrize('overrides', [
    pytest.param({}, id='one process'),  # fp32, clipping, 2 micro-steps: the case, where train.py refused
    pytest.param({'batch_size': 3, 'gradient_accumulation_steps': 4, 'world_size': 2, 'parallelism': 'zero1'},
                 id='zero1 on 2 processes', marks=pytest.mark.slow),
    pytest.param({'optimizer_in_backward': True, 'grad_clip': 0.0, 'gradient_accumulation_steps': 1, 'batch_size': 8},
                 id='step in backward', marks=pytest.mark.slow),
])
def test_every_ladder_command_passes_train_py_checks_and_fits(tiny, overrides, trace_once):
    """Every rung the ladder can stop at prints a command train.py accepts, whose step fits the budget, with the tokens
    per step it says; the step in backward cannot accumulate, so its command has one micro-step and says it has fewer
    tokens than configured (issue: it printed gradient_accumulation_steps=96, which train.py refuses). A rung that
    train.py would refuse is skipped."""
    config = {**tiny, 'n_layer': 1, 'n_embd': 256, **overrides}  # wide enough for 8-bit moments to be smaller
    configured_samples = config['batch_size'] * config['gradient_accumulation_steps']
    stopped_at = []
    ladders = climb_every_rung(config)
    for budget, steps in ladders[:-1]:
        last = steps[-1]
        stopped_at.append(last['rung'])
        applied = passes_train_py_checks(config, last['command'])
        assert set(last['command']) <= set(last['levers']) | {'batch_size', 'gradient_accumulation_steps'}
        assert (applied['batch_size'], applied['gradient_accumulation_steps']) == \
            (last['batch_size'], last['gradient_accumulation_steps'])
        assert last['tokens_per_step'] == applied['batch_size'] * applied['gradient_accumulation_steps'] * 32
        assert em.total_bytes(em.trace(applied, evaluate=False)['train']['peak_bytes']) == last['total_bytes']
        assert last['total_bytes'] <= budget
        samples = applied['batch_size'] * applied['gradient_accumulation_steps']
        if applied['optimizer_in_backward']:
            assert applied['gradient_accumulation_steps'] == 1 and samples <= configured_samples
        else:
            assert samples >= configured_samples
    skipped = [step['rung'] for step in ladders[-1][1] if step['skipped']]
    assert skipped == (['optimizer step in backward'] if config['world_size'] > 1 else [])  # one process only
    if not config['optimizer_in_backward']:  # the rung that adds it stops a ladder, where train.py allows it
        assert ('optimizer step in backward' in stopped_at) == (config['world_size'] == 1)
    assert len(stopped_at) >= 3
