"""bench.py --mode=card's preset part: train.py itself on one card preset (config/*_<N>gb.py), with the preset's own
keys (compile, dtype, optimizer, weights, micro-batch and accumulation) on synthetic tokens, held to the card the
preset names (memory_cap_gb) on whatever larger GPU runs it: a warm-up step, `steps` timed steps, an evaluation and a
checkpoint, then a second train.py that resumes from it (its evaluation, checkpoint and one step; its compilation may
come from torch's cache). Every figure comes from the two runs' phase logs (training/phase_log.py): step and
evaluation times, compilation, peak memory, and the phase a run that did not end was in. An out-of-memory error under
the cap is the preset's FAIL at that phase; the card goes on with the next.

While the first run runs, the card's own process estimates the preset (training/memory/fit.py's estimate) on the
CPU, for the row's estimate beside the measured memory. On a CPU the preset runs at card_measure.TINY's scale,
eager, with no cap: its figures say that the code works."""
import collections
import glob
import math
import os
import pickle
import re
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from model import GPT2_VOCAB_SIZE
from training import phase_log
from training.card_measure import SPEEDRUN, load_preset, run_child
from training.errors import first_line
from training.memory import estimate as em, fit
from training.memory.floor import training_floor
from training.rules import DEFAULT_VOCAB_SIZE
from training.runs import make_run, new_model

PRESET_PATTERN = re.compile(r'_(\d+)gb\.py$')
# one train.py process: its exit status (None: stopped at its limit), last output line, out-of-memory line, phase log
Run = collections.namedtuple('Run', 'status last_line out_of_memory events')


def card_gib(path):
    """The card a preset names, in GiB (a "12 GB" card has 12 GiB, as the estimate counts it)."""
    return int(PRESET_PATTERN.search(os.path.basename(path)).group(1))


def preset_paths(config_dir):
    """The card presets, config/*_<N>gb.py, in the card's order: the speedrun preset, the other presets that train
    from scratch, then the finetunes (a pretrained GPT-2's shape, up to xl: the longest to compile and step); each
    group the 12 GB ones first, then from the least memory up (training_floor: weights, gradients and block inputs,
    a model's size), so that a short run covers the most presets, and of two alike the larger card's first (fewer
    memory levers: a quicker run)."""
    paths = [p for p in glob.glob(os.path.join(config_dir, '*gb.py')) if PRESET_PATTERN.search(p)]

    def order(path):
        config, overrides, model_args = load_preset(path, tiny=False)
        pretrained = 'n_layer' in overrides  # the card runs a finetune from scratch, the pretrained model's shape given
        return (os.path.basename(path) != SPEEDRUN, pretrained, card_gib(path) != 12,
                sum(training_floor(config, model_args).values()), -card_gib(path), os.path.basename(path))
    return sorted(paths, key=order)


def cap_bytes(config, card):
    """The allocator's cap that stands for a card of `card` GiB: the card less the headroom the estimate leaves to
    other programs (the preset's gpu_headroom_gb) and less the CUDA context, which on that card takes its share outside
    the allocator (the estimate's allowance for it); so the estimate fits the card where its reserved memory (its peak,
    workspaces and fragmentation) fits the cap."""
    return em.budget(config, card * em.GIB) - em.CUDA_CONTEXT_BYTES


def write_synthetic_data(folder, config, model_args, steps):
    """train.bin and val.bin of uniformly random tokens for the preset's model (each row one long document: its
    window's whole attention), enough windows for every step of both runs; meta.pkl where the model's vocabulary is
    not GPT-2's padded one."""
    os.makedirs(folder)
    vocab_size = model_args['vocab_size']
    if vocab_size != DEFAULT_VOCAB_SIZE:
        with open(os.path.join(folder, 'meta.pkl'), 'wb') as f:
            pickle.dump({'vocab_size': vocab_size}, f)
    windows = (steps + 2) * config['gradient_accumulation_steps'] * config['batch_size'] + 4
    for seed, split in enumerate(('train', 'val')):
        tokens = np.random.default_rng(seed).integers(min(vocab_size, GPT2_VOCAB_SIZE), size=windows *
                                                      config['block_size'] + 1, dtype=np.uint16)
        tokens.tofile(os.path.join(folder, f'{split}.bin'))


def eval_iters(config):
    """The card's eval_iters: the fewest that fill one evaluation micro-batch (eval_batch_size rows), so that the
    evaluation's memory is the preset's."""
    return math.ceil((config['eval_batch_size'] or config['batch_size']) / config['batch_size'])


