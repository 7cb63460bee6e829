"""
Peak GPU memory of a training config before launch, on any machine, and a micro-batch that fits. For example:
$ python estimate_memory.py config/train_openwebtext_12gb.py --gpu_memory_gb=12
$ python estimate_memory.py config/train_openwebtext_12gb.py --batch_size=32 --find_batch_size
$ python estimate_memory.py config/train_openwebtext_12gb.py --json
Same config files and --key=value overrides as train.py, plus: gpu_memory_gb (the card's memory; a "12 GB" card has
12 GiB), json (print one JSON object), find_batch_size (the largest micro-batch that fits, with activation
checkpointing off and on), measure (two real steps on the GPU here: the ground truth), world_size (DDP processes),
loss (chunked: model.py's; naive: nanoGPT's full logits, to compare). dtype defaults to bfloat16, as on a GPU.

How: two real training iterations of train.py's model, loss, fused AdamW, gradient accumulation, clipping and
zero_grad run under FakeTensorMode, where tensors have shapes and dtypes but no memory, so the trace takes seconds
and needs no GPU. A TorchDispatchMode (memory_tracer.py) sees every op's outputs and counts the bytes of the live
storages, each rounded up to 512 bytes as the CUDA caching allocator does, each freed when its last reference dies;
the peak is taken after every op. What tensors don't show (the CUDA context, cuBLAS workspaces, fragmentation) is
added as an allowance.
"""
import contextlib
import io
import json
import math
import os
import pickle
import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

import configurator
import model as model_module
import optim as optim_lib
from checkpoint import CheckpointError, load_checkpoint
from configurator import ConfigError
from memory_tracer import CUDA_ALIGNMENT, MemoryTracer
from model import GPT, GPTConfig
from parallel import PARALLELISMS, fsdp_param_dtype, set_gradient_sync, shard_model, shard_optimizer_state

GIB = 2 ** 30
MIB = 2 ** 20
# The allowance for what tensors don't show. The CUDA context (driver state and the loaded kernels of CUDA 12 and
# PyTorch 2.x, with lazy module loading) takes 0.3-0.6 GiB of the card outside PyTorch's counters: 0.5 GiB.
CUDA_CONTEXT_BYTES = GIB // 2
# cuBLAS keeps a workspace per handle and stream (up to 32 MiB on Hopper, ~8 MiB before); attention kernels use a
# few MiB more and this model has no convolutions for cuDNN: 64 MiB covers them.
WORKSPACE_BYTES = 64 * MIB
# The caching allocator reserves more than is allocated: blocks split and cached by size class leave gaps, typically
# 5-15% of the peak in training loops like this one (memory_reserved vs max_memory_allocated): 10% of the peak.
FRAGMENTATION = 0.10
ALLOWANCE_NOTES = {  # the allowance's numbers and why, for the report
    'cuda_context_bytes': "CUDA context: driver state and kernels of CUDA 12 and PyTorch 2.x (0.3-0.6 GiB), outside "
                          "PyTorch's counters",
    'workspace_bytes': 'workspaces: cuBLAS keeps up to 32 MiB per handle and stream, attention kernels a few MiB',
    'fragmentation_bytes': f'fragmentation: {FRAGMENTATION:.0%} of the peak, as the caching allocator reserves more '
                           f'than it allocates'}
# Two iterations: the first allocates the AdamW state, the second runs forward and backward with it (the peak).
TRACED_ITERATIONS = 2
# Micro-steps 3 and later repeat micro-step 2 exactly (the gradients already exist and are accumulated in place),
# so at most 2 are traced per iteration.
TRACED_MICRO_STEPS = 2
DEFAULT_VOCAB_SIZE = 50304  # GPT-2's 50257 padded up to a multiple of 64, as train.py does
LOSSES = ('chunked', 'naive')
PARALLELISM_NOTES = {  # what the per-rank figures above mean, for world_size > 1
    'ddp': 'note: per rank; DDP holds the gradients a second time, in its buckets (counted above); the per-rank peak '
           'does not fall with world_size: try --parallelism=zero1 or fsdp',
    'zero1': "note: per rank (rank 0, the largest share); each rank keeps 1/world_size of the AdamW state, and DDP's "
             "gradient buckets (counted above)",
    'fsdp': 'note: per rank (rank 0, the largest share); weights, gradients and AdamW state are split over the ranks, '
            "each block's weights gathered only for its forward and backward (counted as parameters); between "
            "accumulation micro-steps the gradients stay unsharded (counted as temporaries)"}
