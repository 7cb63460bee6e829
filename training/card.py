"""bench.py --mode=card: one command that measures a GPU with this project's presets and checks what only a GPU can
show. First the checks: the compiled model's loss against eager's on one batch, FlashAttention's variable-length
kernel against the masked attention (loss and gradients), and bf16 weights with stochastic rounding against fp32
weights over a few steps. Then each card preset (config/*_<N>gb.py) that the estimator says fits this card: a few
steps of its own model, optimizer and micro-batch (training.step, synthetic tokens), the measured peak (allocated and
reserved) beside the estimate, the step time, tokens/s and MFU; last, the hours to the speedrun preset's token budget
at the measured rate, its loss evaluations included. On a CPU the same code runs every preset scaled down (TINY), so
that a test keeps it working; there are no memory counters and no GPU-only checks there."""
import contextlib
import glob
import io
import itertools
import json
import os
import re
import time

import torch

import configurator
from training import rules, step
from training.device import TORCH_DTYPES, peak_flops
from training.errors import ConfigError
from training.memory import estimate as em

PRESET_PATTERN = re.compile(r'_(\d+)gb\.py$')
SPEEDRUN = 'speedrun_gpt2_12gb.py' # the preset whose token budget the hours are for
# A preset's shape at a CPU's scale: the same keys and levers, a model that takes milliseconds a step
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=2, eval_batch_size=2, vocab_size=96,
            attn_window_warmup_start=4)
CHECK_STEPS = 8 # steps of bf16 weights against fp32 weights
BF16_TOLERANCE = 0.02 # relative loss difference allowed between bf16 and fp32 (weights or kernels)
GRADIENT_TOLERANCE = 0.05 # the varlen kernel's largest gradient difference, relative to the gradient's largest value


def preset_paths(config_dir):
    """The card presets, the speedrun preset first: config/*_<N>gb.py."""
    paths = sorted(p for p in glob.glob(os.path.join(config_dir, '*gb.py')) if PRESET_PATTERN.search(p))
    return sorted(paths, key=lambda p: os.path.basename(p) != SPEEDRUN)


def load_preset(path, tiny):
    """The train.py config of preset `path` (its own lines silent) and its model_args, built from scratch in the
    preset's shape (a pretrained model's, without its weights: the memory and time are the same) for synthetic
    tokens; `tiny`: at TINY's scale, in float32 on the CPU."""
    with contextlib.redirect_stdout(io.StringIO()):
        config = configurator.load_config(configurator.train_keys(), [path])
    config.update(hellaswag=False, wandb_log=False)
    if tiny:
        config.update({k: v for k, v in TINY.items() if k in config}, init_from='scratch', dtype='float32',
                      weight_dtype='float32', compile=False, device='cpu',
                      gradient_accumulation_steps=min(config['gradient_accumulation_steps'], 2),
                      attn_window=min(config['attn_window'], 16),
                      doc_token=min(config['doc_token'], TINY['vocab_size'] - 1))
    with contextlib.redirect_stdout(io.StringIO()):
        model_args, _ = rules.model_args(config, TINY['vocab_size'] if tiny else None)
    return dict(config, init_from='scratch'), model_args


def autocast(config, device_type):
    if config['dtype'] == 'float32':
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=TORCH_DTYPES[config['dtype']], cache_enabled=config['autocast_cache'])


def synthetic_batches(config, vocab_size, device):
    """Random tokens, a document token every 200 positions where the model has one: the records' packed layout."""
    def batch():
        x = torch.randint(vocab_size, (config['batch_size'], config['block_size']), device=device)
        if config['doc_token'] >= 0:
            x[:, ::200] = config['doc_token']
        return x, torch.randint(vocab_size, x.shape, device=device)
    return step.Prefetcher(batch() for _ in itertools.count())


def synchronize(device_type):
    if device_type == 'cuda':
        torch.cuda.synchronize()


