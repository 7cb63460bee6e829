"""Peak GPU memory of a training config before launch, on any machine: two of train.py's own training iterations
traced under FakeTensorMode (shapes, no memory; tracer.py counts the live storages) plus an allowance for what
tensors don't show; check_config for the keys estimate_memory.py adds. fit.py weighs the traces against a card:
the core of estimate_memory.py and of train.py's auto_batch_size.
"""
import contextlib
import io
import itertools
from unittest import mock

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

import gpt2026
from training.chunked_loss import chunked_cross_entropy, naive_cross_entropy
from training import attention as attention_module, optimizers, rules, runs, step
from training.checkpoint import load_checkpoint
from training.errors import ConfigError
from training.memory.tracer import CUDA_ALIGNMENT, MemoryTracer
from training.device import DTYPES, TORCH_DTYPES
from training.parallel import local_optimizer, set_gradient_sync

GIB = 2 ** 30
MIB = 2 ** 20
# The allowance for what tensors don't show (docs/memory.md says where each figure comes from; --measure gives
# your card's): the CUDA context (driver state, loaded kernels) lives outside PyTorch's counters,
CUDA_CONTEXT_BYTES = GIB // 2
# cuBLAS and attention kernels keep workspaces,
WORKSPACE_BYTES = 64 * MIB
# and the caching allocator reserves more than it allocates (blocks split and cached by size class leave gaps).
FRAGMENTATION = 0.10
# Two iterations: the first allocates the AdamW state, the second runs forward and backward with it (the peak).
TRACED_ITERATIONS = 2
# Micro-steps 3 and later repeat micro-step 2 exactly (the gradients already exist and are accumulated in place),
# so at most 2 are traced per iteration.
TRACED_MICRO_STEPS = 2
LOSS_FUNCTIONS = {'chunked': chunked_cross_entropy, 'naive': naive_cross_entropy}
LOSSES = tuple(LOSS_FUNCTIONS)
# estimate_memory.py's own keys (its --help shows these comments)
ESTIMATOR_DEFAULTS = dict(
    gpu_memory_gb=12.0, # the card's memory in GiB (a "12 GB" card has 12 GiB); gpu_headroom_gb of it is left free
    json=False, # print one JSON object instead of the report
    find_batch_size=False, # also find the largest micro-batch that fits, activation checkpointing off and on
    ladder=False, # if it does not fit: add memory levers one at a time until it does, and print that command
    measure=False, # also run two real training steps on this machine's GPU: the ground truth
    world_size=1, # processes under torchrun: the per-rank memory of ddp, zero1 or fsdp
    loss='chunked', # chunked: training/chunked_loss.py's loss; naive: nanoGPT's full logits, to compare
)


def gib(n):
    return f'{n / GIB:.2f} GiB'


def silent(message):
    """The progress callback that says nothing (train.py's auto_batch_size)."""


def budget(config, card_bytes):
    """The bytes of a card of `card_bytes` that config's run may take: all but gpu_headroom_gb, left to other
    programs (a desktop, a browser)."""
    return int(card_bytes - config['gpu_headroom_gb'] * GIB)


def model_args(config):
    """train.py's model_args for config (training.rules.model_args), with a resumed checkpoint's shape read from it."""
    resumed = None
    if config['init_from'] == 'resume':
        resumed = load_checkpoint(config['out_dir'], 'cpu')['model_args']  # a CheckpointError is a ConfigError
    return rules.model_args(config, rules.meta_vocab_size(config), resumed)


def build(config, device='cpu', device_type='cuda', mesh=None, **options):
    """train.py's model and optimizer (training.step.build) on `device`, sharded over `mesh` (see sharded_rank) as
    config's parallelism does; their stdout (print) goes nowhere. A pretrained model is built with its shape, not
    loaded: the memory is the same. The optimizer is the one train.py builds on `device_type` (fused on CUDA).
    options: runs.gpt_options' keywords (the tracer's loss_fn, flash_kernel, flex_kernel)."""
    with contextlib.redirect_stdout(io.StringIO()):
        with unset_fake_temporarily():  # a library's one-off setup on real tensors (torchao's 8-bit code maps)
            optimizers.warm_up(config['optim'])
        args, _ = model_args(config)
        default_dtype = torch.get_default_dtype()
        # made in weight_dtype, so that build's cast to it changes nothing: model.to() would swap the fake
        # parameters, which the tracer's weakrefs forbid
        torch.set_default_dtype(TORCH_DTYPES[config['weight_dtype']])
        try:
            return step.build({**config, 'init_from': 'scratch'}, args, device, device_type, sharded=mesh is not None,
                              mesh=mesh, **options)
        finally:
            torch.set_default_dtype(default_dtype)


