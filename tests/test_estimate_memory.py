"""estimate_memory.py: the traced peak against a real CPU run, the 12 and 24 GB presets, the naive loss's full logits,
the micro-batch search, pick_batch_size and the one-line errors. Tiny models except where GPT-2 124M is the point."""
import contextlib
import gc
import importlib.util
import io
import json
import multiprocessing
import runpy
import sys
from concurrent.futures import ProcessPoolExecutor
from unittest import mock

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import estimate_memory
from helpers import ROOT, trace_card_preset, write_char_dataset
from model import CHUNK_ELEMENTS, GPT, GPTConfig, VOCAB_BLOCK
from training import rules
from training.checkpoint import save_checkpoint
from training.errors import ConfigError
from training.memory import estimate as em
from training.memory.advice import fitting_batch_size, oom_advice, resplit
from training.memory.tracer import MemoryTracer

GIB = 2 ** 30
CARD_PRESETS = sorted((ROOT / 'config').glob('*_[0-9]*gb.py'))  # each named for its card: *_12gb.py, *_24gb.py


def gpt2_config(batch_size, **overrides):
    """GPT-2 124M from scratch, block 1024, bf16, one micro-step; a small evaluation batch keeps the trace short."""
    return {**estimate_memory.estimator_defaults(), 'init_from': 'scratch', 'dataset': 'openwebtext', 'n_layer': 12,
            'n_head': 12,
            'n_embd': 768, 'block_size': 1024, 'bias': False, 'dropout': 0.0, 'batch_size': batch_size,
            'gradient_accumulation_steps': 1, 'eval_batch_size': 1, 'dtype': 'bfloat16', **overrides}


def real_cpu_peak(config):
    """Peak of allocated bytes over a real CPU run of build + train_iterations, from the profiler's memory events
    (each event is +bytes or -bytes, in time order)."""
    gc.collect()  # nothing allocated before the profile may be freed during it
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model, optimizer = em.build(config, config['activation_checkpointing'])
        em.train_iterations(model, optimizer, config, config['batch_size'], 'cpu')
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == '[memory]'),
                    key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


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
    # rotary, RMSNorm, QK-norm, ReLU^2, an untied head and the soft-capped loss's second chunk buffer
    'modern architecture, muon, checkpointing': {'pos_emb': 'rope', 'norm': 'rmsnorm', 'qk_norm': True, 'mlp': 'relu2',
                                                 'tie_weights': False, 'zero_init_proj': True, 'logit_softcap': 15.0,
                                                 'optim': 'muon', 'activation_checkpointing': True},
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


@pytest.mark.parametrize('checkpointing', [False, True])
def test_traced_peak_matches_real_cpu_peak(tiny, checkpointing):
    config = {**tiny, 'activation_checkpointing': checkpointing}
    traced = em.trace(config, alignment=1)['train']['peak_bytes']  # the CPU allocator does not round to 512
    real = real_cpu_peak(config)
    assert traced == pytest.approx(real, rel=0.02)


def test_breakdown_sums_to_peak_and_names_the_parts(tiny):
    result = em.trace(tiny)
    for phase in ('train', 'eval'):
        assert sum(result[phase]['breakdown'].values()) == result[phase]['peak_bytes']
    breakdown = result['train']['breakdown']
    params = sum(p.numel() for p in em.build(tiny, False)[0].parameters())
    assert breakdown['parameters'] >= 4 * params and breakdown['optimizer_state'] >= 8 * params
    assert breakdown['gradients'] >= 4 * params  # 2 micro-steps: the gradients exist during the 2nd forward
    assert breakdown['activations'] > 0 and breakdown['ddp_gradient_buckets'] == 0


