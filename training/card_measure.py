"""bench.py --mode=card's measurements, each run by training/card.py in a child process of its own: the checks,
nanoGPT's path, one preset. A preset hung in compilation cannot be interrupted from its own thread, but a child can be
ended at its limit (card_preset_seconds) with the rest of the card kept; and the GPU's memory is the child's alone,
as in a train.py run (card.py's own process allocates nothing there). The child prints the phase it enters and, as each
phase starts, writes what it has measured so far to its result file (atomically): a stopped child leaves its phase
and its figures.

$ python -m training.card_measure '<job as JSON>' <result.json>   (job: its kind, 'checks', 'preset' or
                                                                     'nanogpt_path', and their arguments)"""
import contextlib
import io
import itertools
import json
import os
import statistics
import sys
import time

import torch

import configurator
from chunked_loss import chunked_cross_entropy, naive_cross_entropy
from training import card_checks, rules, step
from training.card_checks import autocast
from training.data import atomic_files
from training.device import peak_flops
from training.errors import ConfigError, first_line
from training.memory.estimate import random_batch
from training.recipe import at_depth

# A preset's shape at a CPU's scale: the same keys and levers, a model that takes milliseconds a step
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=2, eval_batch_size=2, vocab_size=96,
            attn_window_warmup_start=16)
NANOGPT_CONFIG = 'train_gpt2.py' # nanoGPT's default run: GPT-2 124M, micro-batch 12 x 1024


def write_atomically(path, text):
    """`text` to `path` through training.data's atomic_files: a reader sees the old file or the new, with the
    permissions of any file the user writes."""
    with atomic_files(path) as (tmp,), open(tmp, 'w', encoding='utf-8') as f:
        f.write(text)


def load_preset(path, tiny, vocab_size=None):
    """(config, overrides, model_args) of preset `path`: train.py's config of it (its own lines silent), from scratch
    (a pretrained model's shape without its weights: the memory and time are the same) for synthetic tokens, and the
    keys the card changed in it (the train.py loop passes them on). tiny: at TINY's scale on the CPU, under bf16
    autocast as on a GPU, compiled where the preset compiles, with TINY's vocabulary unless `vocab_size` is given."""
    with contextlib.redirect_stdout(io.StringIO()):
        config = configurator.load_config(configurator.train_keys(), [path])
    overrides = dict(init_from='scratch', hellaswag=False, wandb_log=False)
    if tiny:
        overrides.update({k: v for k, v in TINY.items() if k in config}, dtype='bfloat16', device='cpu',
                         gradient_accumulation_steps=min(config['gradient_accumulation_steps'], 2),
                         attn_window=min(config['attn_window'], 16),
                         attn_window_block=min(config['attn_window_block'], 4), # the tiny window in blocks, as 16/128
                         doc_token=min(config['doc_token'], (vocab_size or TINY['vocab_size']) - 1))
        tiny_depth = at_depth({**config, **overrides}) # a record's value tables and attention-less block, in 2 blocks
        overrides.update(value_embeds=tiny_depth['value_embeds'], no_attn_layer=tiny_depth['no_attn_layer'])
    config.update(overrides)
    with contextlib.redirect_stdout(io.StringIO()):
        model_args, _ = rules.model_args(config, vocab_size or (TINY['vocab_size'] if tiny else None))
    return config, overrides, model_args


def synthetic_batches(config, vocab_size, device):
    """Random tokens, a document token every 200 positions where the model has one: the records' packed layout."""
    def batch():
        x, y = random_batch(config['batch_size'], config['block_size'], vocab_size, device)
        if config['doc_token'] >= 0:
            x[:, ::200] = config['doc_token']
        return x, y
    return step.Prefetcher(batch() for _ in itertools.count())


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