def rows_as_documents(idx, doc_token):
    """attention.document_segments for a trace: one document a row (the trace's tokens are random, its tensors fake: the
    kernel keeps the same tensors for any number of documents)."""
    b, t = idx.shape
    return torch.arange(0, b * t + 1, t, dtype=torch.int32, device=idx.device), t


SCALED_DOT_PRODUCT_ATTENTION = torch.nn.functional.scaled_dot_product_attention  # torch's, which the trace replaces


def sdpa_as_on_cuda(q, k, v, attn_mask=None, dropout_p=0.0, **kwargs):
    """F.scaled_dot_product_attention for a trace: CUDA's attention kernels apply dropout inside the kernel and keep
    no T x T matrix; CPU's SDPA falls back to the math kernel for dropout, which would, so the trace runs attention
    without dropout."""
    return SCALED_DOT_PRODUCT_ATTENTION(q, k, v, attn_mask=attn_mask, **kwargs)


def keep_score(score, batch, head, q_idx, kv_idx):
    """FlexAttention's score_mod that changes nothing (the model's attention has none)."""
    return score


def flex_attention_as_on_cuda(q, k, v, block_mask, kernel_options):
    """attention.compiled_flex_attention()'s FlexAttention for a trace: its operator, whose fake tensors keep what
    the CUDA kernel keeps (the output, a logsumexp; no scores): torch's flex_attention refuses a training step on a
    CPU before reaching it."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_operator
    return flex_operator(q, k, v, keep_score, block_mask.as_tuple(), q.size(-1) ** -0.5, kernel_options)[0]


def attention_kernels(config, device_type):
    """build's options for the attention kernels a run on device_type takes: on CUDA attn_window and doc_token run in
    FlashAttention's kernel (attention.Kernels), windows in blocks in FlexAttention's (unless
    attention_kernel='masked'), whose stand-ins attention_as_on_cuda gives a trace on the CPU."""
    on_cuda = device_type == 'cuda'
    return dict(flash_kernel=on_cuda, flex_kernel=on_cuda and config['attention_kernel'] != 'masked')


@contextlib.contextmanager
def attention_as_on_cuda():
    """CUDA's attention kernels for a trace under FakeTensorMode on the CPU: their kept tensors, not the masked
    blocks a CPU computes, and the documents' segments of rows of random tokens (whose count a fake tensor has not)."""
    with (mock.patch.object(attention_module, 'document_segments', rows_as_documents),
          mock.patch.object(attention_module, 'position_segments', lambda docs: rows_as_documents(docs, -1)),
          mock.patch.object(attention_module, 'compiled_flex_attention', lambda: flex_attention_as_on_cuda),
          mock.patch.object(torch.nn.functional, 'scaled_dot_product_attention', sdpa_as_on_cuda)):
        yield


def autocast(device_type, config):
    """train.py's autocast context for config's dtype and autocast_cache."""
    if config['dtype'] == 'float32':
        return contextlib.nullcontext()
    # fp16 and bf16 take the same bytes; CPU autocast covers bf16 best
    dtype = torch.bfloat16 if device_type == 'cpu' else getattr(torch, config['dtype'])
    return torch.autocast(device_type, dtype=dtype, cache_enabled=config['autocast_cache'])


def random_batch(batch_size, block_size, vocab_size, device):
    """Inputs and targets: int64 (batch_size, block_size), as train.py's get_batch puts them on the device."""
    shape = (batch_size, block_size)
    return torch.randint(vocab_size, shape, device=device), torch.randint(vocab_size, shape, device=device)