ESTIMATOR_DEFAULTS = {'gpu_memory_gb': 12.0, 'json': False, 'find_batch_size': False, 'measure': False,
                      'world_size': 1, 'loss': 'chunked'}


def naive_cross_entropy(hidden, weight, targets, *, ignore_index=-1, chunk_size=None):
    """nanoGPT's loss: the full (N, vocab) logits, then cross-entropy. CUDA autocast runs cross-entropy's log_softmax
    in fp32 (CPU autocast keeps bf16), so the cast is explicit here and the trace matches the GPU."""
    return F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=ignore_index)


@contextlib.contextmanager
def loss_function(loss, tracer=None):
    """model.py's loss replaced, for the duration, by `loss` ('chunked' or 'naive'), counted by `tracer` if any."""
    original = model_module.chunked_cross_entropy
    loss_fn = naive_cross_entropy if loss == 'naive' else original
    model_module.chunked_cross_entropy = tracer.traced_loss(loss_fn) if tracer else loss_fn
    try:
        yield
    finally:
        model_module.chunked_cross_entropy = original


def model_config(config):
    """(GPTConfig, block size to crop to or None) as train.py builds them for config['init_from']."""
    init_from, block_size = config['init_from'], config['block_size']
    if init_from == 'scratch':
        meta_path = os.path.join(config['data_dir'], config['dataset'], 'meta.pkl')
        vocab_size = DEFAULT_VOCAB_SIZE
        if os.path.exists(meta_path):
            with open(meta_path, 'rb') as f:
                vocab_size = int(pickle.load(f)['vocab_size'])
        return GPTConfig(n_layer=config['n_layer'], n_head=config['n_head'], n_embd=config['n_embd'],
                         block_size=block_size, bias=config['bias'], vocab_size=vocab_size,
                         dropout=config['dropout']), None
    if init_from == 'resume':
        try:
            model_args = load_checkpoint(config['out_dir'], 'cpu')['model_args']
        except CheckpointError as e:
            raise ConfigError(str(e)) from None
        keys = ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias', 'vocab_size')
        gptconf = GPTConfig(dropout=config['dropout'], **{k: model_args[k] for k in keys})
        crop = None
    elif init_from in GPT.PRETRAINED_ARGS:
        gptconf = GPT.pretrained_config(init_from, dict(dropout=config['dropout']))
        crop = block_size if block_size < gptconf.block_size else None
    else:
        raise ConfigError(f"unknown init_from {init_from!r}: use 'scratch', 'resume' or one of "
                          f"{', '.join(GPT.PRETRAINED_ARGS)}")
    if block_size > gptconf.block_size:
        raise ConfigError(f"block_size={block_size} is larger than {init_from}'s {gptconf.block_size}: "
                          f"use --block_size={gptconf.block_size} or less")
    return gptconf, crop


def build(config, activation_checkpointing, mesh=None):
    """train.py's model and optimizer, on the current device and mode, sharded over `mesh` (see sharded_rank) as
    config's parallelism does; their stdout (print) goes nowhere."""
    with contextlib.redirect_stdout(io.StringIO()):
        optim_lib.check_config(config, config['world_size'])
        with unset_fake_temporarily():  # a library's one-off setup on real tensors (torchao's 8-bit code maps)
            optim_lib.warm_up(config['optim'])
        gptconf, crop = model_config(config)
        model = GPT(gptconf)
        if crop is not None:
            model.crop_block_size(crop)
        model.activation_checkpointing = activation_checkpointing
        if mesh is not None and config['parallelism'] == 'fsdp':
            shard_model(model, mesh, param_dtype=fsdp_param_dtype(config))
        optimizer = model.configure_optimizers(config['weight_decay'], config['learning_rate'],
                                               (config['beta1'], config['beta2']), device_type='cuda',
                                               optim=config['optim'])
        if config['optimizer_in_backward']:  # the step runs in backward's hooks: train_iterations is unchanged
            optimizer = optim_lib.OptimizerInBackward(optimizer)
        if mesh is not None and config['parallelism'] == 'zero1':
            optimizer = shard_optimizer_state(optimizer)
    return model, optimizer


