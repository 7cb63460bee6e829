"""bench.py --mode=card's profile: where a training step's time goes. The speedrun preset's step (its micro-batches,
its Muon and Adam, compiled as the preset says) and nanoGPT's compiled step (config/train_gpt2.py with this project's
loss), each after WARM_UP_STEPS steps, one step under torch.profiler: its top kernels (on a CPU: operators) by time,
and the shares of attention, matmuls, the loss, the optimizer and the rest.

The profiler links a kernel to the operator that launched it and that operator to the ones around it, not to the
model's parts, so the shares go by names: what runs under the optimizer's step or zero_grad (torch's own ranges,
Optimizer.step#...) is the optimizer's; anything else takes the first of CATEGORIES that a name of the kernel, its
operator or an enclosing one contains. So the loss is its softmax (training/chunked_loss.py's exp2 and log2, nanoGPT's
cross-entropy, the backward of our loss's autograd Function), its forward's matmuls count as matmuls; a compiled
graph's fused kernels go by the operators they fused (Inductor's kernel names); and on a CPU a compiled graph's kernels
run inside its call (## Call CompiledFxGraph ##), 'other'."""
import collections
import contextlib
import io

import torch

from training import step
from training.card_checks import autocast
from training.card_measure import NANOGPT_CONFIG, SPEEDRUN, load_preset, seconds_of, synthetic_batches
from training.rules import DEFAULT_VOCAB_SIZE
from training.schedule import scheduled_window

WARM_UP_STEPS = 2 # the first compiles and makes the optimizer's state; the second runs as every later step does
TOP = 12 # kernels or operators listed, the longest first
NAME_LENGTH = 100 # a kernel's name is cut to this many characters (C++ templates run to thousands)
# (category, the lowercase fragments of a name that put a kernel in it), the first that matches wins; then 'other'
CATEGORIES = (
    ('optimizer', ('optimizer.',)),
    ('attention', ('attention', 'flash', 'fmha', 'flex')),
    ('loss', ('cross_entropy', 'crossentropy', 'log_softmax', 'logsumexp', 'nll_loss', 'exp2', 'log2')),
    ('matmul', ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::matmul', 'aten::linear', 'fused_mm', 'fused_addmm',
                'fused_bmm', 'gemm', 'xmma', 'cutlass', 'nvjet', 'cublas')),
)
OTHER = 'other'


def category(names):
    """The category of a kernel or operator from its own name and those of the operators around it."""
    lowered = [name.lower() for name in names]
    for name, fragments in CATEGORIES:
        if any(fragment in each for each in lowered for fragment in fragments):
            return name
    return OTHER


def timed(prof, cuda):
    """(seconds, name, category) of each kernel of a profile (CUDA), or each operator's own time (a CPU)."""
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CPU or event.is_async:
            continue
        names, parent = [event.name], event.cpu_parent
        while parent is not None:
            names.append(parent.name)
            parent = parent.cpu_parent
        if cuda:
            for kernel in event.kernels:
                yield kernel.duration / 1e6, kernel.name, category([kernel.name, *names])
        elif event.self_cpu_time_total > 0:
            yield event.self_cpu_time_total / 1e6, event.name, category(names)


def summary(prof, cuda):
    """A profile's kernel (or operator) time in all, each category's share of it, and its TOP kernels or operators."""
    by_category, by_name = collections.Counter(), collections.Counter()
    for seconds, name, kind in timed(prof, cuda):
        by_category[kind] += seconds
        by_name[name[:NAME_LENGTH], kind] += seconds
    total = sum(by_category.values()) or 1e-30
    return dict(profiled_seconds=total,
                shares={kind: by_category[kind] / total for kind in [name for name, _ in CATEGORIES] + [OTHER]},
                top=[dict(name=name, category=kind, seconds=seconds, share=seconds / total)
                     for (name, kind), seconds in by_name.most_common(TOP)])


def profile_step(label, config, model_args, device, device_type, compiled, report):
    """One training step of `config` as train.py takes it (its micro-batches, optimizer, autocast, clipping), after
    WARM_UP_STEPS, under torch.profiler: summary()'s figures with the step's wall time and shape."""
    torch.manual_seed(0)
    with contextlib.redirect_stdout(io.StringIO()): # build's lines about the optimizer
        model, optimizer = step.build(config, model_args, device, device_type)
    run = torch.compile(model) if compiled else model
    batches = synthetic_batches(config, model_args['vocab_size'], device)
    ctx = autocast(config['dtype'], device_type, config['autocast_cache'])
    scaler = torch.amp.GradScaler(device_type, enabled=config['dtype'] == 'float16')
    window = scheduled_window(0, config) or None

    def train_step():
        step.train_step(run, optimizer, batches, config['gradient_accumulation_steps'], ctx, scaler,
                        config['grad_clip'], forward_args=dict(attn_window=window))
    report(f'{label}: {WARM_UP_STEPS} steps to warm up' + (', the first compiling' if compiled else ''), {})
    for _ in range(WARM_UP_STEPS):
        seconds_of(train_step, device_type)
    report(f'{label}: profiling a step', {})
    cuda = device_type == 'cuda'
    activities = [torch.profiler.ProfilerActivity.CPU, *([torch.profiler.ProfilerActivity.CUDA] if cuda else [])]
    with torch.profiler.profile(activities=activities) as prof:
        seconds = seconds_of(train_step, device_type)
    torch._dynamo.reset() # the next model compiles from scratch, as in a run of its own
    return dict(micro_batch=[config['batch_size'], config['block_size']],
                micro_steps=config['gradient_accumulation_steps'], compiled=compiled, dtype=config['dtype'],
                optim=config['optim'], seconds=seconds, **summary(prof, cuda))


def measure_profile(device, device_type, tiny, report):
    """The speedrun preset's step and nanoGPT's compiled step, profiled (on a CPU at card_measure.TINY's scale,
    nanoGPT's with GPT-2's vocabulary, where the loss's share is): {label: profile_step's figures}."""
    result = {}
    speedrun = load_preset(f'config/{SPEEDRUN}', tiny)
    nanogpt = load_preset(f'config/{NANOGPT_CONFIG}', tiny, vocab_size=DEFAULT_VOCAB_SIZE if tiny else None)
    for label, (config, _, model_args), compiled in ((SPEEDRUN, speedrun, speedrun[0]['compile']),
                                                      (NANOGPT_CONFIG, nanogpt, True)):
        result[label] = profile_step(label, config, model_args, device, device_type, compiled, report)
        report(f'{label}: profiled', result)
        if device_type == 'cuda': # the next model on an empty GPU
            torch.cuda.empty_cache()
    return result
