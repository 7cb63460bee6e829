"""The aten operators a training iteration dispatches, counted by part: an eager GPU step of a small model is bound by
kernel launches, roughly one an operator, so this count is what the loss's chunks and train.py's bookkeeping cost in
launches. Counted under FakeTensorMode (shapes, no memory, no arithmetic: GPT-2 at batch 12 x 1024 in seconds on a
CPU), for train.py's step (training/step.py) with our loss or nanoGPT's, and for nanoGPT's own loop, so bench.py
--count_ops and the tests compare them on the same model and config. Counted too: the operators at which the CPU
would wait for the GPU (waits_for_gpu), which leave the GPU idle while the CPU launches what follows.
"""
import contextlib
import itertools
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from training import step
from training.memory import estimate

# The parts of an iteration, in the order bench.py prints them: the model's forward without the loss, the loss (its
# forward and its backward nodes), the rest of backward; then the bookkeeping around them, what nanoGPT's loop does too
PARTS = ('forward', 'loss', 'backward', 'accumulation', 'clipping', 'optimizer', 'logging')
OVERHEAD = PARTS[3:]
# Operators whose result's size or value the CPU reads from a GPU: the CPU waits there for every kernel before it,
# then the GPU idles while the CPU launches what follows. train.py's step should have none but the log line's.
# (Blocking copies between the host and a GPU wait too: waits_for_gpu.)
GPU_WAITS = frozenset({'_local_scalar_dense', 'nonzero', 'masked_select', 'unique', '_unique', '_unique2',
                       'unique_dim', 'unique_consecutive', 'equal', 'is_nonzero'})
# Operators that wait or not by their arguments (waits_for_gpu): copies, repeat_interleave, indexing
COPIES, INDEXING = ('_to_copy', 'copy_'), ('index', 'index_put', 'index_put_', '_index_put_impl_')
ARGUMENT_RULES = frozenset({*COPIES, 'repeat_interleave', *INDEXING})


def waits_for_gpu(func, args, kwargs, gpu='cpu'):
    """Whether aten operator `func` on these arguments makes the CPU wait for a GPU, whose tensors are those on
    device type `gpu`: 'cpu' where the CPU's tensors stand for a GPU's (the estimator's fake traces, the CUDA
    kernels' CPU stand-ins), 'meta' for a run on the meta device, whose tensors stand for a GPU's and the CPU's for
    the host's. GPU_WAITS read a GPU tensor's value or a size that depends on its values; so do repeat_interleave
    where it must sum its repeats (no output_size given) and indexing by a boolean mask, which counts the mask's
    positions (masked_fill needs no count). A copy between the host and the GPU waits unless non_blocking: torch
    synchronizes the stream after it."""
    name = func._opname
    if name not in ARGUMENT_RULES and name not in GPU_WAITS:
        return False  # nearly every operator: decided without binding its arguments
    given = {**dict(zip((a.name for a in func._schema.arguments), args)), **(kwargs or {})}
    if name in COPIES:
        source = given['src'] if name == 'copy_' else given['self']
        target = given['self'].device if name == 'copy_' else torch.device(given.get('device') or source.device)
        between_host_and_gpu = gpu != 'cpu' and {source.device.type, target.type} == {'cpu', gpu}
        return between_host_and_gpu and not given.get('non_blocking')
    tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if tensor is None or tensor.device.type != gpu:
        return False  # a host tensor's value is at hand
    if name == 'repeat_interleave':
        return given.get('output_size') is None and func._overloadname != 'self_int'
    if name in INDEXING:
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in given['indices'])
    return True


