"""
How train.py spreads a model over the processes that torchrun starts: the `parallelism` key, on PyTorch's own engine.

- ddp: DistributedDataParallel. Every rank holds the whole training state, 16 bytes a parameter (fp32 weights,
  gradients and two AdamW moments), plus DDP's gradient buckets: more cards, no room for a bigger model.
- zero1: DDP with ZeroRedundancyOptimizer. Each rank keeps the AdamW state of 1/world_size of the parameters, steps
  those and broadcasts them: 8 bytes a parameter become 8/world_size. Same communication as DDP, plus the broadcast.
- fsdp: FSDP2 `fully_shard` on each transformer block and on the whole model. Weights, gradients and AdamW state are
  all split over the ranks (16/world_size bytes a parameter); a block's weights are gathered just for its forward
  and its backward, and its gradients reduce-scattered after. The most memory saved, the most communication.
  fsdp_mixed_precision=True gathers the weights in the autocast dtype (bf16/fp16): half the communication and half
  the memory of the gathered blocks; gradients are reduce-scattered in fp32 into the fp32 shards, as in torchtitan.

Whatever the mode, the checkpoint is nanoGPT's single ckpt.pt with full tensors: full_state_dicts gathers it for the
master, and load_optimizer_state splits it again, so a run can resume under any mode and any world size.
"""
import inspect

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
try:  # public from torch 2.6; torch 2.4 and 2.5 have the same functions here
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed._tensor import DTensor, distribute_tensor

from configurator import ConfigError

PARALLELISMS = ('ddp', 'zero1', 'fsdp')


def fsdp_param_dtype(config):
    """The dtype fsdp gathers the weights in: config's autocast dtype with fsdp_mixed_precision=True, else None (the
    fp32 master weights as they are). ConfigError, naming the key and the fix, where the toggle cannot apply."""
    if not config['fsdp_mixed_precision']:
        return None
    if config['parallelism'] != 'fsdp':
        raise ConfigError(f"fsdp_mixed_precision=True applies to parallelism='fsdp', not {config['parallelism']!r}: "
                          f"use --parallelism=fsdp or --fsdp_mixed_precision=False")
    if config['dtype'] == 'float32':
        raise ConfigError("fsdp_mixed_precision=True gathers the weights in the autocast dtype, and dtype='float32' "
                          "has none: use --dtype=bfloat16 (or float16), or --fsdp_mixed_precision=False")
    return getattr(torch, config['dtype'])


def shard_model(model, mesh=None, param_dtype=None):
    """FSDP2 in place: each transformer block is one unit (gathered for its own forward and backward), the root holds
    the rest (embeddings, whose weight is also lm_head's, and the final LayerNorm). With a param_dtype the weights
    are gathered in it and the gradients reduce-scattered in fp32; with None, both stay fp32."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def shard_optimizer_state(optimizer):
    """ZeRO-1: the same optimizer, same parameter groups and hyperparameters, with each rank holding and stepping the
    state of its share of the parameters. `optimizer` must not have stepped yet (it holds no state to carry over)."""
    groups = [{k: v for k, v in group.items()} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer)).parameters  # defaults can hold more than __init__ takes
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)


def _gathered(state, keep):
    """`state` (nested dicts, lists and tensors) with each FSDP shard (DTensor) replaced by its full tensor, moved to
    the CPU at once so the device never holds the whole model; on ranks where not `keep`, None. A collective when
    there are DTensors: every rank must call it on the same structure."""
    if isinstance(state, DTensor):
        full = state.full_tensor()
        return full.cpu() if keep else None
    if isinstance(state, dict):
        return {k: _gathered(v, keep) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_gathered(v, keep) for v in state)
    return state


def full_state_dicts(model, optimizer, master):
    """(model, optimizer) state dicts in nanoGPT's layout, full tensors and plain AdamW indexing, whatever the mode.
    A collective under zero1 and fsdp: every rank calls it; the master gets them, the others None."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)  # rank 0 is the master
        optimizer_state = optimizer.state_dict() if master else None
    else:
        optimizer_state = _gathered(optimizer.state_dict(), master)
    model_state = _gathered(model.state_dict(), master)
    return (model_state, optimizer_state) if master else (None, None)


def load_optimizer_state(optimizer, state):
    """A full optimizer state dict (from any mode, any world size, or nanoGPT) into `optimizer`, split as its
    parameters are: ZeroRedundancyOptimizer keeps its rank's share; under fsdp each moment becomes a DTensor
    sharded like its parameter (a collective, in parameter order on every rank)."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        params = [p for group in optimizer.param_groups for p in group['params']]
        for index, param_state in state['state'].items():
            param = params[index]
            if isinstance(param, DTensor):
                for name, value in param_state.items():
                    if isinstance(value, torch.Tensor) and value.shape == param.shape:  # not the scalar step
                        param_state[name] = distribute_tensor(value.to(param.device), param.device_mesh,
                                                              param.placements)
    optimizer.load_state_dict(state)


def set_gradient_sync(model, parallelism, enabled):
    """Whether the next backward syncs gradients across ranks: only the last micro-step of an iteration does, so
    accumulation costs no communication. `model` is the DDP wrapper, or the fully_shard-ed model under fsdp (whose
    skipped syncs keep unsharded gradients until the last micro-step: memory traded for communication)."""
    if parallelism == 'fsdp':
        model.set_requires_gradient_sync(enabled)
    else:
        # DDP's no_sync() context manager toggles this attribute; setting it directly keeps the loop flat
        model.require_backward_grad_sync = enabled

