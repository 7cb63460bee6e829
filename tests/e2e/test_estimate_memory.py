"""The estimator's slow checks, in this process: its estimate against the peak of the real train.py, every card preset
fits its card, GPT-2 124M's logits at batch 64 exist only with nanoGPT's loss, and every rung of the ladder passes
train.py's checks and fits."""
import contextlib
import importlib.util
import io
import runpy
import sys
from unittest import mock

import pytest

import estimate_memory
from helpers import ROOT, check_only_the_naive_loss_holds_the_logits, write_char_dataset
from training import rules, runs
from training.memory import estimate as em, fit
from training.memory.tracer import MemoryTracer


GIB = 2 ** 30
CARD_PRESETS = sorted((ROOT / 'config').glob('*_[0-9]*gb.py'))  # each named for its card: *_12gb.py, *_24gb.py


# the keys of each comparison with the real train.py: the levers the estimate must follow train.py through
FIDELITY_CASES = {
    'fp32': {},
    'bf16 autocast': {'dtype': 'bfloat16'},
    'checkpointing': {'activation_checkpointing': True},
    'accumulation': {'gradient_accumulation_steps': 3},
    'bf16 with checkpointing and accumulation': {'dtype': 'bfloat16', 'activation_checkpointing': True,
                                                 'gradient_accumulation_steps': 2},
    'adamw_bf16': {'optim': 'adamw_bf16'},
    'optimizer_in_backward': {'optimizer_in_backward': True, 'grad_clip': 0.0},
    # Newton-Schulz's temporaries (the Nesterov update, its bf16 copy, the Gram matrices) traced as they run
    'muon with accumulation': {'optim': 'muon', 'gradient_accumulation_steps': 2},
    'autocast cache with checkpointing': {'dtype': 'bfloat16', 'activation_checkpointing': True,
                                          'autocast_cache': True},
    'bf16 weights': {'dtype': 'bfloat16', 'weight_dtype': 'bfloat16', 'gradient_accumulation_steps': 2},
    # rotary, RMSNorm, QK-norm, ReLU^2, an untied head and the soft-capped loss's second chunk buffer; the value
    # embeddings' table and rows (kept for both blocks that use them), the kept U-net outputs, the embedding x0; the
    # attention mask of windowed documents (one for all blocks) and the blocks' padded keys and values
    'modern architecture, muon, checkpointing': {'pos_emb': 'rope', 'norm': 'rmsnorm', 'qk_norm': True, 'mlp': 'relu2',
                                                 'tie_weights': False, 'zero_init_proj': True, 'logit_softcap': 15.0,
                                                 'value_embeds': 1, 'unet_skips': True, 'x0_shortcut': True,
                                                 'attn_window': 16, 'doc_token': 0,
                                                 'optim': 'muon', 'activation_checkpointing': True},
    'later records in bf16': {'value_embeds': 1, 'unet_skips': True, 'x0_shortcut': True, 'attn_window': 16,
                              'doc_token': 0, 'pos_emb': 'rope', 'dtype': 'bfloat16'},
    # the speedrun presets' record: the normed embedding, norms without gains, block 0's values kept for every block,
    # Muon's q, k and v orthogonalized one at a time
    'the record in bf16': {'pos_emb': 'rope', 'norm': 'rmsnorm', 'norm_gain': False, 'embed_norm': True,
                           'value_residual': True, 'x0_shortcut': True, 'unet_skips': True, 'attn_window': 16,
                           'doc_token': 0, 'optim': 'muon', 'muon_split_qkv': True, 'muon_momentum_form': 'sum',
                           'scalar_learning_rate': 0.04, 'dtype': 'bfloat16'},
    'bf16 weights, 8-bit moments, step in backward': {'dtype': 'bfloat16', 'weight_dtype': 'bfloat16',
                                                      'optim': 'adamw_8bit', 'optimizer_in_backward': True,
                                                      'grad_clip': 0.0},
}
FIDELITY_MODEL = dict(n_layer=2, n_head=4, n_embd=64, block_size=64, batch_size=8, bias=False, dropout=0.0)


def train_py_peak(keys, data_dir, out_dir):
    """The peak of live tensor bytes of the real train.py, run in this process on the CPU under the estimator's tracer:
    an evaluation at iteration 0 (smaller: no optimizer state, no gradients), then 2 training iterations."""
    argv = ['train.py', f'--data_dir={data_dir}', '--dataset=fidelity', f'--out_dir={out_dir}', '--device=cpu',
            '--compile=False', '--max_iters=1', '--eval_iters=1', '--eval_batch_size=1', '--log_interval=1',
            *(f'--{key}={value}' for key, value in keys.items())]
    with MemoryTracer() as tracer, mock.patch.object(sys, 'argv', argv), contextlib.redirect_stdout(io.StringIO()):
        runpy.run_path(str(ROOT / 'train.py'), run_name='__main__')
    return tracer.peak