def test_ddp_adds_a_copy_of_the_gradients(tiny):
    tiny = {**tiny, 'gradient_accumulation_steps': 4}  # 2 micro-steps per rank either way
    single = em.trace(tiny, evaluate=False)['train']
    ddp = em.trace({**tiny, 'world_size': 2}, evaluate=False)['train']
    params = sum(p.numel() for p in em.build(tiny, False)[0].parameters())
    assert ddp['breakdown']['ddp_gradient_buckets'] == pytest.approx(4 * params, abs=512)
    assert ddp['peak_bytes'] - single['peak_bytes'] == ddp['breakdown']['ddp_gradient_buckets']


def test_zero1_and_fsdp_split_the_per_rank_state_over_the_ranks(tiny):
    """Rank 0's share, traced through the real sharding code over a stand-in process group."""
    tiny = {**tiny, 'gradient_accumulation_steps': 4, 'n_layer': 4}  # FSDP gathers a block or two at a time
    params = sum(p.numel() for p in em.build(tiny, False)[0].parameters())
    single = em.trace(tiny, evaluate=False)['train']
    for parallelism in ('zero1', 'fsdp'):
        peaks, weights = [], []
        for world_size in (2, 4):
            result = em.trace({**tiny, 'world_size': world_size, 'parallelism': parallelism}, evaluate=False)
            breakdown = result['train']['breakdown']
            assert result['parallelism'] == parallelism
            # AdamW's two fp32 moments: rank 0 holds about its 1/world_size share, a tensor or a row more at most
            assert 8 * params / world_size <= breakdown['optimizer_state'] < 8 * params / world_size * 1.5
            if parallelism == 'fsdp':  # no DDP bucket copy of the gradients
                assert breakdown['ddp_gradient_buckets'] == 0
            peaks.append(result['train']['peak_bytes'])
            weights.append(breakdown['parameters'])
        assert peaks[1] < peaks[0]
        if parallelism == 'fsdp':  # shards plus the blocks gathered at the peak
            assert weights[1] < weights[0] and weights[1] < 4 * params
            assert peaks[0] < single['peak_bytes']


def test_fsdp_mixed_precision_gathers_the_weights_in_half_the_bytes(tiny):
    """Through the real fully_shard with its MixedPrecisionPolicy: the shards stay fp32 (as does the optimizer state);
    the blocks gathered at the peak are bf16."""
    tiny = {**tiny, 'gradient_accumulation_steps': 4, 'n_layer': 4, 'dtype': 'bfloat16', 'parallelism': 'fsdp',
            'world_size': 2}
    fp32, bf16 = (em.trace({**tiny, 'fsdp_mixed_precision': on}, evaluate=False)['train'] for on in (False, True))
    shards = sum(p.numel() for p in em.build(tiny, False)[0].parameters()) * 4 / 2  # about rank 0's fp32 share
    gathered_fp32, gathered_bf16 = (r['breakdown']['parameters'] - shards for r in (fp32, bf16))
    assert 0.45 * gathered_fp32 < gathered_bf16 < 0.6 * gathered_fp32
    assert bf16['breakdown']['optimizer_state'] == fp32['breakdown']['optimizer_state']
    assert bf16['peak_bytes'] < fp32['peak_bytes']


def test_activation_checkpointing_lowers_the_traced_activations(tiny):
    tiny = {**tiny, 'n_layer': 4, 'batch_size': 8}  # enough blocks that their saved activations dominate
    plain, checkpointed = (em.trace({**tiny, 'activation_checkpointing': on}, evaluate=False)['train']
                           for on in (False, True))
    assert checkpointed['breakdown']['activations'] < plain['breakdown']['activations'] / 2
    assert checkpointed['peak_bytes'] < plain['peak_bytes']


def test_resume_takes_the_model_from_the_checkpoint(tiny, tmp_path):
    model_args = dict(n_layer=3, n_head=2, n_embd=32, block_size=16, bias=False, vocab_size=100, dropout=0.0)
    save_checkpoint({'model': {}, 'model_args': model_args}, str(tmp_path / 'out'))
    config = {**tiny, 'init_from': 'resume', 'out_dir': str(tmp_path / 'out'), 'block_size': 16}
    model = em.trace(config, evaluate=False)['model']
    assert {k: model[k] for k in ('n_layer', 'n_embd', 'block_size', 'vocab_size', 'bias')} == \
        dict(n_layer=3, n_embd=32, block_size=16, vocab_size=100, bias=False)
    with pytest.raises(ConfigError, match='no checkpoint at'):
        em.trace({**config, 'out_dir': str(tmp_path / 'missing')})