def timed_steps(model, optimizer, config, device_type, batches, accumulation, steps):
    """Seconds per train_step of `accumulation` micro-steps, over `steps` after one untimed (compilation, state)."""
    ctx = autocast(config, device_type)
    scaler = torch.amp.GradScaler(device_type, enabled=config['dtype'] == 'float16')
    args = (ctx, scaler, config['grad_clip'], config['attn_window'] or None)
    step.train_step(model, optimizer, batches, accumulation, *args)
    synchronize(device_type)
    t0 = time.perf_counter()
    for _ in range(steps):
        step.train_step(model, optimizer, batches, accumulation, *args)
    synchronize(device_type)
    return (time.perf_counter() - t0) / steps


def measure_preset(config, model_args, device, device_type, steps):
    """A preset trained for a few steps as configured: the seconds of a whole step (from one- and two-micro-step
    iterations: a micro-step's time, and the rest of a step's), tokens/s, MFU and, on CUDA, the peak memory."""
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()): # build's lines about the optimizer, once per preset
        model, optimizer = step.build(config, model_args, device, device_type)
    raw_model = model
    if config['compile']:
        model = torch.compile(model)
    batches = synthetic_batches(config, model_args['vocab_size'], device)
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    accumulation = config['gradient_accumulation_steps']
    one = timed_steps(model, optimizer, config, device_type, batches, 1, steps)
    two = timed_steps(model, optimizer, config, device_type, batches, min(accumulation, 2), steps)
    micro_step = max(two - one, 0.0) if accumulation > 1 else one
    step_seconds = one + (accumulation - 1) * micro_step
    tokens = config['batch_size'] * config['block_size'] * accumulation
    peak = peak_flops(device)
    result = dict(step_seconds=step_seconds, tokens_per_s=tokens / step_seconds,
                  mfu=raw_model.estimate_mfu(config['batch_size'] * accumulation, step_seconds, peak[0])
                  if peak else None)
    with torch.no_grad(): # one evaluation micro-batch, for the hours' evaluations
        model.eval()
        rows = config['eval_batch_size'] or config['batch_size']
        x, y = (t[:rows] for t in batches.take())
        synchronize(device_type)
        t0 = time.perf_counter()
        with autocast(config, device_type):
            model(x, y)
        synchronize(device_type)
        result['eval_micro_batch_seconds'] = time.perf_counter() - t0
    if device_type == 'cuda':
        result.update(max_allocated_bytes=torch.cuda.max_memory_allocated(device),
                      max_reserved_bytes=torch.cuda.max_memory_reserved(device))
    del model, raw_model, optimizer, batches
    torch._dynamo.reset()
    if device_type == 'cuda':
        torch.cuda.empty_cache()
    return result