def train_args(path, overrides, folder, config, steps, device, cap, compiled):
    """train.py's arguments for the first run: the preset, the card's overrides, the synthetic data (the dataset
    'synthetic' of `folder`, where out_dir is too), `steps` steps after the first with an evaluation and a checkpoint
    at the last, the cap (bytes; None: none), compiled or not."""
    return [os.path.abspath(path), *(f'--{key}={value}' for key, value in overrides.items()), f'--device={device}',
            f'--data_dir={folder}', '--dataset=synthetic', f"--out_dir={os.path.join(folder, 'out')}",
            f'--max_iters={steps}', f'--eval_interval={steps}', f'--eval_iters={eval_iters(config)}',
            '--log_interval=1', '--always_save_checkpoint=True', f'--memory_cap_gb={(cap or 0) / em.GIB}',
            f'--compile={compiled}']


# train.py's lines the card prints as they come (its config and overrides are the preset's, known): its progress,
# and what ends it
PROGRESS = ('compiling', 'Resuming', 'attention:', 'step ', 'iter ', 'saving checkpoint', 'error: ')


def run_train(args, log, seconds, name, progress, meanwhile=lambda: None):
    """One train.py process writing its phase log to `log`, its progress printed under the preset's name: a Run."""
    out_of_memory = []

    def on_line(line):
        if 'out of memory' in line.lower() and not out_of_memory:
            out_of_memory.append(line)
        if line.startswith(PROGRESS) or 'Error' in line or out_of_memory:
            progress(f'{name}: {line}')
    status, last = run_child([sys.executable, 'train.py', *args, f'--phase_log={log}'], seconds, on_line, meanwhile)
    return Run(status, last, out_of_memory[0] if out_of_memory else None, phase_log.read(log))


def estimated(config, card):
    """The estimate of `config` on its card: the training peak, the total with its allowances, whether it fits."""
    try:
        estimate = fit.estimate({**em.ESTIMATOR_DEFAULTS, **config, 'world_size': 1, 'gpu_memory_gb': card},
                               warm_start=True)
    except Exception as e: # the row keeps its measurements; it says why it has no estimate
        return dict(estimate_error=f'{type(e).__name__}: {first_line(e)}')
    return dict(estimated_peak_bytes=estimate['train']['peak_bytes'], estimated_total_bytes=estimate['total_bytes'],
                estimate_fits=estimate['fits'])


def run_preset(path, device, device_type, steps, limit, facts, progress):
    """The preset's row: its card, cap and estimate, then train.py's two runs within limit = (seconds, the key that
    set them): how far they got (phase_reached), whether they fit the cap, and their figures where both ended. A
    preset that this machine cannot run (facts['lacks']: train.py's own check) is skipped with that line."""
    start, name, card = time.perf_counter(), os.path.basename(path), card_gib(path)
    tiny = device_type != 'cuda'
    config, overrides, model_args = load_preset(path, tiny)
    cap = None if tiny else cap_bytes(config, card)
    compiled = config['compile'] and not tiny # a CPU: eager, the compiled graphs are the GPU's
    row = dict(preset=name, card_gib=card, cap_bytes=cap)
    if name in facts['lacks']:
        return dict(row, skipped=facts['lacks'][name])
    if cap is not None and cap > facts['total_memory']:
        return dict(row, skipped=f"the {card} GB card's cap ({cap / em.GIB:.2f} GiB) is more than this GPU has "
                                 f"({facts['total_memory'] / em.GIB:.2f} GiB)")
    progress(f'{name}: micro-batch {config["batch_size"]} x {config["block_size"]}, gradient_accumulation_steps '
             f'{config["gradient_accumulation_steps"]}, {steps} timed steps, '
             + (f'capped at {cap / em.GIB:.2f} GiB for its {card} GB card' if cap else 'no cap (a CPU)'))
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_data(os.path.join(tmp, 'synthetic'), config, model_args, steps)
        args = train_args(path, overrides, tmp, config, steps, device, cap, compiled)
        for label, extra in (('train.py', []), ('train.py resume', ['--init_from=resume'])):
            progress(f'{name}: {label}')
            meanwhile = (lambda: row.update(estimated(config, card))) if not runs else (lambda: None)
            runs.append(run_train(args + extra, os.path.join(tmp, f'{len(runs)}.phases'),
                                  limit[0] - (time.perf_counter() - start), name, progress, meanwhile))
            if runs[-1].status != 0:
                break
    row.update(outcome(runs, limit, cap))
    if row['phase_reached'] == 'done':
        row.update(figures(config, model_args, runs, facts['peak_flops'], compiled))
    return dict(row, seconds=time.perf_counter() - start)