@pytest.fixture(scope='module')
def card_preset_traces():
    """{preset: future of helpers.trace_card_preset}, two at a time: a trace is single-threaded Python (FakeTensorMode
    computes nothing), and each gpt2-xl preset's takes most of a minute. A failed trace fails its own test."""
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context('spawn')) as pool:
        yield {path: pool.submit(trace_card_preset, path) for path in CARD_PRESETS}


@pytest.mark.slow
@pytest.mark.parametrize('path', CARD_PRESETS, ids=lambda path: path.name)
def test_card_presets_fit_their_card(card_preset_traces, path):
    """Training and evaluation, with the allowance, within the card each preset is named for, less the memory left to
    other programs (gpu_headroom_gb). Traced warm-started: the same peak (see
    test_warm_start_trace_has_the_same_peak_as_two_full_iterations) in half the time."""
    budget_bytes, result = card_preset_traces[path].result()
    train, evaluation = (em.total_bytes(result[phase]['peak_bytes']) for phase in ('train', 'eval'))
    assert train <= budget_bytes and evaluation <= budget_bytes
    assert train > result['train']['peak_bytes'] + em.CUDA_CONTEXT_BYTES


def test_naive_loss_at_batch_64_builds_the_full_logits_and_chunked_does_not():
    naive = em.trace(gpt2_config(64), loss='naive')['train']
    logits = {'shape': [65536, 50304], 'dtype': 'bfloat16', 'bytes': 65536 * 50304 * 2, 'category': 'loss_path'}
    assert logits in naive['largest_loss_path_allocations'] and logits in naive['largest_allocations']
    assert round(logits['bytes'] / GIB, 2) == 6.14  # the seeds' "Tried to allocate 6.14 GiB"
    chunked = em.trace(gpt2_config(64))['train']
    # the loss path holds nothing larger than its own gradients (hidden: 65536 x 768, weight: 50304 x 768, fp32),
    # so nothing of the (65536, 50304) logits beyond a chunk
    assert max(a['bytes'] for a in chunked['largest_loss_path_allocations']) <= 65536 * 768 * 4
    assert chunked['largest_allocations'][0]['bytes'] < GIB // 2  # an MLP activation
    # its gradients; under bf16 autocast the bf16 copy of the weight and a block of bf16 product on its way into the
    # fp32 weight gradient; one chunk's fp32 logits buffer and a bf16 chunk beside it; a few MiB of (rows, d) pieces
    gradients = (65536 + 50304) * 768 * 4
    beyond_gradients = (50304 + VOCAB_BLOCK) * 768 * 2 + CHUNK_ELEMENTS * (4 + 2) + 8 * 2 ** 20
    assert gradients < chunked['breakdown']['loss_path'] < gradients + beyond_gradients
    assert naive['peak_bytes'] > chunked['peak_bytes'] + 30 * GIB


@pytest.mark.parametrize('overrides', [
    {'gradient_accumulation_steps': 1}, {'gradient_accumulation_steps': 2},
    {'gradient_accumulation_steps': 4, 'activation_checkpointing': True},
    {'gradient_accumulation_steps': 1, 'grad_clip': 0.0, 'optimizer_in_backward': True},
    {'dtype': 'bfloat16', 'weight_dtype': 'bfloat16', 'optim': 'adamw_bf16'},
], ids=lambda overrides: ','.join(f'{k}={v}' for k, v in overrides.items()))
def test_warm_start_trace_has_the_same_peak_as_two_full_iterations(tiny, overrides):
    config = {**tiny, **overrides}
    full = em.trace(config, evaluate=False)['train']
    warm = em.trace(config, evaluate=False, warm_start=True)['train']
    assert (warm['peak_bytes'], warm['breakdown']) == (full['peak_bytes'], full['breakdown'])