def hours_to_budget(config, measured):
    """Hours of train.py's run of `config` at the measured rate: max_iters steps and an evaluation every eval_interval
    (eval_iters x batch_size windows of each split, in eval_batch_size micro-batches)."""
    evaluations = config['max_iters'] // config['eval_interval'] + 1
    rows = config['eval_batch_size'] or config['batch_size']
    eval_seconds = 2 * -(-config['eval_iters'] * config['batch_size'] // rows) * measured['eval_micro_batch_seconds']
    return (config['max_iters'] * measured['step_seconds'] + evaluations * eval_seconds) / 3600


def loss_and_grads(model, x, y, config, device_type):
    model.zero_grad(set_to_none=True)
    with autocast(config, device_type):
        _, loss = model(x, y, attn_window=config['attn_window'] or None)
    loss.backward()
    return loss.item(), [p.grad.float() for p in model.parameters() if p.grad is not None]


def relative_difference(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


def check_compiled(config, model_args, device, device_type):
    """The speedrun preset's model, compiled and eager, on one batch: the loss difference, relative."""
    torch.manual_seed(0)
    model = step.build_model(config, model_args).to(device)
    x, y = synthetic_batches(config, model_args['vocab_size'], device).take()
    eager, _ = loss_and_grads(model, x, y, config, device_type)
    compiled, _ = loss_and_grads(torch.compile(model), x, y, config, device_type)
    torch._dynamo.reset()
    return dict(eager=eager, compiled=compiled, difference=relative_difference(compiled, eager))


def check_varlen(config, model_args, device, device_type):
    """FlashAttention's variable-length kernel against the masked attention, same weights and batch: the loss and the
    largest gradient difference, relative to the gradient's largest value."""
    x, y = synthetic_batches(config, model_args['vocab_size'], device).take()
    runs = []
    for kernel in (True, False):
        torch.manual_seed(0)
        model = step.build_model(config, model_args, flash_kernel=kernel).to(device)
        runs.append(loss_and_grads(model, x, y, config, device_type))
    (varlen, varlen_grads), (masked, masked_grads) = runs
    gradient = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()
                   for a, b in zip(varlen_grads, masked_grads))
    return dict(varlen=varlen, masked=masked, difference=relative_difference(varlen, masked),
                gradient_difference=gradient)


def check_bf16_weights(config, model_args, device, device_type):
    """CHECK_STEPS steps of adamw on one repeated batch with bf16 weights (stochastic rounding) and with fp32 weights,
    from the same initial weights: the largest relative difference of their losses."""
    losses = {}
    for weight_dtype in ('bfloat16', 'float32'):
        keys = dict(config, weight_dtype=weight_dtype, optim='adamw', optimizer_in_backward=False)
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()):
            model, optimizer = step.build(keys, model_args, device, device_type)
        batch = synthetic_batches(keys, model_args['vocab_size'], device).take()
        batches = step.Prefetcher(itertools.repeat(batch))
        losses[weight_dtype] = [step.train_step(model, optimizer, batches, 1, autocast(keys, device_type),
                                                grad_clip=keys['grad_clip'],
                                                attn_window=keys['attn_window'] or None)[0].item()
                                for _ in range(CHECK_STEPS)]
    difference = max(relative_difference(a, b) for a, b in zip(losses['bfloat16'], losses['float32']))
    return dict(bf16=losses['bfloat16'], fp32=losses['float32'], difference=difference)


def run(device, device_type, names=(), config_dir='config', steps=3, seconds=420, progress=print):
    """Everything the card mode measures, as one JSON-able dict: the checks, then the presets (those of `names`, or
    all) in the order of preset_paths until `seconds` have passed (the rest are listed as skipped)."""
    tiny = device_type != 'cuda'
    start = time.perf_counter()
    card_bytes = torch.cuda.get_device_properties(device).total_memory if not tiny else None
    result = dict(device=torch.cuda.get_device_name(device) if not tiny else f'{device} (presets scaled down)',
                  torch=torch.__version__, scaled_down=tiny, checks={}, presets=[])
    speedrun, speedrun_args = load_preset(os.path.join(config_dir, SPEEDRUN), tiny)
    if not tiny: # what only a GPU shows: its kernels and its compiler
        checks = (('compiled against eager', check_compiled), ('varlen kernel against masked', check_varlen),
                  ('bf16 weights against fp32', check_bf16_weights))
        for name, check in checks:
            progress(f'check: {name}')
            result['checks'][name] = dict(check(speedrun, speedrun_args, device, device_type),
                                          tolerance=BF16_TOLERANCE)
    for path in preset_paths(config_dir):
        name = os.path.basename(path)
        if names and name not in names:
            continue
        row = dict(preset=name)
        result['presets'].append(row)
        if time.perf_counter() - start > seconds:
            row['skipped'] = f'over the {seconds} s budget'
            continue
        config, model_args = load_preset(path, tiny)
        card_gb = float(PRESET_PATTERN.search(name).group(1))
        progress(f'{name}: estimate')
        estimate = em.estimate({**em.ESTIMATOR_DEFAULTS, **config, 'world_size': 1,
                                'gpu_memory_gb': card_bytes / em.GIB if card_bytes else card_gb}, warm_start=True)
        row.update(estimated_peak_bytes=estimate['train']['peak_bytes'], estimated_total_bytes=estimate['total_bytes'],
                   fits=estimate['fits'])
        if not estimate['fits']:
            row['skipped'] = 'the estimate does not fit this card'
            continue
        progress(f'{name}: {steps} steps of micro-batch {config["batch_size"]} x {config["block_size"]}, '
                 f'{config["gradient_accumulation_steps"]} micro-steps a step')
        try:
            row.update(measure_preset(config, model_args, device, device_type, steps))
        except ConfigError as e: # a lever this machine lacks (torchao's 8-bit AdamW)
            row['skipped'] = str(e)
            continue
        except torch.OutOfMemoryError: # what the estimate said would fit did not: the finding to report
            row['skipped'] = 'out of memory, though the estimate fits'
            torch.cuda.empty_cache()
            continue
        if name == SPEEDRUN:
            result['speedrun_hours'] = hours_to_budget(config, row)
            result['speedrun_tokens'] = (config['max_iters'] * config['batch_size'] * config['block_size'] *
                                         config['gradient_accumulation_steps'])
    result['seconds'] = time.perf_counter() - start
    return result