def autocast(device_type, dtype):
    if dtype == 'float32':
        return contextlib.nullcontext()
    if device_type == 'cpu':  # fp16 and bf16 take the same bytes; CPU autocast covers bf16 best
        return torch.autocast('cpu', dtype=torch.bfloat16)
    return torch.autocast(device_type, dtype=getattr(torch, dtype))


def random_batch(batch_size, block_size, vocab_size, device):
    """Inputs and targets: int64 (batch_size, block_size), as train.py's get_batch puts them on the device."""
    shape = (batch_size, block_size)
    return torch.randint(vocab_size, shape, device=device), torch.randint(vocab_size, shape, device=device)


def train_iterations(model, optimizer, config, batch_size, device_type, warm_start=False):
    """train.py's loop, TRACED_ITERATIONS iterations of traced_micro_steps(config) micro-steps. GradScaler (fp16)
    scales in place and adds only scalars, so it is left out.

    warm_start, for the batch search: iteration 1's optimizer step alone, on zero gradients (it allocates the AdamW
    state), then 1 iteration of 1 micro-step, with the gradients of the micro-steps before it if there are any.
    Iteration 1's and micro-step 1's forward and backward hold a subset of the tensors of the micro-step traced, so
    the peak is the same, in a quarter of the time."""
    block, vocab, accumulation = model.config.block_size, model.config.vocab_size, config['gradient_accumulation_steps']
    iterations, micro_steps = TRACED_ITERATIONS, traced_micro_steps(config)
    model.train()
    X, Y = random_batch(batch_size, block, vocab, device_type)
    if warm_start:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
        if micro_steps == 1:
            optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros(())  # the previous micro-step's loss, still referenced during the next forward
        iterations, micro_steps = 1, 1
    sharded = hasattr(model, 'set_requires_gradient_sync')  # FSDP: train.py reduce-scatters on the last micro-step
    for _ in range(iterations):
        for micro_step in range(micro_steps):
            if sharded:
                set_gradient_sync(model, 'fsdp', micro_step == micro_steps - 1)
            with autocast(device_type, config['dtype']):
                _, loss = model(X, Y)
                loss = loss / accumulation
            X, Y = random_batch(batch_size, block, vocab, device_type)  # prefetch, as train.py
            loss.backward()
        if config['grad_clip'] != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config['grad_clip'])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@torch.no_grad()
def eval_forward(model, config, batch_size, device_type):
    model.eval()
    X, Y = random_batch(batch_size, model.config.block_size, model.config.vocab_size, device_type)
    with autocast(device_type, config['dtype']):
        model(X, Y)
    model.train()


@contextlib.contextmanager
def sharded_rank(config):
    """For zero1 and fsdp on world_size > 1 processes: a stand-in process group of that size ('fake' backend:
    collectives move no data) in which this process is rank 0, the one with the largest share (ZeRO hands out the
    largest tensors first, FSDP's first shards are the fullest), and FSDP's device mesh over it; built outside
    FakeTensorMode. Yields the mesh, or None where nothing is sharded."""
    if config['world_size'] == 1 or config['parallelism'] == 'ddp':
        yield None
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=config['world_size'])
    try:
        yield init_device_mesh('cpu', (config['world_size'],))
    finally:
        dist.destroy_process_group()