def test_warm_start_steps_in_backward_a_parameter_at_a_time(weighty):
    """Where the weights' training state dominates, all the gradients at once would be the peak: the step in backward
    never holds them."""
    config = {**weighty, 'optimizer_in_backward': True}
    full = em.trace(config, evaluate=False)['train']
    warm = em.trace(config, evaluate=False, warm_start=True)['train']
    assert (warm['peak_bytes'], warm['breakdown']) == (full['peak_bytes'], full['breakdown'])


def test_find_batch_size_cli_returns_a_fitting_batch_whose_double_does_not_fit(tiny, capsys, monkeypatch):
    tiny = {**tiny, 'batch_size': 4, 'gradient_accumulation_steps': 32}  # 128 samples of 32 tokens per step

    def estimated_total(batch_size, checkpointing):
        config = em.rebatched({**tiny, 'activation_checkpointing': checkpointing}, batch_size)
        return em.total_bytes(em.trace(config, evaluate=False)['train']['peak_bytes'])

    budget_gb = (estimated_total(8, False) + 1) / GIB
    monkeypatch.setattr(estimate_memory, 'estimator_defaults', lambda: tiny)
    with pytest.raises(SystemExit):  # the card's memory less the headroom is the budget
        estimate_memory.main(['--find_batch_size', '--json', f'--gpu_memory_gb={budget_gb + 0.25}',
                              '--gpu_headroom_gb=0.25'])
    result = json.loads(capsys.readouterr().out)
    assert result['budget_bytes'] == result['gpu_memory_bytes'] - GIB // 4 == int(budget_gb * GIB)
    off, on = result['find_batch_size']
    assert off['largest_batch_size'] == 8 and on['largest_batch_size'] >= 8
    for choice in (off, on):
        largest, checkpointing = choice['largest_batch_size'], choice['activation_checkpointing']
        assert choice['largest_total_bytes'] == estimated_total(largest, checkpointing) <= result['budget_bytes']
        assert estimated_total(2 * largest, checkpointing) > result['budget_bytes']
        applied = passes_train_py_checks(tiny, choice['command'])  # what the report prints: train.py takes it
        assert (applied['batch_size'], applied['gradient_accumulation_steps'], applied['activation_checkpointing']) \
            == (choice['batch_size'], choice['gradient_accumulation_steps'], checkpointing)
        # the fewest micro-steps with micro-batches up to the largest, then the smallest micro-batch that keeps the
        # config's 128 samples per step with them
        accumulation = -(-128 // largest)
        assert choice['gradient_accumulation_steps'] == accumulation
        assert choice['batch_size'] == -(-128 // accumulation) <= largest
        assert choice['tokens_per_step'] == choice['batch_size'] * 32 * accumulation >= 128 * 32


def test_pick_batch_size_keeps_tokens_per_step_and_fails_clearly(tiny):
    free = em.total_bytes(em.trace(em.rebatched(tiny, 3), evaluate=False)['train']['peak_bytes'], cuda_context=False)
    train_keys = {k: v for k, v in tiny.items() if k not in em.ESTIMATOR_DEFAULTS}  # as train.py passes it
    # the free memory less gpu_headroom_gb, left to other programs, is the budget
    headroom = int(tiny['gpu_headroom_gb'] * GIB)
    assert headroom > 0
    assert em.pick_batch_size(train_keys, free + headroom) == (3, 3)  # 3 x 3 >= the config's 4 x 2 samples per step
    assert em.pick_batch_size(train_keys, free + headroom - 1) != (3, 3)
    with pytest.raises(ConfigError, match='even batch_size=1 needs'):
        em.pick_batch_size(tiny, 1000)


def test_run_summary_gives_the_estimate_in_gib_against_the_card(tiny):
    train_keys = {k: v for k, v in tiny.items() if k not in em.ESTIMATOR_DEFAULTS}  # as train.py passes it
    roomy = em.run_summary(train_keys, 80 * GIB)
    assert roomy['card_gib'] == 80 and roomy['fits']
    # the traced tensors, then the CUDA context, workspace and fragmentation on top of them
    assert 0 < roomy['train_peak_gib'] < roomy['total_gib'] and 0 < roomy['eval_total_gib']
    assert not em.run_summary(train_keys, roomy['total_gib'] * GIB / 2)['fits']


@pytest.mark.parametrize('argv, named', [
    (['--batchsize=8'], '--batch_size'),
    (['--gpu_memory_gb=0.1'], 'gpu_memory_gb=0.1'),
    (['--loss=fused'], "loss 'fused'"),
    (['--gradient_accumulation_steps=3', '--world_size=2'], 'divisible by the 2 processes'),
    (['--init_from=gpt2', '--block_size=2048'], 'block_size=2048'),
    (['--init_from=gpt3'], "init_from 'gpt3'"),
    (['--measure'], 'CUDA is not available'),
    (['--fsdp_mixed_precision'], "parallelism='fsdp'"),
    (['--fsdp_mixed_precision', '--parallelism=fsdp', '--dtype=float32'], "dtype='float32'"),
])
def test_bad_input_is_one_line_error(argv, named, capsys):
    if '--measure' in argv and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    with pytest.raises(SystemExit) as exit_info:
        estimate_memory.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1 and named in err


@pytest.mark.parametrize('phase, batch_size, accumulation, world_size, checkpointing, in_backward', [
    ('training', 12, 40, 1, False, False), ('training', 6, 8, 4, True, False), ('training', 12, 1, 1, False, True),
    ('evaluation', 16, 1, 1, False, True),
])
def test_oom_advice_commands_pass_train_py_checks(tiny, phase, batch_size, accumulation, world_size, checkpointing,
                                                  in_backward):
    """Each --key=value the advice prints, applied, is a config train.py accepts; with the step in backward (which
    cannot accumulate) it lowers the micro-batch alone."""
    stats = dict(allocated=9 * GIB, reserved=11 * GIB, peak=11 * GIB, total=12 * GIB)
    config = {**tiny, 'batch_size': batch_size, 'gradient_accumulation_steps': accumulation, 'world_size': world_size,
              'activation_checkpointing': checkpointing, 'optimizer_in_backward': in_backward,
              'grad_clip': 0.0 if in_backward else 1.0}
    rules.check_config(config, world_size, 'cuda')
    message = oom_advice(phase, batch_size, accumulation, world_size, checkpointing, stats, 2 * GIB, in_backward)
    suggestions = [part.split(' (')[0] for part in message.split('next step: ')[1].split(', or ')]
    commands = [dict(arg[2:].split('=') for arg in part.split()) for part in suggestions if part.startswith('--')]
    assert commands
    for command in commands:
        rules.check_config({**config, **{key: eval(value) for key, value in command.items()}}, world_size, 'cuda')
    if in_backward and phase == 'training':
        assert commands[0] == {'batch_size': '11'} and 'fewer tokens per step' in message


def test_oom_advice_scales_the_batch_and_keeps_tokens():
    stats = dict(allocated=9 * GIB, reserved=11 * GIB, peak=11 * GIB, total=12 * GIB)
    # (12 - 2) / (11 - 2) of 12 is 13: capped below the batch that failed, 11; 480 samples in micro-batches of up
    # to 11 take 44 micro-steps, of 11 (484 samples)
    message = oom_advice('training', 12, 40, 1, False, stats, fixed=2 * GIB)
    assert 'peak 11.00 GiB, card total 12.00 GiB (before the first forward: 2.00 GiB)' in message
    assert '--batch_size=11 --gradient_accumulation_steps=44' in message
    assert '--activation_checkpointing=True' in message
    assert fitting_batch_size(12, 2 * GIB, 20 * GIB, 12 * GIB) == 6  # 12 * 10 / 18, rounded down
    assert fitting_batch_size(1, 2 * GIB, 20 * GIB, 12 * GIB) == 1
    assert resplit(12, 40, 1, 6) == (6, 80)
    # 12 samples over 4 processes, at most 2 a micro-batch: 8 micro-steps (2 a process) of 2, the fewest that keep 12
    assert resplit(3, 4, 4, 2) == (2, 8)
    assert resplit(8, 64, 2, 12) == (12, 44)  # 512 samples: 44 micro-steps of 12 (528, 22 a process), not 64 of 8
    done = oom_advice('training', 1, 8, 1, True, stats, fixed=2 * GIB)
    assert '--batch_size' not in done and 'smaller block_size or model' in done


def test_autocast_cache_holds_a_copy_of_the_weights_that_off_frees(tiny):
    """autocast's cache keeps the bf16 cast of every weight through the forward; with checkpointing nothing else
    holds them (backward recomputes the block), so with the cache off they are gone at the peak, as in evaluation."""
    config = {**tiny, 'dtype': 'bfloat16', 'activation_checkpointing': True, 'n_layer': 4}
    cached, uncached = (em.trace({**config, 'autocast_cache': on}) for on in (True, False))
    matrices = sum(p.numel() for name, p in em.build(config, True)[0].named_parameters()
                   if p.dim() == 2 and name.startswith('transformer.h.'))
    assert cached['train']['breakdown']['weight_copies'] >= 2 * matrices  # the blocks' matrices in bf16
    assert uncached['train']['breakdown']['weight_copies'] < cached['train']['breakdown']['weight_copies'] / 4
    assert uncached['train']['peak_bytes'] < cached['train']['peak_bytes']  # the peak moves to backward
    # evaluation keeps nothing for backward: off, its peak is the cached one without the copies
    assert uncached['eval']['peak_bytes'] == cached['eval']['peak_bytes'] - cached['eval']['breakdown']['weight_copies']


def test_autocast_cache_changes_no_loss_or_gradient():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.0))
    x = torch.randint(64, (4, 16))
    results = []
    for cache in (True, False):
        model.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=cache):
            _, loss = model(x, x)
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_ladder_climbs_to_the_first_rung_that_fits(tiny):
    """A budget between micro-batch 1's total without activation checkpointing and with it: the ladder stops at
    checkpointing, with the largest micro-batch that fits there and at least the config's samples per step."""
    tiny = {**tiny, 'n_layer': 4, 'block_size': 256, 'batch_size': 4, 'gradient_accumulation_steps': 2}

    def total(config):
        return em.total_bytes(em.trace(config, evaluate=False, warm_start=True)['train']['peak_bytes'])

    plain, checkpointed = (total({**tiny, 'batch_size': 1, 'activation_checkpointing': on}) for on in (False, True))
    budget = (plain + checkpointed) // 2
    steps = em.ladder(tiny, budget)
    assert [(step['rung'], step['fits']) for step in steps] == [('as configured', False),
                                                                 ('activation checkpointing', True)]
    last = steps[-1]
    assert last['batch_1_total_bytes'] == checkpointed and last['total_bytes'] <= budget
    assert last['batch_size'] * last['gradient_accumulation_steps'] >= 8
    assert last['batch_size'] <= last['largest_batch_size']
    largest = em.rebatched({**tiny, 'activation_checkpointing': True}, last['largest_batch_size'])
    assert total(largest) <= budget < total(em.rebatched(largest, last['largest_batch_size'] + 1))


