"""bench.py --mode=card's measurements, each run by training/card.py in a child process of its own (run_child, the
child being training/card_child.py): the device and what it lacks for each preset, the checks, nanoGPT's path (the
profile: training/card_profile.py); each preset's train.py runs are children too (training/card_train.py). A child
hung in compilation cannot be interrupted from its own thread, but it can be ended at its limit with the rest of the
card kept; and the GPU's memory is the child's alone, as in a train.py run (card.py's own process allocates nothing
there)."""
import contextlib
import io
import itertools
import os
import signal
import statistics
import subprocess
import threading
import time

import torch

from training import configurator
from training.chunked_loss import chunked_cross_entropy, naive_cross_entropy
from training import card_checks, rules, runs, step
from training.card_checks import autocast
from training.data import atomic_files
from training.device import check_device, peak_flops
from training.errors import ConfigError, first_line
from training.paths import ROOT # the children run from the repository
from training.memory.estimate import random_batch
from training.recipe import at_depth

# A preset's shape at a CPU's scale: the same keys and levers, a model that takes milliseconds a step
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=2, eval_batch_size=2, vocab_size=96,
            attn_window_warmup_start=16)
NANOGPT_CONFIG = 'train_gpt2.py' # nanoGPT's default run: GPT-2 124M, micro-batch 12 x 1024
SPEEDRUN = 'speedrun_gpt2_12gb.py' # the record's preset: its model is checked and profiled, its hours reported


def run_child(argv, seconds, on_line=lambda line: None, meanwhile=lambda: None):
    """argv run from the repository in a process group of its own, each output line passed to on_line, the group
    killed after `seconds` (with the compiler's worker processes); meanwhile() runs in this process while the child
    does (a preset's estimate, on the CPU). (Its exit status, or None if stopped; its last output line)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    last = ['']

    def read():
        for line in child.stdout:
            if line.strip():
                last[0] = line.rstrip()
                on_line(last[0])
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        meanwhile()
        status = child.wait(timeout=max(seconds - (time.perf_counter() - start), 1))
    except subprocess.TimeoutExpired:
        status = None
    finally: # a child still running (its limit, or an error here) goes with its group
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    reader.join(timeout=10)
    return status, last[0]


def write_atomically(path, text):
    """`text` to `path` through training.data's atomic_files: a reader sees the old file or the new, with the
    permissions of any file the user writes."""
    with atomic_files(path) as (tmp,), open(tmp, 'w', encoding='utf-8') as f:
        f.write(text)


def load_preset(path, tiny, vocab_size=None):
    """(config, overrides, model_args) of preset `path`: train.py's config of it (its own lines silent), from scratch
    (a pretrained model's shape without its weights: the memory and time are the same) for synthetic tokens, and the
    keys the card changed in it (the train.py runs pass them on). tiny: at TINY's scale on the CPU, under bf16
    autocast as on a GPU, with TINY's vocabulary unless `vocab_size` is given."""
    with contextlib.redirect_stdout(io.StringIO()):
        config = configurator.load_config(configurator.train_keys(), [path])
    overrides = dict(init_from='scratch', hellaswag=False, wandb_log=False)
    if config['init_from'] != 'scratch': # from scratch, a pretrained model needs its shape given
        shape, _ = rules.model_args(config, None)
        overrides.update({key: shape[key] for key in ('n_layer', 'n_head', 'n_embd', 'bias')})
        vocab_size = vocab_size or (None if tiny else shape['vocab_size'])
    if tiny:
        record_depth = config['model_file'] == runs.RECORD_2026_FILE  # gpt2026.py's model: the record's 11 layers
        scaled = {k: v for k, v in TINY.items() if k in config and not (k == 'n_layer' and record_depth)}
        overrides.update(scaled, dtype='bfloat16', device='cpu',
                         gradient_accumulation_steps=min(config['gradient_accumulation_steps'], 2),
                         attn_window=min(config['attn_window'], 16),
                         attn_window_block=min(config['attn_window_block'], 4), # the tiny window in blocks, as 16/128
                         doc_token=min(config['doc_token'], (vocab_size or TINY['vocab_size']) - 1))
        tiny_depth = at_depth({**config, **overrides}) # a record's value tables and attention-less block, in 2 blocks
        overrides.update(value_embeds=tiny_depth['value_embeds'], no_attn_layer=tiny_depth['no_attn_layer'])
    # the keys the card's own overrides leave inert (hellaswag_examples with hellaswag off, TINY's warmup start
    # without a warmup) at their defaults; a preset's own inert keys stay, for train.py to refuse as it would
    preset_inert = rules.inert_keys(config)
    overrides.update({key: default for key, default in rules.inert_defaults({**config, **overrides}).items()
                      if key not in preset_inert})
    config.update(overrides)
    with contextlib.redirect_stdout(io.StringIO()):
        model_args, _ = rules.model_args(config, vocab_size or (TINY['vocab_size'] if tiny else None))
    return config, overrides, model_args


def synthetic_batches(config, vocab_size, device):
    """Uniformly random tokens, as the train.py runs' synthetic data: a document token where one is drawn."""
    return step.Prefetcher(random_batch(config['batch_size'], config['block_size'], vocab_size, device)
                           for _ in itertools.count())


def synchronize(device_type):
    if device_type == 'cuda':
        torch.cuda.synchronize()


def seconds_of(call, device_type):
    synchronize(device_type)
    t0 = time.perf_counter()
    call()
    synchronize(device_type)
    return time.perf_counter() - t0


def median_seconds(call, device_type, calls):
    return statistics.median(seconds_of(call, device_type) for _ in range(calls))


def measure_nanogpt_path(device, device_type, steps, tiny, report):
    """nanoGPT's default run (config/train_gpt2.py: GPT-2 124M, one micro-batch of 12 x 1024; on a CPU scaled down
    with GPT-2's vocabulary, where the loss's share of a step is) trained with our loss, chunked_cross_entropy, and
    with nanoGPT's full logits (naive_cross_entropy): one model and optimizer, its loss_fn swapped, eager then
    compiled, the two alternating step by step over `steps` rounds after a warm-up round. The ratios are ours /
    naive of the median step times; the peak memory of each side's steps (CUDA; None on a CPU)."""
    config, _, model_args = load_preset(os.path.join('config', NANOGPT_CONFIG), tiny,
                                        vocab_size=rules.DEFAULT_VOCAB_SIZE if tiny else None)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()):
        model, optimizer = step.build(config, model_args, device, device_type)
    batches = synthetic_batches(config, model_args['vocab_size'], device)
    ctx = autocast(config['dtype'], device_type, config['autocast_cache'])
    scaler = torch.amp.GradScaler(device_type, enabled=config['dtype'] == 'float16')
    sides = {'ours': chunked_cross_entropy, 'naive': naive_cross_entropy}
    result = dict(config=NANOGPT_CONFIG, micro_batch=[config['batch_size'], config['block_size']],
                  n_layer=model_args['n_layer'], n_embd=model_args['n_embd'], vocab_size=model_args['vocab_size'],
                  dtype=config['dtype'], ours_peak_bytes=None, naive_peak_bytes=None)
    for mode in ('eager', 'compiled'):
        report(f'{mode}: ours and naive alternating', result)
        run = torch.compile(model) if mode == 'compiled' else model
        times = {side: [] for side in sides}
        for round_ in range(steps + 1): # the first round warms up (and compiles each side): untimed
            for side, loss_fn in sides.items():
                model.loss_fn = loss_fn # a compiled model's guard sees it: each side has its own graph
                if device_type == 'cuda':
                    torch.cuda.reset_peak_memory_stats(device)
                seconds = seconds_of(lambda: step.train_step(run, optimizer, batches, 1, ctx, scaler,
                                                             config['grad_clip']), device_type)
                if round_:
                    times[side].append(seconds)
                if device_type == 'cuda':
                    key = f'{side}_peak_bytes'
                    result[key] = max(result[key] or 0, torch.cuda.max_memory_allocated(device))
        medians = {side: statistics.median(t) for side, t in times.items()}
        result.update({f'{mode}_ours_seconds': medians['ours'], f'{mode}_naive_seconds': medians['naive'],
                       f'{mode}_ratio': medians['ours'] / medians['naive']})
    model.loss_fn = chunked_cross_entropy
    torch._dynamo.reset()
    return result