def measure_preset(config, model_args, device, device_type, steps, report):
    """A preset trained as configured: its first step (compilation included) and first evaluation timed on their
    own, then `steps` steps of one micro-step and of two (a micro-step's time and the rest of a step's, for the whole
    step of gradient_accumulation_steps) and `steps` evaluation micro-batches, each the median, after a warm-up call;
    tokens/s, MFU and, on CUDA, the peak memory. report(phase, row) as each phase starts, with the figures so far."""
    row = {}
    report('building', row)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()): # build's lines about the optimizer
        model, optimizer = step.build(config, model_args, device, device_type)
    raw_model, run = model, torch.compile(model) if config['compile'] else model
    batches = synthetic_batches(config, model_args['vocab_size'], device)
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    ctx = autocast(config['dtype'], device_type, config['autocast_cache'])
    scaler = torch.amp.GradScaler(device_type, enabled=config['dtype'] == 'float16')
    window = config['attn_window'] or None

    def train_step(accumulation):
        return lambda: step.train_step(run, optimizer, batches, accumulation, ctx, scaler, config['grad_clip'], window)

    accumulation = config['gradient_accumulation_steps']
    report('compiling' if config['compile'] else 'warming up', row)
    first_step = seconds_of(train_step(1), device_type)
    report('timing', row)
    one = median_seconds(train_step(1), device_type, steps)
    two = one
    if accumulation > 1:
        train_step(2)() # warm-up: nothing new to compile, the allocator's second micro-step
        two = median_seconds(train_step(2), device_type, steps)
    step_seconds = one + (accumulation - 1) * max(two - one, 0.0)
    peak = peak_flops(device)
    row.update(step_seconds=step_seconds, tokens_per_s=config['batch_size'] * config['block_size'] * accumulation /
               step_seconds, mfu=raw_model.estimate_mfu(config['batch_size'] * accumulation, step_seconds, peak[0])
               if peak else None)
    report('evaluating', row)
    rows = config['eval_batch_size'] or config['batch_size']

    def evaluation():
        x, y = (t[:rows] for t in batches.take())
        batches.fetch()
        with torch.no_grad(), ctx:
            run(x, y, attn_window=window)
    run.eval() # train.py's estimate_loss: eval mode, no gradients (a graph of its own when compiled)
    first_evaluation = seconds_of(evaluation, device_type)
    row['eval_micro_batch_seconds'] = median_seconds(evaluation, device_type, steps)
    run.train()
    # the first calls' time beyond a steady call's: the compilation of the training and the evaluation graphs
    row['compile_seconds'] = (first_step - one + first_evaluation - row['eval_micro_batch_seconds']
                              if config['compile'] else None)
    if device_type == 'cuda':
        row.update(max_allocated_bytes=torch.cuda.max_memory_allocated(device),
                   max_reserved_bytes=torch.cuda.max_memory_reserved(device))
    return row


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


def measure_checks(path, device, device_type, tiny, report):
    """card_checks' CHECKS on the model of preset `path` (the speedrun's), each outcome kept as it comes; with the
    device's name and memory, which the card reads from here."""
    config, _, model_args = load_preset(path, tiny)
    cuda = device_type == 'cuda'
    result = dict(device=torch.cuda.get_device_name(device) if cuda else f'{device} (presets scaled down)',
                  total_memory=torch.cuda.get_device_properties(device).total_memory if cuda else None, checks={})
    for name, check in card_checks.CHECKS:
        report(name, result)
        try:
            result['checks'][name] = check(config, model_args, device, device_type)
        except Exception as e: # a check that cannot run is a finding too: the others still run
            result['checks'][name] = dict(error=f'{type(e).__name__}: {first_line(e)}')
        if cuda: # the next check's models on an empty GPU
            torch.cuda.empty_cache()
    return result


def main(job, path):
    """Runs `job` and writes its result to `path`: its figures and phase (as it goes), then 'done', or 'error' (the
    error's line) or 'skipped' (a lever this machine lacks, or memory the estimate said would suffice)."""
    row = {} # the figures of the last phase reported, kept where a later phase fails

    def report(phase, figures):
        row.update(figures)
        print(f"{job['name']}: {phase}", flush=True)
        write_atomically(path, json.dumps(dict(row, phase=phase)))

    device, device_type = job['device'], job['device_type']
    try:
        if job['kind'] == 'checks':
            row.update(measure_checks(job['path'], device, device_type, job['tiny'], report))
        elif job['kind'] == 'preset':
            config, _, model_args = load_preset(job['path'], job['tiny'])
            row.update(measure_preset(config, model_args, device, device_type, job['steps'], report))
        else:
            row.update(measure_nanogpt_path(device, device_type, job['steps'], job['tiny'], report))
    except ConfigError as e: # a lever this machine lacks (torchao's 8-bit AdamW)
        row['skipped'] = str(e)
    except torch.OutOfMemoryError: # for a preset, what the estimate said would fit did not: the finding to report
        row['skipped'] = 'out of memory' + (', though the estimate fits' if job['kind'] == 'preset' else '')
    except Exception as e: # the card goes on with the next preset; the row says what failed
        row['error'] = f'{type(e).__name__}: {first_line(e)}'
    write_atomically(path, json.dumps(dict(row, phase='done')))


if __name__ == '__main__':
    main(json.loads(sys.argv[1]), sys.argv[2])