def passes_train_py_checks(config, command):
    """`config` with the printed --key=value `command` applied, checked by train.py's own rules (training.rules) for
    its world_size on a GPU; the applied config."""
    applied = {**config, **command}
    rules.check_config(applied, applied['world_size'], 'cuda')
    return applied


def climb_every_rung(config, monkeypatch):
    """The ladder at ever smaller budgets: each just below micro-batch 1's total at the rung the ladder before stopped
    at, so that each climbs past it, until none fits. The ladders, each with its budget. The
    ladders retrace the same configs: each trace (a pure function of its arguments) is made once."""
    traces, trace = {}, em.trace

    def trace_once(config, *args, **kwargs):
        key = json.dumps([config, args, {k: v for k, v in kwargs.items() if k != 'progress'}], sort_keys=True)
        if key not in traces:
            traces[key] = trace(config, *args, **kwargs)
        return traces[key]

    monkeypatch.setattr(em, 'trace', trace_once)
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
def test_every_ladder_command_passes_train_py_checks_and_fits(tiny, overrides, monkeypatch):
    """Every rung the ladder can stop at prints a command train.py accepts, whose step fits the budget, with the tokens
    per step it says; the step in backward cannot accumulate, so its command has one micro-step and says it has fewer
    tokens than configured (issue: it printed gradient_accumulation_steps=96, which train.py refuses). A rung that
    train.py would refuse is skipped."""
    config = {**tiny, 'n_layer': 1, 'n_embd': 256, **overrides}  # wide enough for 8-bit moments to be smaller
    configured_samples = config['batch_size'] * config['gradient_accumulation_steps']
    stopped_at = []
    ladders = climb_every_rung(config, monkeypatch)
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