def phase_reached(runs):
    """The phase the preset's runs got to: the last line of the last one's phase log, 'resume' and then '<phase>
    after resume' in the second, 'done' once it ended; 'starting' before the first line."""
    if len(runs) == 1:
        return runs[0].events[-1]['phase'] if runs[0].events else 'starting'
    phase = runs[1].events[-1]['phase'] if runs[1].events else 'resume'
    return phase if phase in ('resume', 'done') else f'{phase} after resume'


def outcome(runs, limit, cap):
    """phase_reached, and `fits`: True where both runs ended under the cap (bytes), False where one ran out of memory
    (the FAIL, with its line), None without a cap or where a run stopped at its limit (`stopped`) or failed otherwise
    (`error`, its last line; or the cap did not hold)."""
    run, phase = runs[-1], phase_reached(runs)
    row = dict(phase_reached=phase, fits=None, max_allocated_bytes=peak(runs, 'max_allocated_bytes'),
               max_reserved_bytes=peak(runs, 'max_reserved_bytes'))
    if run.status == 0 and cap is not None and row['max_reserved_bytes'] > cap: # never proof of fitting the card
        row['error'] = (f"the allocator reserved {row['max_reserved_bytes'] / em.GIB:.2f} GiB, beyond the cap of "
                        f"{cap / em.GIB:.2f} GiB: the cap did not hold")
    elif run.status == 0:
        row['fits'] = True if cap is not None else None
    elif run.status is None:
        row['stopped'] = f'stopped after {limit[0]:.0f} s ({limit[1]}) while {phase}'
    elif run.out_of_memory:
        row.update(fits=False, error=run.out_of_memory)
    else:
        row['error'] = run.last_line
    return row


def peak(runs, key):
    """The largest of a memory figure over both runs' phase logs; None off CUDA."""
    return max((event[key] for run in runs for event in run.events if key in event), default=None)


def durations(events, phase):
    """How long each line of `phase` in a phase log lasted: until the next line began."""
    return [after['seconds'] - line['seconds'] for line, after in zip(events, events[1:]) if line['phase'] == phase]


def figures(config, model_args, runs, peak_flops, compiled):
    """The figures of two runs that ended. The first run's first step and first evaluation compile (where the preset
    compiles); its `steps` later steps give the step time (their median), its last evaluation the evaluation time;
    the resumed run's first evaluation and step beyond those, its compilation (torch's cache at work or not)."""
    first, resumed = (run.events for run in runs)
    step_times, evaluations = durations(first, 'step'), durations(first, 'evaluation')
    step_seconds, eval_seconds = statistics.median(step_times[1:]), evaluations[-1]
    row = dict(step_seconds=step_seconds, eval_seconds=eval_seconds,
               checkpoint_seconds=durations(first, 'checkpoint')[0], resume_seconds=durations(resumed, 'resume')[0])
    if compiled:
        row.update(compile_seconds=step_times[0] - step_seconds + evaluations[0] - eval_seconds,
                   resume_compile_seconds=durations(resumed, 'step')[0] - step_seconds +
                   durations(resumed, 'evaluation')[0] - eval_seconds)
    # the model file's iterations (training.runs): micro-steps each, the timed steps' among them, and its MFU, the model
    # built on the meta device, which allocates nothing
    with torch.device('meta'):
        run = make_run(config, new_model(model_args), None)
    micro_steps, timed = [run.micro_steps(it) for it in range(config['max_iters'])], run.micro_steps(1)
    row_tokens = config['batch_size'] * config['block_size']
    rows = config['eval_batch_size'] or config['batch_size']
    micro_batches = 2 * math.ceil(eval_iters(config) * config['batch_size'] / rows) # both splits
    row.update(tokens_per_s=row_tokens * timed / step_seconds, eval_micro_batch_seconds=eval_seconds / micro_batches,
               mfu=run.mfu(1, config['batch_size'] * timed, step_seconds, peak_flops) if peak_flops else None,
               tokens=row_tokens * sum(micro_steps))
    row.update(run_hours(config, row, sum(micro_steps) / timed))
    return row


def run_hours(config, row, steps):
    """train.py's run of `config` at the measured rate, in hours: `steps` steps of the timed ones' micro-steps
    (max_iters, or more where a model file's batch grows: train_hours), and an evaluation every eval_interval
    (eval_iters x batch_size windows of each split in eval_batch_size micro-batches: eval_hours)."""
    evaluations = config['max_iters'] // config['eval_interval'] + 1
    rows = config['eval_batch_size'] or config['batch_size']
    micro_batches = 2 * -(-config['eval_iters'] * config['batch_size'] // rows)
    train_hours = steps * row['step_seconds'] / 3600
    eval_hours = evaluations * micro_batches * row['eval_micro_batch_seconds'] / 3600
    return dict(train_hours=train_hours, eval_hours=eval_hours, hours=train_hours + eval_hours)
