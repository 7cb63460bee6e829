"""bench.py --mode=card: one command that measures a GPU with this project's presets and checks what only a GPU can
show, keeping each figure as soon as it is measured (card.md and card.json rewritten, atomically, after each).

1. The checks (training/card_checks.py): the compiled model against eager, FlashAttention's variable-length kernel
   against the masked attention, bf16 weights against fp32, on the speedrun preset's model with randomized weights:
   the loss and every gradient, against the reference's own measured bf16 noise.
2. nanoGPT's path (training/card_measure.py): config/train_gpt2.py's model trained with our loss and with nanoGPT's
   full logits, eager and compiled: the step time ratios and each side's peak memory.
3. Each card preset (config/*_<N>gb.py) the estimator says fits this card, in a child process of its own ended at
   card_preset_seconds: its compilation time, then the step and evaluation times after warm-up, tokens/s, MFU and the
   peak memory (allocated, reserved) beside the estimate; the hours of its run (training and evaluations) at that
   rate; then a few iterations of train.py itself on synthetic tokens, with an evaluation, a checkpoint and a resume.

On a CPU the same code runs at a CPU's scale (card_measure.TINY, bf16 autocast as on a GPU, GPT-2's vocabulary for
nanoGPT's path): the tests keep it working. There are no memory counters there, and the varlen check runs only where
a CPU stand-in for the kernel is registered (the tests' flash_varlen_on_a_cpu.py)."""
import glob
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import torch

from model import GPT2_VOCAB_SIZE
from training import card_checks
from training.card_measure import NANOGPT_CONFIG, load_preset, write_atomically
from training.memory import estimate as em
from training.rules import DEFAULT_VOCAB_SIZE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) # the scripts run from the repository
PRESET_PATTERN = re.compile(r'_(\d+)gb\.py$')
SPEEDRUN = 'speedrun_gpt2_12gb.py' # the preset whose token budget the hours are for, and whose model is checked
LOOP_ITERS = 2 # train.py's iterations to its checkpoint, and as many again after the resume


def preset_paths(config_dir):
    """The card presets, the speedrun preset first: config/*_<N>gb.py."""
    paths = sorted(p for p in glob.glob(os.path.join(config_dir, '*gb.py')) if PRESET_PATTERN.search(p))
    return sorted(paths, key=lambda p: os.path.basename(p) != SPEEDRUN)


def run_child(argv, seconds, on_line=lambda line: None):
    """argv run from the repository in a process group of its own, each output line passed to on_line, the group
    killed after `seconds` (with the compiler's worker processes): (its exit status, or None if stopped; its last
    output line)."""
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
        status = child.wait(timeout=max(seconds, 1))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        status = None
    reader.join(timeout=10)
    return status, last[0]