def train_iterations(model, optimizer, config, batch_size, device_type, warm_start=False, progress=silent):
    """train.py's iterations (training.step.train_step, without GradScaler: scalars only): the TRACED_ITERATIONS its
    model file's run traces (training.runs: where its memory is largest), each with the run's schedule and forward
    arguments, of traced micro-steps. warm_start, for the batch search: the first optimizer step alone, on zero
    gradients, then one micro-step: the same peak in a quarter of the time, as the steps left out hold a subset of the
    traced one's tensors. Returns the last iteration's (loss, gradient norm), as train_step."""
    run = runs.make_run(config, model, optimizer)
    block, vocab = config['block_size'], model.config.vocab_size
    iterations, micro_steps = run.traced_steps, traced_micro_steps(run, config)
    model.train()
    results = None  # train.py's loss and gradient norm of an iteration, referenced until the next one returns
    if warm_start:
        run.start_step(iterations[0])
        in_backward = isinstance(optimizer, optimizers.OptimizerInBackward)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
            # in backward: stepped a parameter at a time, its gradient freed, as backward's hooks do; states made,
            # updates not run, as each update is traced again in backward beside more tensors
            if in_backward:
                with optimizers.states_only():
                    optimizer.step()
                p.grad = None
        optimizer.step()
        if micro_steps == 1:
            optimizer.zero_grad(set_to_none=True)
        run.end_step(iterations[0])
        results = torch.zeros(()), torch.zeros(()) if config['grad_clip'] != 0.0 else None
        iterations, micro_steps = iterations[1:], 1
    sharded = hasattr(model, 'set_requires_gradient_sync')  # FSDP: train.py reduce-scatters on the last micro-step
    set_sync = (lambda last: set_gradient_sync(model, 'fsdp', last)) if sharded else None
    batches = step.Prefetcher(random_batch(batch_size, block, vocab, device_type) for _ in itertools.count())
    for number, it in enumerate(iterations, 1):
        progress(f'  iteration {number} of {len(iterations)}, {micro_steps} micro-step{"s" * (micro_steps > 1)}')
        run.start_step(it)
        results = step.train_step(model, optimizer, batches, micro_steps, autocast(device_type, config),
                                  grad_clip=config['grad_clip'], set_sync=set_sync, forward_args=run.forward_args(it),
                                  gradient_scale=run.gradient_scale)
        run.end_step(it)
    return results


@torch.no_grad()
def eval_forward(model, config, batch_size, device_type):
    model.eval()
    X, Y = random_batch(batch_size, config['block_size'], model.config.vocab_size, device_type)
    with autocast(device_type, config):
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


