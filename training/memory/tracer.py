"""
The memory tracer behind estimate_memory.py: a TorchDispatchMode that counts the live tensor storages of a traced
training step (under FakeTensorMode: no real memory, or for real on the CPU) and what made up their peak, as the
CUDA caching allocator would count them.
"""
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

# The CUDA caching allocator hands out blocks in multiples of 512 bytes; torch.cuda.max_memory_allocated counts those.
CUDA_ALIGNMENT = 512
CATEGORIES = ('parameters', 'weight_copies', 'gradients', 'optimizer_state', 'ddp_gradient_buckets', 'activations',
              'loss_path', 'temporaries')


def inner_tensors(value):
    """The plain tensors that hold `value`'s memory: a tensor subclass (an FSDP shard, torchao's 8-bit optimizer
    state) keeps it in the tensors it flattens to; anything but a tensor holds none."""
    if not isinstance(value, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(value):
        return [t for name in value.__tensor_flatten__()[0] for t in inner_tensors(getattr(value, name))]
    return [value]


def local_storage(tensor):
    """The storage behind `tensor`: for an FSDP shard (a DTensor), its rank's local tensor's."""
    return inner_tensors(tensor)[0].untyped_storage()


class MemoryTracer(TorchDispatchMode):
    """Counts the live tensor storages after every op (each storage once, aligned, until its last reference dies):
    the running total, its peak, and the peak's parts by where each allocation was made (forward, loss, autocast's
    weight copies, temporaries; parameters, gradients and optimizer state by identity)."""
    supports_higher_order_operators = True # FlexAttention's operators: their outputs counted as any op's

    def __init__(self, alignment=CUDA_ALIGNMENT, existing=()):
        """existing: tensors made before tracing (a benchmark's inputs): their storages are known and count 0 bytes,
        so views of them and in-place results in them are not taken for new allocations."""
        super().__init__()
        self.alignment = alignment
        self.live = {}  # id(untyped storage) -> [bytes, category]
        self.by_category = dict.fromkeys(CATEGORIES, 0)
        self.current = 0
        self.parameters, self.optimizer = [], None
        self.forward_depth = 0
        self.in_loss = False
        self.loss_nodes = []  # (first, last) autograd sequence numbers of each traced loss's backward nodes
        for tensor in existing:
            self._count(local_storage(tensor), 0, 'temporaries')
        self.reset_peak()

    def reset_peak(self):
        self.peak = self.current
        self.peak_breakdown = self._breakdown()
        self.allocations = {}  # (shape, dtype, category) -> bytes, every distinct allocation since the reset

    def watch(self, model, optimizer):
        """Track `model`'s parameters and `optimizer`'s state as such (the optimizer that holds this rank's state:
        parallel.local_optimizer), and tag the model's forward."""
        self.parameters, self.optimizer = list(model.parameters()), optimizer
        for p in self.parameters:
            self.retag(p, 'parameters')
        model.register_forward_pre_hook(lambda *_: self._count_forward(1))
        model.register_forward_hook(lambda *_: self._count_forward(-1), always_call=True)

    def _count_forward(self, step):
        self.forward_depth += step

    def retag(self, tensor, category):
        entry = self.live[id(local_storage(tensor))]
        self.by_category[entry[1]] -= entry[0]
        self.by_category[category] += entry[0]
        entry[1] = category

    def traced_loss(self, loss_fn):
        """`loss_fn` with its allocations, and those of its autograd nodes in backward, counted as the loss path."""
        def loss(hidden, weight, targets, **kwargs):
            self.in_loss = True
            try:
                result = loss_fn(hidden, weight, targets, **kwargs)
            finally:
                self.in_loss = False
            if result.grad_fn is not None and hidden.grad_fn is not None:
                # the loss's nodes are those created after hidden's: sequence numbers, so no node is kept alive
                self.loss_nodes.append((hidden.grad_fn._sequence_nr() + 1, result.grad_fn._sequence_nr()))
            return result
        return loss

    def _is_weight_cast(self, func, args):
        """A copy of a parameter (in the forward: autocast's low-precision cast, which its cache keeps through the
        forward, or the loss's own)."""
        if func is not torch.ops.aten._to_copy.default or not isinstance(args[0], torch.Tensor):
            return False
        entry = self.live.get(id(local_storage(args[0])))
        return entry is not None and entry[1] == 'parameters'

    def _category(self):
        node = torch._C._current_autograd_node()
        if node is not None:  # in backward
            seq = node._sequence_nr()
            if any(first <= seq <= last for first, last in self.loss_nodes):
                return 'loss_path'
            # checkpointed blocks recompute their forward with grad enabled; backward itself runs without
            return 'activations' if torch.is_grad_enabled() else 'temporaries'
        if self.in_loss:
            return 'loss_path'
        return 'activations' if self.forward_depth > 0 else 'temporaries'

    def _track(self, tensor, category):
        storage = local_storage(tensor)  # a subclass's inner tensors are mostly tracked already, when they were made
        if id(storage) in self.live:
            return
        size = self._count(storage, storage.nbytes(), category)
        allocation = (tuple(tensor.shape), str(tensor.dtype).removeprefix('torch.'), category)
        self.allocations[allocation] = max(size, self.allocations.get(allocation, 0))

    def _count(self, storage, nbytes, category):
        """Count `storage` as live, `nbytes` rounded up to the alignment, until it dies. Returns the rounded size."""
        key = id(storage)
        size = -(-nbytes // self.alignment) * self.alignment
        self.live[key] = [size, category]
        self.by_category[category] += size
        self.current += size
        weakref.finalize(storage, self._free, key)
        return size

    def _free(self, key):
        if key not in self.live:  # already freed by a resize to 0 (see _resized)
            return
        size, category = self.live.pop(key)
        self.by_category[category] -= size
        self.current -= size

    def _breakdown(self):
        breakdown = dict(self.by_category)
        if self.optimizer is None:
            return breakdown
        grads = [p.grad for p in self.parameters if p.grad is not None]
        state = [t for values in self.optimizer.state.values() for value in values.values()
                 for t in inner_tensors(value)]
        moved = set()
        for category, tensors in (('gradients', grads), ('optimizer_state', state)):
            for t in tensors:
                key = id(local_storage(t))
                if key in self.live and key not in moved:
                    moved.add(key)
                    size, tagged = self.live[key]
                    breakdown[tagged] -= size
                    breakdown[category] += size
        return breakdown

    def _resized(self, storage, nbytes):
        """FSDP frees and reallocates each gathered (unsharded) parameter by resizing its storage, which no op shows:
        UntypedStorage.resize_ is wrapped while tracing, and such storages count as parameters."""
        key = id(storage)
        if key in self.live:
            self._free(key)
        if nbytes:
            self._count(storage, nbytes, 'parameters')
            self._update_peak()

    def _update_peak(self):
        if self.current > self.peak:
            self.peak = self.current
            self.peak_breakdown = self._breakdown()

    def __enter__(self):
        resize = self._original_resize = torch.UntypedStorage.resize_
        def traced_resize(storage, nbytes):
            result = resize(storage, nbytes)
            self._resized(storage, nbytes)
            return result
        torch.UntypedStorage.resize_ = traced_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.prim.device.default and isinstance(args[0], FakeTensor):
            # most ops of a step are a tensor's .device, which allocates nothing: answered as FakeTensorMode would
            return torch.device('meta') if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        out = func(*args, **(kwargs or {}))
        category = self._category()
        if category in ('activations', 'loss_path') and self._is_weight_cast(func, args):
            category = 'weight_copies'  # a forward's cast of a weight; the optimizer's own copies are temporaries
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t, category)
        self._update_peak()
        return out

    def largest_allocations(self, n, category=None):
        """The n largest allocations of distinct shape and dtype since the last reset_peak, of `category` if given."""
        found = {}
        for (shape, dtype, tagged), size in sorted(self.allocations.items(), key=lambda item: -item[1]):
            if category in (None, tagged) and (shape, dtype) not in found:
                found[shape, dtype] = dict(shape=list(shape), dtype=dtype, bytes=size, category=tagged)
        return list(found.values())[:n]

    def phase_result(self):
        return dict(peak_bytes=self.peak, breakdown=self.peak_breakdown,
                    largest_allocations=self.largest_allocations(5),
                    largest_loss_path_allocations=self.largest_allocations(3, 'loss_path'))