@pytest.mark.parametrize('case', FIDELITY_CASES)
def test_estimate_equals_the_peak_of_the_real_train_py(tmp_path, case):
    """The estimator's own loop, model and optimizer against train.py itself: an edit to train.py's loop that changes
    what it keeps alive shows here."""
    if FIDELITY_CASES[case].get('optim') == 'adamw_8bit' and importlib.util.find_spec('torchao') is None:
        pytest.skip('adamw_8bit needs torchao: pip install -r requirements-dev.txt')
    write_char_dataset(tmp_path / 'data', 'fidelity', vocab_size=96)
    keys = {'dtype': 'float32', 'gradient_accumulation_steps': 1, **FIDELITY_MODEL, **FIDELITY_CASES[case]}
    real = train_py_peak(keys, tmp_path / 'data', tmp_path / 'out')
    config = {**estimate_memory.estimator_defaults(), 'data_dir': str(tmp_path / 'data'), 'dataset': 'fidelity',
              **keys}
    em.check_config(config)
    estimated = em.trace(config, evaluate=False, device_type='cpu')['train']['peak_bytes']
    assert estimated == pytest.approx(real, rel=0.02)


# gpt2026.py's model at the record's depth, 32 wide, on rows of 64 characters, a document at each newline
RECORD_MODEL = dict(model_file='gpt2026.py', n_layer=11, n_head=2, n_embd=32, block_size=64, batch_size=2,
                    doc_token=0, grad_clip=0.0, max_iters=1)


def record_config(data_dir, **keys):
    write_char_dataset(data_dir, 'fidelity', vocab_size=96)
    return {**estimate_memory.estimator_defaults(), 'data_dir': str(data_dir), 'dataset': 'fidelity',
            'gradient_accumulation_steps': 1, **RECORD_MODEL, **keys}


def test_a_record_models_estimate_equals_the_peak_of_the_real_train_py(tmp_path, monkeypatch):
    """As above for model_file='gpt2026.py' at the first two iterations, the ones train.py runs here (the estimate
    traces the largest stage's: training.runs.GPT2026Run.traced_steps)."""
    config = record_config(tmp_path / 'data', dtype='float32')
    real = train_py_peak({key: config[key] for key in ('dtype', 'gradient_accumulation_steps', *RECORD_MODEL)},
                         tmp_path / 'data', tmp_path / 'out')
    start = runs.GPT2026Run.__init__

    def first_two(self, *args):
        start(self, *args)
        self.traced_steps = (0, 1)
    monkeypatch.setattr(runs.GPT2026Run, '__init__', first_two)
    em.check_config(config)
    estimated = em.trace(config, evaluate=False, device_type='cpu')['train']['peak_bytes']
    assert estimated == pytest.approx(real, rel=0.02)


def test_a_record_models_warm_start_has_the_peak_of_its_two_iterations(tmp_path):
    """As model.py's (tests/unit/training/memory/test_estimate.py), for gpt2026.py's run, traced from SPLIT_STEP,
    the embedding split between its two iterations: within one allocation (a scalar loss that the two orders keep to
    different moments)."""
    config = record_config(tmp_path, dtype='bfloat16', block_size=256, batch_size=1)
    full, warm = (em.trace(config, evaluate=False, warm_start=warm)['train'] for warm in (False, True))
    assert abs(warm['peak_bytes'] - full['peak_bytes']) <= em.CUDA_ALIGNMENT
    assert all(warm['breakdown'][part] == full['breakdown'][part] for part in full['breakdown']
               if part != 'temporaries')


@pytest.mark.parametrize('path', CARD_PRESETS, ids=lambda path: path.name)
def test_card_presets_fit_their_card(card_preset_traces, path):
    """Training and evaluation, with the allowance, within the card each preset is named for, less the memory left to
    other programs (gpu_headroom_gb). Traced warm-started: the same peak (see
    test_warm_start_trace_has_the_same_peak_as_two_full_iterations) in half the time; in the background, from the
    first end-to-end test on (conftest.py's card_preset_traces)."""
    budget_bytes, result = card_preset_traces[path].result()
    train, evaluation = (em.total_bytes(result[phase]['peak_bytes']) for phase in ('train', 'eval'))
    assert train <= budget_bytes and evaluation <= budget_bytes
    assert train > result['train']['peak_bytes'] + em.CUDA_CONTEXT_BYTES


def test_gpt2_at_batch_64_naive_loss_builds_the_full_logits_and_chunked_does_not():
    """The seeds' "Tried to allocate 6.14 GiB": nanoGPT's logits of GPT-2 124M at batch 64 x 1024; model.py's loss holds
    nothing of them beyond a chunk (loss_chunk_mib's), the largest tensor of its trace a tenth of the logits."""
    _, chunked, logits = check_only_the_naive_loss_holds_the_logits(64, n_layer=12)
    assert round(logits['bytes'] / GIB, 2) == 6.14
    assert chunked['largest_allocations'][0]['bytes'] < logits['bytes'] // 10


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
        steps = fit.ladder(config, budget)
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