def measured(job, seconds, progress):
    """card_measure's figures for `job`, run in a child process stopped after `seconds`: what it measured, with
    'stopped' (the phase it was in) or 'error' (the last line it printed) where it did not finish."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 'result.json')
        status, last = run_child([sys.executable, '-m', 'training.card_measure', json.dumps(job), path], seconds,
                                 progress)
        row = {}
        if os.path.exists(path):
            with open(path, encoding='utf-8') as f:
                row = json.load(f)
    phase = row.pop('phase', 'starting')
    if status is None:
        row['stopped'] = f'stopped after {seconds:.0f} s (card_preset_seconds) while {phase}'
    elif phase != 'done' and 'error' not in row:
        row['error'] = last or f'exit status {status}'
    return row


def write_tokens(path, vocab_size, tokens, seed=0):
    """Random uint16 tokens below vocab_size: a synthetic train.bin or val.bin."""
    np.random.default_rng(seed).integers(vocab_size, size=tokens, dtype=np.uint16).tofile(path)


def train_loop(path, config, overrides, model_args, tiny, seconds, progress):
    """train.py on preset `path` with the card's overrides, on synthetic tokens in a temporary data dir: LOOP_ITERS
    iterations, an evaluation and a checkpoint, then a resume from it for as many more (another evaluation and
    checkpoint). On a CPU eager (the compiled graphs were the measurement's). {ok, seconds[, error]}."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, 'synthetic')
        os.makedirs(data)
        vocab_size = model_args['vocab_size']
        if vocab_size != DEFAULT_VOCAB_SIZE:
            with open(os.path.join(data, 'meta.pkl'), 'wb') as f: # train.py's vocabulary: the model's
                pickle.dump({'vocab_size': vocab_size}, f)
        rows = 2 * LOOP_ITERS * config['gradient_accumulation_steps'] * config['batch_size'] + 4
        for split, seed in (('train', 0), ('val', 1)):
            write_tokens(os.path.join(data, f'{split}.bin'), min(vocab_size, GPT2_VOCAB_SIZE),
                         rows * config['block_size'] + 1, seed)
        args = [sys.executable, 'train.py', os.path.abspath(path), *(f'--{k}={v}' for k, v in overrides.items()),
                f'--data_dir={tmp}', '--dataset=synthetic', f"--out_dir={os.path.join(tmp, 'out')}",
                f'--eval_interval={LOOP_ITERS}', '--eval_iters=1', '--log_interval=1', '--always_save_checkpoint=True',
                *(['--compile=False'] if tiny else [])]
        for phase, extra in (('train.py loop', [f'--max_iters={LOOP_ITERS}']),
                             ('train.py resume', ['--init_from=resume', f'--max_iters={2 * LOOP_ITERS}'])):
            progress(f'{os.path.basename(path)}: {phase}')
            status, last = run_child(args + extra, seconds - (time.perf_counter() - start))
            if status != 0:
                error = last if status is not None else f'stopped after {seconds:.0f} s (card_preset_seconds)'
                return dict(ok=False, seconds=time.perf_counter() - start, error=f'{phase}: {error}')
    return dict(ok=True, seconds=time.perf_counter() - start)


def run_hours(config, row):
    """train.py's run of `config` at the measured rate, in hours: max_iters steps (train_hours), and an evaluation
    every eval_interval (eval_iters x batch_size windows of each split in eval_batch_size micro-batches: eval_hours)."""
    evaluations = config['max_iters'] // config['eval_interval'] + 1
    rows = config['eval_batch_size'] or config['batch_size']
    micro_batches = 2 * -(-config['eval_iters'] * config['batch_size'] // rows)
    train_hours = config['max_iters'] * row['step_seconds'] / 3600
    eval_hours = evaluations * micro_batches * row['eval_micro_batch_seconds'] / 3600
    return dict(train_hours=train_hours, eval_hours=eval_hours, hours=train_hours + eval_hours)


def run_preset(path, device, device_type, tiny, card_bytes, steps, seconds, progress):
    """A preset's row: its estimate, then (where it fits) its measurements and the hours of its run, then train.py's
    loop on it, all within `seconds`."""
    start, name = time.perf_counter(), os.path.basename(path)
    config, overrides, model_args = load_preset(path, tiny)
    card_gb = float(PRESET_PATTERN.search(name).group(1))
    progress(f'{name}: estimate')
    estimate = em.estimate({**em.ESTIMATOR_DEFAULTS, **config, 'world_size': 1,
                            'gpu_memory_gb': card_bytes / em.GIB if card_bytes else card_gb}, warm_start=True)
    row = dict(preset=name, estimated_peak_bytes=estimate['train']['peak_bytes'],
               estimated_total_bytes=estimate['total_bytes'], fits=estimate['fits'])
    if not estimate['fits']:
        return dict(row, skipped='the estimate does not fit this card')
    progress(f'{name}: micro-batch {config["batch_size"]} x {config["block_size"]}, '
             f'{config["gradient_accumulation_steps"]} micro-steps a step, {steps} timed steps')
    job = dict(kind='preset', name=name, path=os.path.abspath(path), tiny=tiny, device=device,
               device_type=device_type, steps=steps)
    row.update(measured(job, seconds, progress))
    if 'step_seconds' in row and 'eval_micro_batch_seconds' in row:
        row.update(run_hours(config, row), tokens=config['max_iters'] * config['batch_size'] * config['block_size'] *
                   config['gradient_accumulation_steps']) # the run's, which the hours are for
    if not any(key in row for key in ('skipped', 'stopped', 'error')):
        row['train_loop'] = train_loop(path, config, overrides, model_args, tiny,
                                       seconds - (time.perf_counter() - start), progress)
    return row


def run(device, device_type, names=(), config_dir='config', steps=3, seconds=1800, preset_seconds=600,
        progress=print, keep=lambda result: None):
    """Everything the card mode measures, as one JSON-able dict: the checks, nanoGPT's path, then the presets (those
    of `names`, or all) in the order of preset_paths until `seconds` have passed (the rest listed as skipped), each
    part within preset_seconds. keep(result) after each part; each preset's row printed through progress as it ends.
    This process allocates nothing on the GPU (the checks' child reports the device): its memory is the children's."""
    tiny = device_type != 'cuda'
    start = time.perf_counter()
    result = dict(device=device, torch=torch.__version__, scaled_down=tiny, checks={}, nanogpt_path=None, presets=[])
    progress(f'checks: on the {SPEEDRUN} model, weights randomized')
    job = dict(kind='checks', name='check', path=os.path.abspath(os.path.join(config_dir, SPEEDRUN)), tiny=tiny,
               device=device, device_type=device_type)
    checks = measured(job, preset_seconds, progress)
    if 'device' not in checks: # the child failed before it said: asked here
        checks.update(device=torch.cuda.get_device_name(device) if not tiny else f'{device} (presets scaled down)',
                      total_memory=torch.cuda.get_device_properties(device).total_memory if not tiny else None)
    result.update(device=checks.pop('device'), checks=checks.pop('checks', {}))
    card_bytes = checks.pop('total_memory')
    if checks: # the checks' child stopped or failed: why
        result['checks_outcome'] = outcome(checks)
    keep(result)
    progress(f'nanoGPT path: config/{NANOGPT_CONFIG}, our loss against the full logits')
    job = dict(kind='nanogpt_path', name='nanoGPT path', tiny=tiny, device=device, device_type=device_type,
               steps=steps)
    result['nanogpt_path'] = measured(job, preset_seconds, progress)
    keep(result)
    for path in preset_paths(config_dir):
        name = os.path.basename(path)
        if names and name not in names:
            continue
        if time.perf_counter() - start > seconds:
            row = dict(preset=name, skipped=f'over the {seconds} s budget (card_seconds)')
        else:
            row = run_preset(path, device, device_type, tiny, card_bytes, steps, preset_seconds, progress)
        result['presets'].append(row)
        if name == SPEEDRUN and 'hours' in row:
            result['speedrun'] = {key: row[key] for key in ('tokens', 'train_hours', 'eval_hours', 'hours')}
        progress(preset_line(row))
        result['seconds'] = time.perf_counter() - start
        keep(result)
    result['seconds'] = time.perf_counter() - start
    keep(result)
    return result


def gib(n):
    return 'n/a' if n is None else f'{n / em.GIB:.2f}'


def check_line(name, check):
    """A check's row of the report: its verdict, the loss against the reference's, and the loss's and the furthest
    gradient's differences beside the measured noise (all relative)."""
    if 'skipped' in check or 'error' in check:
        return f"| {name} | {'skipped: ' + check['skipped'] if 'skipped' in check else 'ERROR: ' + check['error']} " \
               f"| | | | |"
    steps = f"; losses of {card_checks.CHECK_STEPS} steps {check['step_difference']:.1e} (noise " \
            f"{check['step_noise']:.1e})" if 'step_difference' in check else ''
    return (f"| {name} | {'pass' if check['passed'] else 'FAIL'} | {check['loss']:.4f} ({check['reference_loss']:.4f})"
            f" | {check['loss_difference']:.1e} (noise {check['loss_noise']:.1e}){steps} "
            f"| {check['gradient_difference']:.1e} (noise {check['gradient_noise']:.1e}), "
            f"{check['gradient_parameter']} | {check['tolerance']}x noise |")


def outcome(row):
    """Why a preset has no figures, or its train.py loop's result."""
    for key in ('skipped', 'stopped', 'error'):
        if key in row:
            return f"{'' if key == 'stopped' else key + ': '}{row[key]}"
    loop = row.get('train_loop')
    return 'train.py: ' + (f"ok ({loop['seconds']:.0f} s)" if loop['ok'] else loop['error']) if loop else ''


def preset_line(row):
    """A preset's row of the report; n/a where it was not measured."""
    def figure(key, form):
        return form.format(row[key]) if row.get(key) is not None else 'n/a'
    estimate = f"{gib(row['estimated_peak_bytes'])} ({gib(row['estimated_total_bytes'])})" \
        if 'estimated_peak_bytes' in row else 'n/a'
    mfu = f"{row['mfu'] * 100:.1f}%" if row.get('mfu') is not None else 'n/a'
    return (f"| {row['preset']} | {estimate} | {gib(row.get('max_allocated_bytes'))} "
            f"| {gib(row.get('max_reserved_bytes'))} | {figure('compile_seconds', '{:.1f}')} "
            f"| {figure('step_seconds', '{:.3f}')} | {figure('eval_micro_batch_seconds', '{:.4f}')} "
            f"| {figure('tokens_per_s', '{:,.0f}')} | {mfu} "
            f"| {figure('train_hours', '{:.2f}')} + {figure('eval_hours', '{:.2f}')} | {outcome(row)} |")


def nanogpt_lines(path):
    """nanoGPT's path: the step time ratios (ours / naive) and each side's peak memory, or why it has none."""
    if path is None:
        return []
    head = f"nanoGPT's path, config/{NANOGPT_CONFIG}: "
    if 'eager_ratio' not in path:
        return [head + (outcome(path) or 'not measured'), '']
    compiled = f"{path['compiled_ratio']:.2f}x" if 'compiled_ratio' in path else outcome(path)
    return [head + f"micro-batch {path['micro_batch'][0]} x {path['micro_batch'][1]}, {path['n_layer']} layers, "
            f"n_embd {path['n_embd']}, vocabulary {path['vocab_size']:,}, {path['dtype']}: our loss's step time "
            f"against nanoGPT's full logits (ours / naive, median of alternating steps) eager "
            f"{path['eager_ratio']:.2f}x, compiled {compiled}; peak allocated GiB: ours "
            f"{gib(path['ours_peak_bytes'])}, naive {gib(path['naive_peak_bytes'])}.", '']


def markdown(result):
    """The report of run()'s result, as Markdown: what is measured so far."""
    lines = [f"# {result['device']}", '', f"torch {result['torch']}, {result.get('seconds', 0):.0f} s.", '']
    if 'checks_outcome' in result:
        lines += [f"checks: {result['checks_outcome']}", '']
    if result['checks']:
        lines += ['| check | result | loss (reference) | loss difference | largest gradient difference, parameter '
                  '| tolerance |', '|---|---|---|---|---|---|']
        lines += [check_line(name, check) for name, check in result['checks'].items()]
        lines.append('')
    lines += nanogpt_lines(result.get('nanogpt_path'))
    if result['presets']:
        lines += ['| preset | estimated peak GiB (total) | max allocated GiB | max reserved GiB | compile s '
                  '| s/step | s/eval micro-batch | tokens/s | MFU | hours: train + eval | train.py loop |',
                  '|---|---|---|---|---|---|---|---|---|---|---|']
        lines += [preset_line(row) for row in result['presets']]
    if 'speedrun' in result:
        run = result['speedrun']
        scale = ' (scaled down: not the real budget)' if result['scaled_down'] else ''
        lines += ['', f"{SPEEDRUN}{scale}: {run['tokens']:,} tokens in {run['hours']:.2f} h at the measured rate: "
                      f"{run['train_hours']:.2f} h of training steps and {run['eval_hours']:.2f} h of loss evaluations "
                      f"(HellaSwag's not included)."]
    return '\n'.join(lines) + '\n'


def write_report(result, path):
    """`path`.md and `path`.json, each written atomically; the two paths."""
    write_atomically(f'{path}.md', markdown(result))
    write_atomically(f'{path}.json', json.dumps(result, indent=1))
    return f'{path}.md', f'{path}.json'
