"""What train.py tells the user when a step or an evaluation runs out of memory (a short summary and the next step),
and the one rule for re-splitting a step into smaller micro-batches, which the estimator's batch search uses too.

oom_advice is pure (numbers in, text out) so it can be tested without a GPU; cuda_memory_stats reads the numbers.
"""
import math

import torch

GIB = 2 ** 30


def cuda_memory_stats(device, cap_gib=0):
    """Allocated, reserved and peak bytes of `device` now, and its total memory: cap_gib GiB where train.py's
    memory_cap_gb holds the process to that (the card it stands for)."""
    return dict(allocated=torch.cuda.memory_allocated(device), reserved=torch.cuda.memory_reserved(device),
                peak=torch.cuda.max_memory_allocated(device),
                total=int(cap_gib * GIB) or torch.cuda.get_device_properties(device).total_memory)


def fitting_batch_size(batch_size, fixed, peak, total):
    """The largest micro-batch that should fit, assuming memory beyond `fixed` (weights etc., allocated before the
    first forward) grows linearly with the batch: batch * (total - fixed) / (peak - fixed), rounded down. At least 1,
    and below `batch_size`, which did not fit (the peak misses the allocation that failed)."""
    if peak > fixed:
        batch = int(batch_size * (total - fixed) / (peak - fixed))
    else:
        batch = batch_size // 2  # no growth measured: halve
    return max(1, min(batch, batch_size - 1))


def resplit(batch_size, gradient_accumulation_steps, world_size, largest):
    """(micro-batch, gradient_accumulation_steps) for micro-batches of at most `largest`: the fewest micro-steps that
    keep at least the samples per step, divisible by world_size as train.py needs, then the smallest micro-batch
    that does with them (it fits too, and the samples per step stay within a micro-step of the original's)."""
    samples = batch_size * gradient_accumulation_steps
    accumulation = math.ceil(math.ceil(samples / largest) / world_size) * world_size
    return math.ceil(samples / accumulation), accumulation


def zero1_splits_more(world_size, parallelism):
    """Whether parallelism='zero1' would split the optimizer state over the processes where it is not split now: under
    torchrun's ddp (zero1 and fsdp split it already; one process has no one to share it with)."""
    return world_size > 1 and parallelism == 'ddp'


def oom_advice(phase, batch_size, gradient_accumulation_steps, world_size, activation_checkpointing, stats=None,
               fixed=0, optimizer_in_backward=False, checkpointing_possible=True, parallelism='ddp'):
    """The message for an out-of-memory error in `phase` ('training' or 'evaluation').

    batch_size is the micro-batch of that phase (eval_batch_size for evaluation); gradient_accumulation_steps and
    world_size are the configured (global) values. stats: cuda_memory_stats(), or None where there are none (cpu).
    With optimizer_in_backward, which cannot accumulate, a smaller micro-batch is a smaller step.
    checkpointing_possible: whether the run has activation checkpointing (model.py's GPT; gpt2026.py's record not).
    parallelism: under torchrun, ddp's runs are told of zero1, which splits the optimizer state at no compute."""
    lines = [f'out of memory during {phase} at micro-batch {batch_size}.']
    if stats is not None:
        lines.append(f"memory: allocated {stats['allocated'] / GIB:.2f} GiB, reserved {stats['reserved'] / GIB:.2f} "
                     f"GiB, peak {stats['peak'] / GIB:.2f} GiB, card total {stats['total'] / GIB:.2f} GiB "
                     f"(before the first forward: {fixed / GIB:.2f} GiB)")
        fit = fitting_batch_size(batch_size, fixed, stats['peak'], stats['total'])
    else:
        fit = max(1, batch_size // 2)
    if phase == 'evaluation':
        if batch_size > 1:
            lines.append(f'next step: --eval_batch_size={fit} (evaluation only; training is unchanged)')
        else:
            lines.append('next step: a smaller block_size or model; the evaluation batch is already 1')
        return '\n'.join(lines)
    steps = []
    if batch_size > 1 and optimizer_in_backward:
        steps.append(f'--batch_size={fit} (fewer tokens per step: optimizer_in_backward cannot accumulate)')
    elif batch_size > 1:
        batch, accumulation = resplit(batch_size, gradient_accumulation_steps, world_size, fit)
        steps.append(f'--batch_size={batch} --gradient_accumulation_steps={accumulation} (at least the same tokens '
                     f'per step)')
    if zero1_splits_more(world_size, parallelism):
        steps.append('--parallelism=zero1 (each process keeps its share of the optimizer state)')
    if not activation_checkpointing and checkpointing_possible:
        steps.append("--activation_checkpointing=True (recomputes each block's forward in backward)")
    if not steps:
        checkpointed = ' with activation checkpointing' if checkpointing_possible else ''
        steps.append(f'a smaller block_size or model: batch 1{checkpointed} does not fit')
    lines.append('next step: ' + ', or '.join(steps))
    return '\n'.join(lines)