def gib(n):
    return 'n/a' if n is None else f'{n / em.GIB:.2f}'


def markdown(result):
    """The report of run()'s result, as Markdown."""
    lines = [f"# {result['device']}", '', f"torch {result['torch']}, {result['seconds']:.0f} s.", '']
    if result['checks']:
        lines += ['| check | result | relative difference | within |', '|---|---|---|---|']
        for name, check in result['checks'].items():
            gradients = check.get('gradient_difference')
            within = check['difference'] <= check['tolerance'] and (gradients or 0) <= GRADIENT_TOLERANCE
            differences = f"{check['difference']:.2e}" + (f', gradients {gradients:.2e}' if gradients else '')
            lines.append(f"| {name} | {'pass' if within else 'FAIL'} | {differences} | {check['tolerance']:g} |")
        lines.append('')
    lines += ['| preset | estimated peak GiB (total) | max allocated GiB | max reserved GiB | s/step | tokens/s '
              '| MFU |', '|---|---|---|---|---|---|---|']
    for row in result['presets']:
        if 'skipped' in row:
            lines.append(f"| {row['preset']} | {gib(row.get('estimated_peak_bytes'))} | skipped: {row['skipped']} "
                         f"| | | | |")
            continue
        mfu = f"{row['mfu'] * 100:.1f}%" if row['mfu'] is not None else 'n/a'
        lines.append(f"| {row['preset']} | {gib(row['estimated_peak_bytes'])} ({gib(row['estimated_total_bytes'])}) "
                     f"| {gib(row.get('max_allocated_bytes'))} | {gib(row.get('max_reserved_bytes'))} "
                     f"| {row['step_seconds']:.3f} | {row['tokens_per_s']:,.0f} | {mfu} |")
    if 'speedrun_hours' in result:
        scale = ' (scaled down: not the real budget)' if result['scaled_down'] else ''
        lines += ['', f"{SPEEDRUN}{scale}: {result['speedrun_tokens']:,} tokens in {result['speedrun_hours']:.2f} h at "
                      f"the measured rate, its loss evaluations included (HellaSwag's not)."]
    return '\n'.join(lines) + '\n'


def write_report(result, path):
    """`path`.md and `path`.json; the two paths."""
    with open(f'{path}.md', 'w', encoding='utf-8') as f:
        f.write(markdown(result))
    with open(f'{path}.json', 'w', encoding='utf-8') as f:
        json.dump(result, f, indent=1)
    return f'{path}.md', f'{path}.json'