def traced_micro_steps(run, config):
    """Micro-steps traced per iteration: those of the run's traced iterations, which train.py splits over the DDP
    processes."""
    return min(run.micro_steps(run.traced_steps[-1]) // config['world_size'], TRACED_MICRO_STEPS)


def trace(config, loss='chunked', evaluate=True, alignment=CUDA_ALIGNMENT, warm_start=False, device_type='cuda',
          progress=silent):
    """The traced peaks of `config`'s training iterations (see train_iterations for warm_start) and evaluation
    forward (if `evaluate`) under FakeTensorMode, where no memory is used; with eval_only (train.py evaluates once
    and stops) the evaluation forward alone, of the model as built, and train None. Returns a JSON-able dict.
    device_type: whose optimizer and autocast to trace, 'cuda' (the estimate) or 'cpu' (to compare with a real run
    on a CPU). progress: called with a line of text at each micro-step (a large model's trace takes minutes)."""
    batch_size, activation_checkpointing = config['batch_size'], config['activation_checkpointing']
    eval_batch_size = config['eval_batch_size'] or batch_size
    progress('eval_only: no training step to trace' if config['eval_only'] else
             f"tracing training at micro-batch {batch_size}, gradient_accumulation_steps="
             f"{config['gradient_accumulation_steps']}, activation checkpointing "
             f"{'on' if activation_checkpointing else 'off'}, {runs.optimizer_words(config)}")
    tracer = MemoryTracer(alignment)
    record_loss = tracer.traced_loss(gpt2026.softcapped_mtp_loss)  # gpt2026.py's loss, in the loss path as model.py's
    with (sharded_rank(config) as mesh, FakeTensorMode(), tracer, optimizers.representative_updates_only(),
          attention_as_on_cuda(),
          mock.patch.object(gpt2026, 'softcapped_mtp_loss', lambda hidden, weight, targets, weights, chunk_rows:
                            record_loss(hidden, weight, targets, weights=weights, chunk_rows=chunk_rows))):
        model, optimizer = build(config, 'cpu', device_type, mesh, **attention_kernels(config, device_type),
                                 loss_fn=tracer.traced_loss(LOSS_FUNCTIONS[loss]))
        tracer.watch(model, local_optimizer(optimizer))
        if (config['world_size'] > 1 and config['parallelism'] != 'fsdp'
                and not runs.run_class(config).optimizer_sums_gradients):
            # DDP (zero1 too) copies the gradients to buckets of their own (gradient_as_bucket_view=False); gpt2026.py's
            # optimizer sums them in place
            buckets = torch.empty(sum(p.numel() for p in model.parameters()), dtype=torch.float32)
            tracer.retag(buckets, 'ddp_gradient_buckets')
        tracer.reset_peak()
        train = None
        if not config['eval_only']:
            train_iterations(model, optimizer, config, batch_size, 'cpu', warm_start, progress)
            train = tracer.phase_result()
        evaluation = None
        if evaluate:
            progress(f'  evaluation forward at batch {eval_batch_size}')
            tracer.reset_peak()
            eval_forward(model, config, eval_batch_size, 'cpu')
            evaluation = dict(batch_size=eval_batch_size, **tracer.phase_result())
        run = runs.make_run(config, model, optimizer)
        model_args = run.summary()
    return dict(model=model_args, batch_size=batch_size,
                gradient_accumulation_steps=config['gradient_accumulation_steps'],
                micro_steps_traced=traced_micro_steps(run, config), world_size=config['world_size'],
                parallelism=config['parallelism'], dtype=config['dtype'], loss=loss,
                activation_checkpointing=activation_checkpointing, train=train, eval=evaluation)


def allowance(peak_bytes, cuda_context=True):
    """What tensors don't show, for a tensor peak of `peak_bytes`; cuda_context=False where the context already
    exists (and is already missing from the free memory the caller measured)."""
    return dict(cuda_context_bytes=CUDA_CONTEXT_BYTES if cuda_context else 0, workspace_bytes=WORKSPACE_BYTES,
                fragmentation_bytes=int(FRAGMENTATION * peak_bytes))


def total_bytes(peak_bytes, cuda_context=True):
    return peak_bytes + sum(allowance(peak_bytes, cuda_context).values())


def measure(config, loss='chunked'):
    """The ground truth on this machine's GPU: torch.cuda.max_memory_allocated/reserved over the same two training
    iterations (none with eval_only) and the evaluation forward, run for real on CUDA."""
    measured = dict(device=torch.cuda.get_device_name())
    with torch.device('cuda'):
        model, optimizer = build(config, 'cuda', loss_fn=LOSS_FUNCTIONS[loss])
        phases = [('train', lambda: train_iterations(model, optimizer, config, config['batch_size'], 'cuda')),
                  ('eval', lambda: eval_forward(model, config, config['eval_batch_size'] or config['batch_size'],
                                                'cuda'))]
        for phase, run in phases[1:] if config['eval_only'] else phases:
            torch.cuda.reset_peak_memory_stats()
            run()
            torch.cuda.synchronize()
            measured[phase] = dict(max_allocated_bytes=torch.cuda.max_memory_allocated(),
                                   max_reserved_bytes=torch.cuda.max_memory_reserved())
    return measured


def check_config(config):
    """ConfigError, naming the key, for a config that train.py would refuse on a GPU (training.rules: the same
    checks, with world_size processes) or that this estimate cannot describe."""
    if config['world_size'] < 1:
        raise ConfigError(f"world_size must be at least 1, got {config['world_size']}")
    if config['dtype'] not in DTYPES:
        raise ConfigError(f"unknown dtype {config['dtype']!r}: use one of {', '.join(DTYPES)}")
    rules.check_config(config, config['world_size'], 'cuda')
    model_args(config)  # block_size and the dataset's vocabulary against the model's
    if config['loss'] not in LOSSES:
        raise ConfigError(f"unknown loss {config['loss']!r}: use --loss=chunked (training/chunked_loss.py) or "
                          f"--loss=naive (nanoGPT's full logits, for comparison)")
    if config['loss'] != 'chunked' and config['model_file'] == runs.RECORD_2026_FILE:
        raise ConfigError(f"loss={config['loss']!r} is a loss of model.py's GPT; model_file='gpt2026.py' has its own "
                          f"(in chunks of rows): drop --loss")
    for key in ('find_batch_size', 'ladder'):
        if config[key] and config['eval_only']:
            raise ConfigError(f"--{key} sizes the training step, which eval_only=True never runs: drop --{key}, and "
                              f"lower --eval_batch_size if the evaluation does not fit")
    if config['measure'] and not torch.cuda.is_available():
        raise ConfigError(f'--measure runs two real training steps on a GPU, but CUDA is not available here '
                          f'(torch {torch.__version__}): drop --measure for the estimate alone')
    fixed = CUDA_CONTEXT_BYTES + WORKSPACE_BYTES
    if budget(config, config['gpu_memory_gb'] * GIB) <= fixed:
        raise ConfigError(f"gpu_memory_gb={config['gpu_memory_gb']} less gpu_headroom_gb={config['gpu_headroom_gb']} "
                          f"is less than the CUDA context and workspaces alone ({fixed / GIB:.2f} GiB): give the "
                          f"card's memory, e.g. --gpu_memory_gb=12, or a smaller --gpu_headroom_gb")