def measure_device(paths, device, device_type, tiny):
    """This machine as the card needs it: the device's name (a CPU's says the presets are scaled down), its memory
    and dense bf16 peak (MFU's), and for each preset of `paths` the one line of train.py's own checks that it fails
    here, if any: what it needs and this machine lacks (torchao for 8-bit AdamW, an Ampere GPU for bf16, CUDA for
    FlexAttention). Checked in a child, as everything that uses the GPU."""
    lacks = {}
    for path in paths:
        config, _, _ = load_preset(path, tiny)
        try:
            check_device(device, config['dtype'])
            rules.check_config(config, 1, device_type)
        except ConfigError as e:
            lacks[os.path.basename(path)] = str(e)
    cuda, peak = device_type == 'cuda', peak_flops(device)
    return dict(device=torch.cuda.get_device_name(device) if cuda else f'{device} (presets scaled down)',
                total_memory=torch.cuda.get_device_properties(device).total_memory if cuda else None,
                peak_flops=peak[0] if peak else None, lacks=lacks)


def measure_checks(path, names, device, device_type, tiny, report):
    """card_checks' CHECKS of `names`, in CHECKS' order, on the model of preset `path` (the speedrun's), each outcome
    kept as it comes."""
    config, _, model_args = load_preset(path, tiny)
    result = dict(checks={})
    for name, check in card_checks.CHECKS:
        if name not in names:
            continue
        report(name, result)
        try:
            result['checks'][name] = check(config, model_args, device, device_type)
        except Exception as e: # a check that cannot run is a finding too: the others still run
            result['checks'][name] = dict(error=f'{type(e).__name__}: {first_line(e)}')
        if device_type == 'cuda': # the next check's models on an empty GPU
            torch.cuda.empty_cache()
    return result
