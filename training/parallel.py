"""
How train.py spreads a model over the processes that torchrun starts (the `parallelism` key, on PyTorch's own engine:
docs/parallel.md says what each mode costs and saves): sharding the model and the optimizer state, gradient
sync, the full-tensor checkpoint any mode and world size can resume, and what a process does when the others stop
answering or its launcher dies.
"""
import importlib
import inspect
import os
import sys
import threading
import time
import traceback

import torch

from training.errors import ConfigError, first_line, print_error

PARALLELISMS = ('ddp', 'zero1', 'fsdp')
# zero1's and fsdp's modules are imported by the functions that shard: together they take seconds to import, which
# every other run (one process, ddp, sample.py) would pay at start. fully_shard and DTensor are public from torch 2.6;
# torch 2.4 and 2.5 have the same ones in the private modules.
FSDP_MODULES = ('torch.distributed.fsdp', 'torch.distributed._composable.fsdp')
DTENSOR_MODULES = ('torch.distributed.tensor', 'torch.distributed._tensor')


def _first_module(names):
    """The first of the modules `names` that imports."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    return importlib.import_module(names[-1])


def _is_instance(value, module_names, class_name):
    """isinstance(value, module.class_name) for the first of module_names imported, without importing any: a value
    of the class exists only once its module is."""
    return any(name in sys.modules and isinstance(value, getattr(sys.modules[name], class_name))
               for name in module_names)


def world_size():
    """The processes of torch.distributed's default group (1 without one)."""
    return torch.distributed.get_world_size() if torch.distributed.is_available() and \
        torch.distributed.is_initialized() else 1


def _is_zero1(optimizer):
    return _is_instance(optimizer, ('torch.distributed.optim',), 'ZeroRedundancyOptimizer')


def _is_shard(value):
    return _is_instance(value, DTENSOR_MODULES, 'DTensor')


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
    fsdp = _first_module(FSDP_MODULES)
    policy = fsdp.MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    for block in model.transformer.h:
        fsdp.fully_shard(block, mesh=mesh, mp_policy=policy)
    fsdp.fully_shard(model, mesh=mesh, mp_policy=policy)


def shard_optimizer_state(optimizer):
    """ZeRO-1: the same optimizer, same parameter groups and hyperparameters, with each rank holding and stepping the
    state of its share of the parameters. `optimizer` must not have stepped yet (it holds no state to carry over)."""
    groups = [{k: v for k, v in group.items()} for group in optimizer.param_groups]
    accepted = inspect.signature(type(optimizer)).parameters  # defaults can hold more than __init__ takes
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    from torch.distributed.optim import ZeroRedundancyOptimizer
    return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)


def _gathered(state, keep):
    """`state` (nested dicts, lists and tensors) with each FSDP shard (DTensor) replaced by its full tensor, moved to
    the CPU at once so the device never holds the whole model; on ranks where not `keep`, None. A collective when
    there are DTensors: every rank must call it on the same structure."""
    if _is_shard(state):
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
    if _is_zero1(optimizer):
        optimizer.consolidate_state_dict(to=0)  # rank 0 is the master
        optimizer_state = optimizer.state_dict() if master else None
    elif hasattr(optimizer, 'full_state_dict'):  # gpt2026.py's record's, which shards its own state under zero1
        optimizer_state = optimizer.full_state_dict(master)
    else:
        optimizer_state = _gathered(optimizer.state_dict(), master)
    model_state = _gathered(model.state_dict(), master)
    return (model_state, optimizer_state) if master else (None, None)


def load_optimizer_state(optimizer, state):
    """A full optimizer state dict (from any mode, any world size, or nanoGPT) into `optimizer`, split as its
    parameters are: ZeroRedundancyOptimizer keeps its rank's share; under fsdp each moment becomes a DTensor
    sharded like its parameter (a collective, in parameter order on every rank)."""
    if not _is_zero1(optimizer):
        params = [p for group in optimizer.param_groups for p in group['params']]
        for index, param_state in state['state'].items():
            param = params[index]
            if _is_shard(param):
                for name, value in param_state.items():
                    if isinstance(value, torch.Tensor) and value.shape == param.shape:  # not the scalar step
                        param_state[name] = _first_module(DTENSOR_MODULES).distribute_tensor(
                            value.to(param.device), param.device_mesh, param.placements)
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


def local_optimizer(optimizer):
    """The optimizer that holds this rank's state: under zero1, ZeroRedundancyOptimizer's own (its share)."""
    return optimizer.optim if _is_zero1(optimizer) else optimizer


# How gloo reports a peer that does not answer in time, and one that is gone (NCCL's watchdog ends the process itself)
TIMED_OUT, PEER_GONE = ('Timed out',), ('Connection closed by peer', 'Connection reset by peer')


def collective_failure(exc, timeout):
    """(one-line message, training.errors.report's options) if `exc` is a collective that failed because another
    process stopped answering (a stopped or crashed rank, a wedged GPU, a lost node), naming the collective and the
    train.py line that ran it: every rank's own error, secondary where the other process is gone and reports why
    itself. None for any other error. The form errors.on_error takes."""
    secondary = any(text in str(exc) for text in PEER_GONE)
    if not (isinstance(exc, getattr(torch.distributed, 'DistError', ())) or secondary or
            any(text in str(exc) for text in TIMED_OUT)):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    caller = next((f for f in reversed(frames) if os.path.basename(f.filename) == 'train.py'), frames[-1])
    line = (caller.line or '').strip()
    collective = next((f.name for f in reversed(frames) if f'distributed{os.sep}' in f.filename),
                      'the gradient sync' if 'backward' in line else 'a collective')  # DDP's and FSDP's run in C++
    message = (f'{collective} at train.py line {caller.lineno} ({line}) got no answer from another process within '
               f'timeout={timeout:g}s ({first_line(exc)}): look for an error in the other ranks\' output first; a '
               f'stopped process, a hung GPU or a lost node stalls every rank; raise --timeout only if a rank is '
               f'legitimately slower (a large checkpoint on a slow disk)')
    return message, dict(every_rank=True, secondary=secondary)


def exit_with_launcher(poll_seconds=2.0):
    """Under torchrun: end this process if the launcher that started it dies (killed with SIGKILL, it cannot stop its
    workers, which would train on, holding the GPU). A daemon thread notices the parent change and exits at once
    (the last good ckpt.pt is intact: saves are atomic)."""
    if 'TORCHELASTIC_RUN_ID' not in os.environ or os.name != 'posix':
        return
    launcher = os.getppid()

    def watch():
        while os.getppid() == launcher:
            time.sleep(poll_seconds)
        rank = os.environ.get('RANK', 0)
        print_error(f'error: rank {rank}: the torchrun launcher (pid {launcher}) is gone: stopping')
        os._exit(2)  # from a thread, sys.exit would end only the thread

    threading.Thread(target=watch, daemon=True, name='launcher-watch').start()