class OperatorCounter(TorchDispatchMode):
    """Counts the aten operators dispatched while it is active, by part of the iteration: `part` (a context) names
    the bookkeeping, the model's forward hooks the forward, the autograd node running an op the backward (the loss's
    nodes, by sequence number, the loss). Only aten's operators count: prim ops (a tensor's .device) and the
    profiler's record_function launch nothing; a higher-order operator (FlexAttention's) counts as the one kernel it
    compiles to. waits: those where the CPU waits for a GPU (waits_for_gpu, its tensors on device type `gpu`), by
    part."""
    supports_higher_order_operators = True

    def __init__(self, gpu='cpu'):
        super().__init__()
        self.gpu = gpu
        self.counts = dict.fromkeys(PARTS, 0)
        self.waits = dict.fromkeys(PARTS, 0)
        self.current = 'accumulation'  # what runs outside the model and the named parts: train_step's own ops
        self.loss_nodes = []  # (first, last) autograd sequence numbers of each loss's backward nodes

    @contextlib.contextmanager
    def part(self, name):
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous

    def watch(self, model, optimizer, loss_fn):
        """Tag `model`'s forward and `optimizer`'s step; returns `loss_fn` tagged as the loss, for GPT's loss_fn."""
        model.register_forward_pre_hook(lambda *_: setattr(self, 'current', 'forward'))
        model.register_forward_hook(lambda *_: setattr(self, 'current', 'accumulation'), always_call=True)
        optimizer.register_step_pre_hook(lambda *_: setattr(self, 'current', 'optimizer'))
        optimizer.register_step_post_hook(lambda *_: setattr(self, 'current', 'accumulation'))

        def loss(hidden, weight, targets, **kwargs):
            with self.part('loss'):
                result = loss_fn(hidden, weight, targets, **kwargs)
            if result.grad_fn is not None and hidden.grad_fn is not None:
                self.loss_nodes.append((hidden.grad_fn._sequence_nr() + 1, result.grad_fn._sequence_nr()))
            return result
        return loss

    def _part(self):
        node = torch._C._current_autograd_node()
        if node is None:
            return self.current
        seq = node._sequence_nr()
        return 'loss' if any(first <= seq <= last for first, last in self.loss_nodes) else 'backward'

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            self.counts[self._part()] += 1
        elif func.namespace == 'aten':
            part = self._part()
            self.counts[part] += 1
            if waits_for_gpu(func, args, kwargs, self.gpu):
                self.waits[part] += 1
        return func(*args, **(kwargs or {}))


def nanogpt_step(model, optimizer, batches, accumulation, ctx, scaler, grad_clip, counter):
    """One iteration of nanoGPT's train.py loop, as it is written there (the reference train.py's bookkeeping is
    counted against): its micro-steps, clipping, AdamW step and the log line's loss.item()."""
    X, Y = batches.take()
    for micro_step in range(accumulation):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / accumulation
        X, Y = batches.fetch()
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        with counter.part('clipping'):
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    with counter.part('logging'):
        logged_item(loss)


def ours_step(model, optimizer, batches, accumulation, ctx, scaler, grad_clip, counter):
    """One iteration of train.py: training/step.py's train_step, clipping counted as such, and the log line's read
    of the loss (train.py's step.logged_loss)."""
    clip = torch.nn.utils.clip_grad_norm_

    def counted_clip(*args, **kwargs):
        with counter.part('clipping'):
            return clip(*args, **kwargs)
    with mock.patch.object(torch.nn.utils, 'clip_grad_norm_', counted_clip):
        loss, _ = step.train_step(model, optimizer, batches, accumulation, ctx, scaler, grad_clip)
    with counter.part('logging'):
        logged_item(loss)


def logged_item(loss):
    """loss.item(), as the log line reads it: under FakeTensorMode there is no value, but the op is dispatched."""
    try:
        loss.item()
    except torch._subclasses.fake_tensor.DataDependentOutputException:
        pass


STEPS = {'ours': ours_step, 'nanogpt': nanogpt_step}


def count_step(config, loss='chunked', loop='ours', device_type='cuda'):
    """The OperatorCounter (its counts and waits, {part: aten operators}) of one training iteration of `config`
    (estimate_memory.py's keys) with `loss` ('chunked' or 'naive') in `loop` ('ours': train.py's train_step;
    'nanogpt': nanoGPT's loop), counted after a first iteration has made the optimizer's state, under
    FakeTensorMode with train.py's model and the optimizer it builds on `device_type` (fused AdamW on CUDA), its
    attention kernels and autocast as the estimator traces them."""
    with FakeTensorMode(), estimate.attention_as_on_cuda():
        counter = OperatorCounter()
        model, optimizer = estimate.build(config, 'cpu', device_type, **estimate.attention_kernels(config, device_type),
                                          loss_fn=estimate.LOSS_FUNCTIONS[loss])
        model.loss_fn = counter.watch(model, optimizer, model.loss_fn)
        model.train()
        # the same batch for every micro-step: fetching data is no part of the count
        batch = estimate.random_batch(config['batch_size'], model.config.block_size, model.config.vocab_size, 'cpu')
        batches = step.Prefetcher(itertools.repeat(batch))
        ctx, scaler = estimate.autocast('cpu', config), step.NO_SCALER
        run = STEPS[loop]
        # the first iteration: the optimizer's state is made here, once a run, and one micro-step is enough for it
        run(model, optimizer, batches, 1, ctx, scaler, config['grad_clip'], counter)
        counter.counts, counter.waits = dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0)
        with counter:
            run(model, optimizer, batches, config['gradient_accumulation_steps'], ctx, scaler, config['grad_clip'],
                counter)
    return counter