def traced_micro_steps(config):
    """Micro-steps traced per iteration: train.py splits gradient_accumulation_steps over the DDP processes."""
    return min(config['gradient_accumulation_steps'] // config['world_size'], TRACED_MICRO_STEPS)


def trace(config, loss='chunked', evaluate=True, alignment=CUDA_ALIGNMENT, warm_start=False):
    """The traced peaks of `config`'s training iterations (see train_iterations for warm_start) and evaluation
    forward (if `evaluate`) under FakeTensorMode, where no memory is used. Returns a JSON-able dict."""
    batch_size, activation_checkpointing = config['batch_size'], config['activation_checkpointing']
    eval_batch_size = config['eval_batch_size'] or batch_size
    tracer = MemoryTracer(alignment)
    with sharded_rank(config) as mesh, FakeTensorMode(), tracer, loss_function(loss, tracer):
        model, optimizer = build(config, activation_checkpointing, mesh)
        tracer.watch(model, optimizer)
        for block in model.transformer.h:
            # CUDA's attention kernels apply dropout inside the kernel and keep no T x T matrix; CPU's SDPA falls
            # back to the math kernel for dropout, which would, so the trace runs attention without dropout
            block.attn.dropout = 0.0
        if config['world_size'] > 1 and config['parallelism'] != 'fsdp':
            # DDP (zero1 too) copies the gradients to buckets of their own (gradient_as_bucket_view=False)
            buckets = torch.empty(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
            tracer.retag(buckets, 'ddp_gradient_buckets')
        tracer.reset_peak()
        train_iterations(model, optimizer, config, batch_size, 'cpu', warm_start)
        train = tracer.phase_result()
        evaluation = None
        if evaluate:
            tracer.reset_peak()
            eval_forward(model, config, eval_batch_size, 'cpu')
            evaluation = dict(batch_size=eval_batch_size, **tracer.phase_result())
        model_args = {k: getattr(model.config, k) for k in ('n_layer', 'n_head', 'n_embd', 'block_size',
                                                             'vocab_size', 'bias')}
        model_args['n_params'] = model.get_num_params(non_embedding=False)
    return dict(model=model_args, batch_size=batch_size,
                gradient_accumulation_steps=config['gradient_accumulation_steps'],
                micro_steps_traced=traced_micro_steps(config), world_size=config['world_size'],
                parallelism=config['parallelism'], dtype=config['dtype'], loss=loss,
                activation_checkpointing=activation_checkpointing, train=train, eval=evaluation)


def allowance(peak_bytes, cuda_context=True):
    """What tensors don't show, for a tensor peak of `peak_bytes`; cuda_context=False where the context already
    exists (and is already missing from the free memory the caller measured)."""
    return dict(cuda_context_bytes=CUDA_CONTEXT_BYTES if cuda_context else 0, workspace_bytes=WORKSPACE_BYTES,
                fragmentation_bytes=int(FRAGMENTATION * peak_bytes))


def total_bytes(peak_bytes, cuda_context=True):
    return peak_bytes + sum(allowance(peak_bytes, cuda_context).values())


def fewest_micro_steps(config, largest):
    """(batch_size, gradient_accumulation_steps) with micro-batches of at most `largest`: the fewest micro-steps that
    keep at least the config's tokens per step, then the smallest micro-batch that does with them (it fits too, and
    the tokens per step stay within a micro-step of the config's)."""
    accumulation = rebatched(config, largest)['gradient_accumulation_steps']
    return math.ceil(config['batch_size'] * config['gradient_accumulation_steps'] / accumulation), accumulation


def rebatched(config, batch_size):
    """`config` at micro-batch `batch_size`, with the gradient_accumulation_steps that keeps at least its tokens per
    step (batch_size * block_size * gradient_accumulation_steps), divisible by world_size as train.py needs."""
    samples = config['batch_size'] * config['gradient_accumulation_steps']
    world_size = config['world_size']
    accumulation = math.ceil(math.ceil(samples / batch_size) / world_size) * world_size
    return {**config, 'batch_size': batch_size, 'gradient_accumulation_steps': accumulation}


def largest_batch(config, budget_bytes, loss='chunked', cuda_context=True):
    """The largest micro-batch whose traced training peak plus allowance fits `budget_bytes` (None if batch 1 does
    not), and {micro-batch: estimated total bytes} of the traces made, up to the batch that needs one micro-step per
    iteration (batch_size * gradient_accumulation_steps / world_size): beyond it the tokens per step would grow.
    Each candidate is traced warm-started with its own gradient_accumulation_steps. Doubling, then bisection; as the
    peak grows almost linearly with the batch, both try the batch where the line meets the budget first when nearer."""
    limit = config['batch_size'] * config['gradient_accumulation_steps'] // config['world_size']
    totals = {}

    def fits(batch_size):
        result = trace(rebatched(config, batch_size), loss, evaluate=False, warm_start=True)
        totals[batch_size] = total_bytes(result['train']['peak_bytes'], cuda_context)
        return totals[batch_size] <= budget_bytes

    if not fits(1):
        return None, totals
    low, previous, high = 1, None, None
    while high is None and low < limit:
        candidate = 2 * low
        if previous is not None and totals[low] > totals[previous]:
            slope = (totals[low] - totals[previous]) / (low - previous)
            candidate = min(candidate, low + max(1, int((budget_bytes - totals[low]) / slope)))
        previous, candidate = low, min(candidate, limit)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    interpolate = True
    while high is not None and high - low > 1:
        width = high - low
        if interpolate:
            guess = low + int((budget_bytes - totals[low]) * width / (totals[high] - totals[low]))
            guess = min(max(guess, low + 1), high - 1)
        else:
            guess = (low + high) // 2
        if fits(guess):
            low = guess
        else:
            high = guess
        interpolate = not interpolate or 2 * (high - low) <= width  # bisect after a step that did not halve it
    return low, totals


def pick_batch_size(config, free_bytes):
    """(batch_size, gradient_accumulation_steps) for train.py's auto_batch_size: fewest_micro_steps with the largest
    micro-batch whose estimate fits `free_bytes` (the card's free memory, measured after the CUDA context exists, so
    the allowance leaves the context out), with the config's activation_checkpointing. `config` has train.py's keys
    (world_size defaults to 1). ConfigError if batch 1 does not fit."""
    config = {**ESTIMATOR_DEFAULTS, **config}
    batch_size, totals = largest_batch(config, free_bytes, cuda_context=False)
    if batch_size is None:
        hint = 'a smaller model or block_size' if config['activation_checkpointing'] else \
            '--activation_checkpointing=True, a smaller model or block_size'
        raise ConfigError(f'auto_batch_size: even batch_size=1 needs about {totals[1] / GIB:.2f} GiB but the GPU has '
                          f'{free_bytes / GIB:.2f} GiB free: try {hint}')
    return fewest_micro_steps(config, batch_size)


def measure(config, loss='chunked'):
    """The ground truth on this machine's GPU: torch.cuda.max_memory_allocated/reserved over the same two training
    iterations and the evaluation forward, run for real on CUDA."""
    measured = dict(device=torch.cuda.get_device_name())
    with torch.device('cuda'), loss_function(loss):
        model, optimizer = build(config, config['activation_checkpointing'])
        for phase, run in (('train', lambda: train_iterations(model, optimizer, config, config['batch_size'], 'cuda')),
                           ('eval', lambda: eval_forward(model, config, config['eval_batch_size'] or
                                                         config['batch_size'], 'cuda'))):
            torch.cuda.reset_peak_memory_stats()
            run()
            torch.cuda.synchronize()
            measured[phase] = dict(max_allocated_bytes=torch.cuda.max_memory_allocated(),
                                   max_reserved_bytes=torch.cuda.max_memory_reserved())
    return measured


def check_config(config):
    """ConfigError, naming the key, for a config the estimate cannot describe."""
    for key in ('batch_size', 'block_size', 'gradient_accumulation_steps', 'n_layer', 'n_head', 'n_embd',
                'world_size'):
        if config[key] < 1:
            raise ConfigError(f'{key} must be at least 1, got {config[key]}')
    if config['eval_batch_size'] < 0:
        raise ConfigError(f"eval_batch_size must be at least 1, or 0 for batch_size; got {config['eval_batch_size']}")
    if config['gradient_accumulation_steps'] % config['world_size'] != 0:
        raise ConfigError(f"gradient_accumulation_steps={config['gradient_accumulation_steps']} is not divisible by "
                          f"world_size={config['world_size']} (train.py splits it over the processes)")
    if config['init_from'] == 'scratch' and config['n_embd'] % config['n_head'] != 0:
        raise ConfigError(f"n_embd={config['n_embd']} must be divisible by n_head={config['n_head']}")
    if config['parallelism'] not in PARALLELISMS:
        raise ConfigError(f"unknown parallelism {config['parallelism']!r}: use one of {', '.join(PARALLELISMS)}")
    if config['dtype'] not in configurator.DTYPES:
        raise ConfigError(f"unknown dtype {config['dtype']!r}: use one of {', '.join(configurator.DTYPES)}")
    fsdp_param_dtype(config)  # raises for a fsdp_mixed_precision it cannot apply
    if config['loss'] not in LOSSES:
        raise ConfigError(f"unknown loss {config['loss']!r}: use --loss=chunked (model.py's) or --loss=naive "
                          f"(nanoGPT's full logits, for comparison)")
    if config['measure'] and not torch.cuda.is_available():
        raise ConfigError(f'--measure runs two real training steps on a GPU, but CUDA is not available here '
                          f'(torch {torch.__version__}): drop --measure for the estimate alone')
    fixed = CUDA_CONTEXT_BYTES + WORKSPACE_BYTES
    if config['gpu_memory_gb'] * GIB <= fixed:
        raise ConfigError(f"gpu_memory_gb={config['gpu_memory_gb']} is less than the CUDA context and workspaces "
                          f"alone ({fixed / GIB:.2f} GiB): give the card's memory, e.g. --gpu_memory_gb=12")


def gib(n):
    return f'{n / GIB:.2f} GiB'


def allocation_text(allocation):
    size = allocation['bytes']
    return f"{tuple(allocation['shape'])} {allocation['dtype']} " + (gib(size) if size >= GIB // 10 else
                                                                       f'{size / MIB:.1f} MiB')


def report(config, result):
    """main()'s JSON-able `result` as text."""
    m, train, evaluation, a = result['model'], result['train'], result['eval'], result['allowance']
    checkpointing = 'on' if result['activation_checkpointing'] else 'off'
    lines = [f"model: {m['n_params'] / 1e6:.1f}M parameters (n_layer={m['n_layer']}, n_head={m['n_head']}, "
             f"n_embd={m['n_embd']}, block_size={m['block_size']}, vocab_size={m['vocab_size']}, bias={m['bias']})",
             f"step: micro-batch {result['batch_size']} x {m['block_size']}, gradient_accumulation_steps="
             f"{result['gradient_accumulation_steps']}, world_size={result['world_size']}, {result['dtype']} autocast, "
             f"{optim_lib.describe(config['optim'], config['optimizer_in_backward'])}, {result['loss']} loss, "
             f"activation checkpointing {checkpointing}",
             f"training peak of tensors: {gib(train['peak_bytes'])} ({TRACED_ITERATIONS} iterations traced, "
             f"{result['micro_steps_traced']} micro-step(s) each: later micro-steps repeat the 2nd)"]
    lines += [f"  {gib(size):>9}  {name.replace('_', ' ')}" for name, size in train['breakdown'].items()
              if size or name != 'ddp_gradient_buckets']
    lines += [f"  largest allocation: {allocation_text(train['largest_allocations'][0])}; in the loss path: "
              + ', '.join(map(allocation_text, train['largest_loss_path_allocations'])),
              f"allowance for what tensors don't show: {gib(sum(a.values()))}",
              *(f'  {gib(size):>9}  {ALLOWANCE_NOTES[name]}' for name, size in a.items()),
              f"estimated training total: {gib(result['total_bytes'])}",
              f"evaluation forward (no_grad, batch {evaluation['batch_size']}): peak of tensors "
              f"{gib(evaluation['peak_bytes'])}, {gib(result['eval_total_bytes'])} with the allowance"]
    budget, needed = result['gpu_memory_bytes'], max(result['total_bytes'], result['eval_total_bytes'])
    card = f"a {config['gpu_memory_gb']:g} GB card ({gib(budget)})"
    hint = '' if result['activation_checkpointing'] else ' or --activation_checkpointing=True'
    if result['fits']:
        lines.append(f'verdict: fits {card}, {gib(budget - needed)} to spare')
    elif result['total_bytes'] <= budget:
        lines.append(f'verdict: training fits {card} but evaluation does NOT, {gib(needed - budget)} over: '
                     f'lower --eval_batch_size')
    else:
        lines.append(f'verdict: does NOT fit {card}, {gib(needed - budget)} over: try --find_batch_size{hint}')
    if config['compile']:
        lines.append('note: traced in eager mode; torch.compile usually needs a little less activation memory')
    if config['dtype'] == 'float16':
        lines.append('note: traced in bfloat16, which takes the same bytes as float16')
    if result['world_size'] > 1:
        lines.append(PARALLELISM_NOTES[result['parallelism']])
    for choice in result.get('find_batch_size', []):
        found = ('even batch 1 does not fit' if choice['batch_size'] is None else
                 f"--batch_size={choice['batch_size']} --gradient_accumulation_steps="
                 f"{choice['gradient_accumulation_steps']} ({choice['tokens_per_step']:,} tokens per step; the largest "
                 f"micro-batch that fits is {choice['largest_batch_size']}: {gib(choice['largest_total_bytes'])})")
        checkpointing = 'on' if choice['activation_checkpointing'] else 'off'
        lines.append(f'find_batch_size, activation checkpointing {checkpointing}: {found}')
    for phase in ('train', 'eval') if 'measured' in result else ():
        measured = result['measured']
        lines.append(f"measured on {measured['device']}, {phase}: max_memory_allocated "
                     f"{gib(measured[phase]['max_allocated_bytes'])}, max_memory_reserved "
                     f"{gib(measured[phase]['max_reserved_bytes'])}")
    return '\n'.join(lines)


def find_batch_sizes(config, budget_bytes):
    """largest_batch and fewest_micro_steps with activation checkpointing off and on, as JSON-able dicts;
    ConfigError if batch 1 fits neither way."""
    choices = []
    for checkpointing in (False, True):
        checkpointed = {**config, 'activation_checkpointing': checkpointing}
        largest, totals = largest_batch(checkpointed, budget_bytes, config['loss'])
        choice = dict(activation_checkpointing=checkpointing, largest_batch_size=largest,
                      largest_total_bytes=totals.get(largest), batch_size=None, gradient_accumulation_steps=None,
                      tokens_per_step=None)
        if largest is not None:
            batch_size, accumulation = fewest_micro_steps(config, largest)
            choice.update(batch_size=batch_size, gradient_accumulation_steps=accumulation,
                          tokens_per_step=batch_size * config['block_size'] * accumulation)
        choices.append(choice)
    if all(choice['batch_size'] is None for choice in choices):
        raise ConfigError(f"gpu_memory_gb={config['gpu_memory_gb']}: even batch_size=1 with activation checkpointing "
                          f"needs {gib(totals[1])}: use a larger card, or a smaller model or block_size")
    return choices


def estimate(config):
    """Everything main() reports for a checked config, as one JSON-able dict."""
    budget_bytes = int(config['gpu_memory_gb'] * GIB)
    result = trace(config, config['loss'])
    result['allowance'] = allowance(result['train']['peak_bytes'])
    result['total_bytes'] = total_bytes(result['train']['peak_bytes'])
    result['eval_total_bytes'] = total_bytes(result['eval']['peak_bytes'])
    result['gpu_memory_bytes'] = budget_bytes
    result['fits'] = max(result['total_bytes'], result['eval_total_bytes']) <= budget_bytes
    if config['find_batch_size']:
        result['find_batch_size'] = find_batch_sizes(config, budget_bytes)
    if config['measure']:
        result['measured'] = measure(config, config['loss'])
    return result


def estimator_defaults():
    """train.py's keys and defaults, with the dtype its defaults pick on a bf16 GPU (on a machine without one they say
    float32; float16 GPUs take the same bytes), and this script's own keys."""
    return {**configurator.train_defaults(), 'dtype': 'bfloat16', **ESTIMATOR_DEFAULTS}


def load_config(argv):
    """The checked config of argv: train.py's config files and --key=value overrides, plus this script's keys; a bare
    boolean flag (--json) means --json=True. ConfigError for bad input."""
    defaults = estimator_defaults()
    argv = [f'{arg}=True' if arg.startswith('--') and isinstance(defaults.get(arg[2:]), bool) else arg for arg in argv]
    with contextlib.redirect_stdout(io.StringIO()):  # the configurator echoes the config files: noise here
        config = configurator.load_config(defaults, argv)
    check_config(config)
    return config


def main(argv):
    if '--help' in argv or '-h' in argv:
        configurator.load_config(estimator_defaults(), argv)  # prints the keys with their defaults and exits
    try:
        config = load_config(argv)
        result = estimate(config)
    except ConfigError as e:
        configurator.fail(e)
    print(json.dumps(result, indent=2) if config['json'] else report(config, result))


if __name__ == '__main__':
    main(sys.argv[1:])