def test_a_config_that_fits_needs_no_ladder(tiny, capsys, monkeypatch):
    monkeypatch.setattr(estimate_memory, 'estimator_defaults', lambda: tiny)
    with pytest.raises(SystemExit) as exit_info:
        estimate_memory.main(['--ladder', '--gpu_memory_gb=12'])
    assert exit_info.value.code == estimate_memory.FITS
    out = capsys.readouterr().out
    assert 'ladder: fits as configured, nothing to change' in out and 'add to your command' not in out


def test_headroom_is_left_free_and_shown(tiny):
    """A config whose total fits the card exactly fits with no headroom and not with the default's."""
    result = em.estimate({**tiny, 'gpu_headroom_gb': 0.0})
    needed = max(result['total_bytes'], result['eval_total_bytes'])
    card_gb = needed / GIB
    exact = {**tiny, 'gpu_memory_gb': card_gb}
    assert em.estimate({**exact, 'gpu_headroom_gb': 0.0})['fits']
    leaving = em.estimate(exact)
    assert not leaving['fits'] and leaving['headroom_bytes'] == int(tiny['gpu_headroom_gb'] * GIB) > 0
    assert ', 0.50 GiB of it left free: --gpu_headroom_gb), ' in estimate_memory.report(exact, leaving)


def test_exit_status_progress_and_json(tiny, capsys, monkeypatch):
    """0 when the config fits, 1 when it does not (so `estimate_memory.py ... && train.py ...` gates a launch), 2 for
    bad input; progress on stderr, so --json's stdout stays one JSON object."""
    monkeypatch.setattr(estimate_memory, 'estimator_defaults', lambda: tiny)
    for argv, status in ((['--gpu_memory_gb=12'], estimate_memory.FITS),
                         (['--gpu_memory_gb=1.1', '--batch_size=4096'], estimate_memory.DOES_NOT_FIT),
                         (['--gpu_memory_gb=1.1', '--eval_batch_size=8192'], estimate_memory.DOES_NOT_FIT),
                         (['--gpu_memory_gb=12', '--gpu_headroom_gb=-1'], estimate_memory.BAD_INPUT)):
        with pytest.raises(SystemExit) as exit_info:
            estimate_memory.main(['--json', *argv])
        assert exit_info.value.code == status, argv
        out, err = capsys.readouterr()
        if status != estimate_memory.BAD_INPUT:
            result = json.loads(out)
            assert result['fits'] == (status == estimate_memory.FITS)
            if '--eval_batch_size=8192' in argv:  # training fits, evaluation does not: does not fit
                assert result['total_bytes'] <= result['budget_bytes'] < result['eval_total_bytes']
            assert 'tracing training at micro-batch' in err.splitlines()[0]
    assert (estimate_memory.FITS, estimate_memory.DOES_NOT_FIT, estimate_memory.BAD_INPUT) == (0, 1, 2)
