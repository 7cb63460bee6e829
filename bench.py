"""
nanoGPT's bench.py, a short version of train.py for benchmarking, plus a benchmark of the loss path.

$ python bench.py                  # mode=train: GPT-2 124M training iterations: time, tokens/s, MFU, peak memory
$ python bench.py config/speedrun_gpt2_12gb.py  # the same for a train.py preset's model, optimizer and micro-batch
$ python bench.py --loss=chunked,naive,torch --find_batch_size=True  # the same for each loss, and (CUDA) the
                                   # largest micro-batch each one trains at
$ python bench.py --count_ops=True --device=cpu  # the operators (GPU kernel launches) of an iteration, by part, with
                                   # our loss, the naive one, and nanoGPT's loop; no GPU needed
$ python bench.py --mode=loss      # the loss path alone: naive, chunked, torch's, Liger's and CCE's (CUDA), matmul
                                   # floor; with --compile=True (the default on CUDA) each also compiled
$ python bench.py --mode=sample --device=cpu  # GPT.generate with its KV cache against nanoGPT's, 500 new tokens
$ python bench.py --mode=card      # this GPU and every card preset: the checks of its compiler, kernels and bf16
                                   # weights, then train.py on each preset held to the card it names (fits, or FAIL
                                   # at a phase; its memory beside the estimate, compile and step times, MFU, hours),
                                   # our loss against nanoGPT's on GPT-2 124M, a profile of two steps; writes card.md
                                   # and card.json as it goes, and a later run measures only what they lack
                                   # (training/card.py; on a CPU, everything scaled down)

Keys are overridden as in train.py: config files, then --key=value (python bench.py --help lists them). bench.py
declares its own keys; train.py's are bench.py's too, with train.py's defaults (none is overridden here): train mode
builds train.py's model (architecture keys, weight_dtype, activation checkpointing) and optimizer (optim and its
keys), from scratch, without its learning rate schedule; compile compiles that model, and in loss mode each loss
besides its eager self; sample mode runs generate eagerly, as nanoGPT's does.
"""
from training.allocator import use_train_allocator
use_train_allocator() # train.py's allocator settings, before torch's import: the card's "reserved" is train.py's
import gc
import importlib
import itertools
import os
import sys
import time
import statistics
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from training import configurator
from training.chunked_loss import chunk_rows, chunked_cross_entropy, naive_cross_entropy
from model import GPTConfig
from training import card, rules
from training.card_report import markdown as card_markdown
from training.hellaswag import context_limit
from training.optimizers import warm_up
from training.step import Prefetcher, build, build_model, train_step
from training.device import TORCH_DTYPES, check_device, peak_flops
from training.errors import ConfigError, fail, first_line, install_handler
from training.memory.tracer import MemoryTracer
from training.opcount import PARTS, count_step

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)


def torch_linear_cross_entropy():
    """torch's F.linear_cross_entropy on its chunked path (options=LinearCrossEntropyOptions(); without options it
    builds the full logits) as a GPT.loss_fn, or None where this torch has no such path. Feature-detected: the
    function is new and its options have changed between versions."""
    if not (hasattr(F, 'linear_cross_entropy') and hasattr(torch.nn, 'LinearCrossEntropyOptions')):
        return None

    def loss_fn(hidden, weight, targets, *, ignore_index=-1, chunk_size=None, reduction='mean', chunk_bytes=None):
        return F.linear_cross_entropy(hidden, weight, targets, ignore_index=ignore_index, reduction=reduction,
                                      options=torch.nn.LinearCrossEntropyOptions())
    return loss_fn


# GPT.loss_fn by --loss name, for both modes: training/chunked_loss.py's, nanoGPT's full logits and torch's own (None
# where this torch lacks it)
LOSSES = {'chunked': chunked_cross_entropy, 'naive': naive_cross_entropy, 'torch': torch_linear_cross_entropy()}

MODES = ('train', 'loss', 'sample', 'card')

# -----------------------------------------------------------------------------
mode = 'train' # what to time: training iterations; the loss path alone (time and memory); GPT.generate with and
               # without its KV cache; or (training/card.py) the presets on this card
vocab_size = 0 # the model's vocabulary, also the loss mode's V (n_embd is its d); 0 = GPTConfig's, GPT-2's padded
real_data = True # train mode: read data_dir/dataset/train.bin; False: one fixed batch of random tokens
# train mode
burnin_steps = 10 # training iterations run before the timed ones (compilation and warm-up), not timed
num_steps = 20 # training iterations timed, after the burn-in
loss = 'chunked' # the losses to time, comma-separated (LOSSES: training/chunked_loss.py's, nanoGPT's full logits,
                 # torch's chunked F.linear_cross_entropy); each with the same model, data and micro-batch
find_batch_size = False # also find the largest micro-batch each loss trains at, by trying it on the GPU (CUDA only)
count_ops = False # train mode: instead of timing, the aten operators (kernel launches) of one iteration by part, with
                  # our loss and the naive one in train.py's step and nanoGPT's loop (training/opcount.py); the
                  # config's model, with its dataset's vocabulary as in train.py (vocab_size does not apply)
profile = False # train mode: the torch profiler (traces in ./bench_log) instead of simple timing; loss mode: also
                # split one run of each method into its matmuls and the rest, with torch.profiler
# loss mode
loss_rows = '4096,8192' # the N of hidden (N, n_embd) @ weight (vocab_size, n_embd).T, comma-separated
chunk_size = '0' # chunked_cross_entropy's rows per chunk, comma-separated to compare several; 0 = loss_chunk_mib's
loss_runs = 5 # timed forward+backward runs per method and N, after a first call; the median is reported
# sample mode
max_new_tokens = 500 # generated from a one-token prompt by each generate
# card mode
card_presets = '' # the config/*_<N>gb.py presets to measure, comma-separated file names (.py or not); '' = all
card_seconds = 1800 # the card ends after this many seconds: the part then running is stopped, those not started are
                    # left to a later run with the same card_report
card_preset_seconds = 600 # one part's limit (a preset's two train.py runs; the checks, nanoGPT's path, the profile):
                          # a part still running then is stopped and says so, and a later run tries it again
card_steps = 3 # each preset's timed training steps, after its first (compiling) one
card_report = 'card' # the report's path without its extension (card.md, card.json); an existing report of this GPU
                     # and torch is continued: only what it lacks, or what changed since, is measured
# -----------------------------------------------------------------------------
# then train.py's keys, with train.py's defaults, so that its presets and model and optimizer keys apply as they are
config = configurator.load_config({**configurator.read_keys(__file__), **configurator.train_keys()}, sys.argv[1:],
                                  {**rules.CHOICES, 'mode': MODES, 'loss': LOSSES})
device_type = check_device(config['device'], config['dtype'])
if config['mode'] != 'loss': # train.py's checks of the model and optimizer it builds (one process, no accumulation)
    rules.check_config({**config, 'gradient_accumulation_steps': 1, 'init_from': 'scratch'}, 1, device_type)
if config['mode'] not in MODES:
    raise ConfigError(f"unknown mode {config['mode']!r}: use one of {', '.join(MODES)}")
try:
    rows_list = [int(n) for n in config['loss_rows'].split(',')]
    chunk_sizes = [int(c) for c in config['chunk_size'].split(',')]
except ValueError:
    raise ConfigError(f"loss_rows and chunk_size take comma-separated integers, got "
                      f"{config['loss_rows']!r} and {config['chunk_size']!r}") from None
loss_names = config['loss'].split(',')
for name in loss_names:
    if name not in LOSSES:
        raise ConfigError(f"unknown loss {name!r}: use {', '.join(LOSSES)}, comma-separated")
# torch's own loss is optional, as the libraries of --mode=loss are: skipped with a note beside others, refused alone
if LOSSES['torch'] is None and 'torch' in loss_names:
    missing = f'F.linear_cross_entropy with LinearCrossEntropyOptions, which torch {torch.__version__} lacks'
    if loss_names == ['torch']:
        raise ConfigError(f'loss=torch needs {missing}: use --loss=chunked,naive, or a newer torch')
    print(f'loss torch skipped: it needs {missing}')
    loss_names.remove('torch')
if 'torch' in loss_names and config['logit_softcap']:
    raise ConfigError(f"loss=torch has no logit soft-capping: use --loss=chunked,naive with "
                      f"logit_softcap={config['logit_softcap']}, or --logit_softcap=0")
if config['mode'] == 'train' and config['model_file'] != 'model.py': # its own loss and the record's schedule
    raise ConfigError(f"bench.py's train mode times model.py's GPT with each --loss; model_file="
                      f"{config['model_file']!r} is timed in train.py itself: python bench.py --mode=card "
                      f"--card_presets=speedrun2026_gpt2_12gb, or train.py's log (tok/s, MFU)")
if config['mode'] == 'card' and config['card_steps'] < 1:
    raise ConfigError(f"card_steps={config['card_steps']} must be at least 1: the timed steps of each preset")
if config['find_batch_size'] and device_type != 'cuda':
    raise ConfigError('find_batch_size tries micro-batches until the GPU runs out of memory: it needs CUDA')
globals().update(config)
vocab_size = vocab_size or GPTConfig.vocab_size
# -----------------------------------------------------------------------------

torch.manual_seed(seed)
ptdtype = TORCH_DTYPES[dtype]
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16')) # as train.py's
synchronize = torch.cuda.synchronize if device_type == 'cuda' else lambda: None


def profiler_activities():
    cuda = [torch.profiler.ProfilerActivity.CUDA] if device_type == 'cuda' else []
    return [torch.profiler.ProfilerActivity.CPU, *cuda]


def free_memory():
    """Drop what the last model or failed step left behind, so the next one starts from an empty GPU."""
    gc.collect()
    if device_type == 'cuda':
        torch.cuda.empty_cache()


def random_batch(rows):
    return tuple(torch.randint(vocab_size, (rows, block_size), device=device) for _ in range(2))


def batch_source():
    """get_batch() of train mode: random windows of data_dir/dataset/train.bin, or one fixed batch of random tokens,
    so data loading is out of the measurement."""
    if not real_data:
        batch = random_batch(batch_size)
        return lambda: batch
    train_path = os.path.join(data_dir, dataset, 'train.bin')
    if not os.path.isfile(train_path):
        fail(f'{train_path} not found: run `python prepare/{dataset}.py`, or use --real_data=False')
    train_data = np.memmap(train_path, dtype=np.uint16, mode='r')
    if len(train_data) <= block_size:
        fail(f'{train_path} has {len(train_data)} tokens, too few for block_size={block_size}')

    def get_batch():
        ix = torch.randint(len(train_data) - block_size, (batch_size,))
        x = torch.stack([torch.from_numpy(train_data[i:i+block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(train_data[i+1:i+1+block_size].astype(np.int64)) for i in ix])
        return x.to(device), y.to(device)
    return get_batch


# CUDA's attention kernels launch a thread block per row along a grid dimension of at most 65,535: a micro-batch
# beyond it fails with a kernel error, not out of memory (cuDNN's on an H200, a tiny model at 65,536 rows)
MOST_ROWS = 65535


def largest_micro_batch(train_step, optimizer, good, bad=None):
    """The largest micro-batch that trains without running out of GPU memory, by trying: from `good`, a micro-batch
    that fits (or 0), doubling until one fails (`bad`, if known already), then bisecting between the two; at most
    MOST_ROWS. train_step(rows) runs one training step at that micro-batch."""
    def fits(rows):
        try:
            train_step(rows)
            fitted = True
        except torch.OutOfMemoryError:
            fitted = False
        optimizer.zero_grad(set_to_none=True) # the failed step's tensors went with its traceback; its gradients too
        free_memory()
        print(f'micro-batch {rows}: {"fits" if fitted else "out of memory"}')
        return fitted

    while bad is None:
        trial = min(2 * good, MOST_ROWS)
        if trial == good: # the kernels' limit, not the memory, stops the search
            return good
        good, bad = (trial, None) if fits(trial) else (good, trial)
    while bad - good > 1:
        middle = (good + bad) // 2
        good, bad = (middle, bad) if fits(middle) else (good, middle)
    return good


SCRATCH = dict(init_from='scratch', hellaswag=False) # bench's models: from scratch, the config's architecture


def model_args():
    """train.py's model_args for this config's architecture (GPT-2's by default) with vocab_size tokens."""
    return rules.model_args({**config, **SCRATCH}, vocab_size)[0]


def bench_train_loss(name, get_batch, device_peak):
    """Burn-in and timed steps of a fresh model (the same initialization and data for every loss) trained with
    `name`'s loss: a dict of its figures, with an 'oom' flag if batch_size ran out of GPU memory."""
    print(f'loss={name}, micro-batch {batch_size} x {block_size} tokens')
    torch.manual_seed(seed)
    warm_up(optim)
    # train.py's model and optimizer (optimizer_in_backward: stepped in backward), with this loss
    model, optimizer = build({**config, **SCRATCH}, model_args(), device, device_type, loss_fn=LOSSES[name])
    raw_model = model
    if compile:
        print('compiling the model...')
        model = torch.compile(model)

    def train_steps(steps, get_batch, after_step=lambda: None):
        """train.py's step, one micro-batch each (no accumulation), without its learning rate schedule."""
        batches = Prefetcher(get_batch() for _ in itertools.count())
        for k in range(steps):
            loss, _ = train_step(model, optimizer, batches, 1, ctx, scaler, grad_clip)
            print(f'{k}/{steps} loss {loss.item():.4f}')
            after_step()

    if profile: # docs: https://pytorch.org/docs/stable/profiler.html
        wait, warmup, active = 5, 5, 5
        with torch.profiler.profile(activities=profiler_activities(), with_flops=True,
                                    schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
                                    on_trace_ready=torch.profiler.tensorboard_trace_handler('./bench_log')) as prof:
            train_steps(wait + warmup + active, get_batch, prof.step)
        return None
    if device_type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
    figures = {'oom': False}
    try:
        for stage, steps in (('burn-in', burnin_steps), ('benchmark', num_steps)):
            print(f'{stage}: {steps} steps')
            synchronize()
            t0 = time.time()
            train_steps(steps, get_batch)
            synchronize()
            dt = time.time() - t0
    except torch.OutOfMemoryError:
        figures['oom'] = True
    if figures['oom']:
        print(f'loss={name}: out of GPU memory at micro-batch {batch_size}')
        optimizer.zero_grad(set_to_none=True)
        free_memory()
    else:
        figures['ms'] = dt / num_steps * 1000
        figures['tokens/s'] = batch_size * block_size * num_steps / dt
        figures['mfu'] = raw_model.estimate_mfu(batch_size, dt / num_steps, device_peak[0]) if device_peak else None
        mfu = f"{figures['mfu'] * 100:.2f}%" if device_peak else 'n/a (no known peak for this device)'
        print(f"time per iteration: {figures['ms']:.4f}ms, MFU: {mfu}")
        print(f"tokens/s: {figures['tokens/s']:,.0f}")
        if device_type == 'cuda':
            figures['peak GiB'] = torch.cuda.max_memory_allocated(device) / 2**30
            print(f"peak allocated memory: {figures['peak GiB']:.2f} GiB")
        else:
            print(f'peak memory: not measured on {device_type} (CUDA only)')
    if find_batch_size:
        print(f'loss={name}: the largest micro-batch that fits, by trying')
        step = lambda rows: train_steps(1, lambda: random_batch(rows))
        bounds = (0, batch_size) if figures['oom'] else (batch_size, None)
        figures['largest'] = largest_micro_batch(step, optimizer, *bounds)
    return figures


def bench_count_ops():
    """training/opcount.py's count of one iteration of this config, as on CUDA (fused AdamW; fake tensors: any size
    counts in seconds): train.py's step with our loss and with nanoGPT's, and nanoGPT's loop, part by part."""
    keys = {**config, **SCRATCH, 'world_size': 1}
    columns = {'ours, chunked loss': count_step(keys, 'chunked').counts,
               'ours, naive loss': count_step(keys, 'naive').counts,
               "nanoGPT's loop, naive loss": count_step(keys, 'naive', 'nanogpt').counts}
    print(f'aten operators of one training iteration: {n_layer} layers, micro-batch {batch_size} x {block_size}, '
          f'gradient_accumulation_steps={gradient_accumulation_steps}, grad_clip={grad_clip}, '
          f"{'no autocast' if dtype == 'float32' else dtype + ' autocast'}, "
          f'loss_chunk_mib={loss_chunk_mib}, as on CUDA (fused AdamW)')
    print(f"{'part':<14}" + ''.join(f'{name:>28}' for name in columns))
    for part in (*PARTS, 'total'):
        counts = [sum(c.values()) if part == 'total' else c[part] for c in columns.values()]
        print(f'{part:<14}' + ''.join(f'{count:>28,}' for count in counts))
    ours, naive = (sum(c.values()) for c in list(columns.values())[:2])
    print(f'chunked loss against the naive one: {ours / naive - 1:+.1%} operators a step')


def bench_train():
    get_batch = batch_source()
    device_peak = peak_flops(device)
    results = {}
    for name in loss_names:
        results[name] = bench_train_loss(name, get_batch, device_peak)
        torch._dynamo.reset() # the compiled model goes with it
        free_memory()
    if profile:
        return
    if device_peak:
        print(f"MFU against the {device_peak[1]}'s dense {'bf16' if dtype == 'bfloat16' else 'fp16'} peak, "
              f"{device_peak[0] / 1e12:g} TFLOPS")
    print(f"{'loss':<8} {'micro-batch':>11} {'ms/iter':>9} {'tokens/s':>10} {'MFU':>7} {'peak GiB':>9}"
          f"{' largest micro-batch' if find_batch_size else ''}")
    for name, figures in results.items():
        if figures['oom']:
            line = f"{name:<8} {batch_size:>11} {'out of GPU memory':>45}"
        else:
            mfu = f"{figures['mfu'] * 100:.2f}%" if figures['mfu'] is not None else 'n/a'
            peak = f"{figures['peak GiB']:.2f}" if 'peak GiB' in figures else 'n/a'
            line = (f"{name:<8} {batch_size:>11} {figures['ms']:>9.2f} {figures['tokens/s']:>10,.0f} {mfu:>7} "
                    f"{peak:>9}")
        print(line + (f" {figures['largest']:>19}" if find_batch_size else ''))


def matmuls_alone(h, w, rows):
    """The three N x d x V matmuls of chunked_cross_entropy over its chunks of `rows`, and nothing else: logits
    W @ h_chunk.T, then with those in place of the logits' gradient, g.T @ W and W's gradient += g @ h_chunk. No exact
    method does less matmul work (the naive path does the same three at full size), so their time is this machine's
    floor for the loss path: what the chunked path spends beyond it is its softmax and bookkeeping."""
    with torch.no_grad():
        chunk = torch.empty(w.shape[0], min(rows, h.shape[0]), device=h.device, dtype=h.dtype)
        grad_hidden, grad_weight = torch.empty_like(h), torch.zeros_like(w)
        for start in range(0, h.shape[0], rows):
            h_chunk = h[start:start + rows]
            logits = chunk[:, :h_chunk.shape[0]]
            torch.mm(w, h_chunk.t(), out=logits)
            torch.mm(logits.t(), w, out=grad_hidden[start:start + rows])
            grad_weight.addmm_(logits, h_chunk)


MATMUL_OPS = ('aten::mm', 'aten::addmm', 'aten::addmm_') # where F.linear, @ and their backward spend their time


def matmul_split(forward_backward):
    """(matmul seconds, other seconds) of one call of forward_backward: the matmuls' self time in torch.profiler
    (their kernels' time on CUDA), the rest of the wall time being the method's own work."""
    with torch.profiler.profile(activities=profiler_activities()) as prof:
        t0 = time.perf_counter()
        forward_backward()
        wall = time.perf_counter() - t0
    self_time = 'self_device_time_total' if device_type == 'cuda' else 'self_cpu_time_total'
    matmul = sum(getattr(e, self_time) for e in prof.key_averages() if e.key in MATMUL_OPS) / 1e6
    return matmul, wall - matmul


def optional_import(package, module, name):
    """`name` from `module` of an optional package, or None with a line saying why it is left out."""
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as e: # not installed, or installed but broken (a Triton mismatch): the other methods still run
        missing = isinstance(e, ModuleNotFoundError) and e.name == module.split('.')[0]
        print(f"{package}: skipped: {f'not installed (pip install {package})' if missing else first_line(e)}")
        return None


def fused_kernel_libraries():
    """Liger-Kernel's fused linear cross-entropy and Apple's Cut Cross-Entropy, optional and CUDA only (Triton
    kernels, timed as they are, not compiled): name -> loss(h, w, t) of those installed."""
    if device_type != 'cuda':
        print('liger-kernel, cut-cross-entropy: skipped: CUDA only')
        return {}
    libraries = {}
    liger_loss = optional_import('liger-kernel', 'liger_kernel.transformers', 'LigerFusedLinearCrossEntropyLoss')
    if liger_loss is not None:
        liger = liger_loss(ignore_index=-1)
        libraries['liger-kernel fused linear CE'] = lambda h, w, t: liger(w, h, t) # the weight comes first
    cce = optional_import('cut-cross-entropy', 'cut_cross_entropy', 'linear_cross_entropy')
    if cce is not None:
        libraries['cut-cross-entropy (cce)'] = lambda h, w, t: cce(h, w, t, ignore_index=-1, impl='cce')
        # its default skips gradient entries below a threshold; filter_eps=None computes them all, as the others do
        libraries['cut-cross-entropy, filter_eps=None'] = lambda h, w, t: cce(h, w, t, ignore_index=-1, impl='cce',
                                                                              filter_eps=None)
    return libraries


def loss_methods():
    """name -> loss(h, w, t) of each method timed in loss mode: naive, chunked, torch's; each compiled as well with
    compile=True (the chunked loss compiled runs each chunk's softmax as fused kernels); then the fused-kernel
    libraries."""
    losses = {'naive F.cross_entropy(F.linear)': LOSSES['naive']}
    for chunk in chunk_sizes:
        name = f'chunked_cross_entropy, {chunk} rows' if chunk else f'chunked_cross_entropy, {loss_chunk_mib} MiB'
        losses[name] = lambda h, w, t, chunk=chunk: chunked_cross_entropy(h, w, t, chunk_size=chunk or None,
                                                                          chunk_bytes=loss_chunk_mib * 2 ** 20)
    if LOSSES['torch'] is not None:
        losses['torch F.linear_cross_entropy'] = LOSSES['torch']
    else:
        print(f'torch {torch.__version__} has no F.linear_cross_entropy: skipped')
    methods = {}
    for name, loss_fn in losses.items():
        methods[name] = loss_fn
        if compile: # next to its eager self, so that each round times the two at about the same machine moment
            methods[f'{name}, compiled'] = torch.compile(loss_fn)
    return {**methods, **fused_kernel_libraries()}


def bench_loss():
    def backward_of(loss_fn):
        return lambda h, w, t: loss_fn(h, w, t).backward()

    methods = {name: backward_of(loss_fn) for name, loss_fn in loss_methods().items()}
    methods[f'floor: 3 matmuls alone, {loss_chunk_mib} MiB chunks'] = lambda h, w, t: matmuls_alone(
        h, w, chunk_rows(h.shape[0], w.shape[0], w.shape[1], h.dtype, loss_chunk_mib * 2 ** 20))
    compiled = [name for name in methods if name.endswith(', compiled')]
    libraries = [name for name in methods if name.startswith(('liger', 'cut-cross'))]

    def forward_backward(run, h, w, t):
        run(h, w, t)
        h.grad = w.grad = None # free the gradients before the next run
        synchronize()

    def timed(run, h, w, t):
        t0 = time.perf_counter()
        forward_backward(run, h, w, t)
        return time.perf_counter() - t0

    def peak_bytes(name, run, h, w, t):
        """Memory allocated beyond the inputs during one forward+backward, gradients included; None where not
        measured: compiled code on the CPU allocates out of the tracer's sight."""
        if device_type == 'cuda':
            baseline = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            forward_backward(run, h, w, t)
            return torch.cuda.max_memory_allocated(device) - baseline
        if name in compiled:
            return None
        with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker: # the CPU has no allocator statistics
            forward_backward(run, h, w, t)
        return tracker.peak

    print(f'loss path forward+backward, d={n_embd}, V={vocab_size}, {dtype}, {device}, '
          f'{torch.get_num_threads()} threads, median of {loss_runs} runs after a first call')
    # peak: all memory the loss path allocates, its gradients (N x d and V x d) included; beyond grads: the rest,
    # the temporaries that an implementation can save (the gradients themselves are needed by any)
    # best: the fastest run of each, vs the naive path's fastest; on a shared machine, the least disturbed figure
    # vs eager: the median over the rounds of a compiled method's time against its eager time in the same round;
    # compile: its first call's time beyond its median
    print(f"{'N':>6}  {'method':<44} {'time':>9} {'vs naive':>8} {'best':>6} {'vs eager':>8} {'compile':>8} "
          f"{'peak MiB':>9} {'beyond grads':>12}")
    for n in rows_list:
        h = torch.randn(n, n_embd, device=device, dtype=ptdtype, requires_grad=True) # the same inputs for all
        w = (torch.randn(vocab_size, n_embd, device=device, dtype=ptdtype) * 0.02).requires_grad_()
        t = torch.randint(vocab_size, (n,), device=device)
        first_call = {}
        for name, run in list(methods.items()): # compiles the compiled methods, warms up the others
            try:
                first_call[name] = timed(run, h, w, t)
            except Exception as e: # an optional library's failure leaves the rest to run
                if name not in libraries:
                    raise
                print(f'{name}: skipped: {first_line(e)}')
                del methods[name]
        peaks = {name: peak_bytes(name, run, h, w, t) for name, run in methods.items()} # untimed: the tracer is slow
        times = {name: [] for name in methods}
        for _ in range(loss_runs): # methods interleave so machine noise hits each alike
            for name, run in methods.items():
                times[name].append(timed(run, h, w, t))
        naive_times = next(iter(times.values()))
        naive_time, naive_best = statistics.median(naive_times), min(naive_times)
        grad_mib = (h.numel() + w.numel()) * h.element_size() / 2**20
        for name in methods:
            median = statistics.median(times[name])
            vs_eager = compile_s = '-'
            if name in compiled:
                eager_times = times[name.removesuffix(', compiled')]
                vs_eager = f'{statistics.median(c / e for c, e in zip(times[name], eager_times)):.2f}x'
                compile_s = f'{first_call[name] - median:.1f}s'
            peak = beyond = 'n/a'
            if peaks[name] is not None:
                peak, beyond = f'{peaks[name] / 2**20:.1f}', f'{peaks[name] / 2**20 - grad_mib:.1f}'
            print(f'{n:>6}  {name:<44} {median:>8.3f}s {median / naive_time:>7.2f}x '
                  f'{min(times[name]) / naive_best:>5.2f}x {vs_eager:>8} {compile_s:>8} {peak:>9} {beyond:>12}')
        if profile: # the same machine moment for both parts of a run, so their ratio is steadier than the times
            for name, run in methods.items():
                matmul, rest = matmul_split(lambda: forward_backward(run, h, w, t))
                print(f'{n:>6}  {name:<44} profiled: matmuls {matmul:.3f}s, the rest {rest:.3f}s '
                      f'({rest / (matmul + rest):.1%})')


def bench_sample():
    """The model's generate (model_file's: GPT's or GPT2026's) from a one-token prompt with its KV cache, and as
    nanoGPT's (use_cache=False: the whole sequence runs again for each token), each after the same seed: their times,
    the speed-up, and whether the tokens agree."""
    model = build_model({**config, **SCRATCH}, model_args()).to(device).eval()
    prompt = torch.zeros((1, 1), dtype=torch.long, device=device)
    crop = context_limit(model) # gpt2026.py's model has none: its windows bound the context
    print(f"generate: {max_new_tokens} new tokens after a 1-token prompt, {model_file}, "
          f"{f'block_size {crop}, ' if crop else ''}{n_layer} layers, n_embd {n_embd}, {dtype}, {device}, "
          f"{torch.get_num_threads()} threads")
    runs = {}
    with torch.no_grad(), ctx:
        model.generate(prompt, 2) # warm-up: the first call's one-time costs (kernels, allocator) out of the timing
        # nanoGPT's generate runs the whole sequence for each new token: its forwards grow from 1 token to the final
        # length, so its time grows with the square of max_new_tokens. Said before it starts, from the two ends.
        def forward_seconds(length):
            synchronize()
            t0 = time.perf_counter()
            model(torch.zeros((1, length), dtype=torch.long, device=device))
            synchronize()
            return time.perf_counter() - t0
        longest = min(max_new_tokens, crop or max_new_tokens)
        expected = max_new_tokens * (forward_seconds(1) + forward_seconds(longest)) / 2
        print(f'nanoGPT generate will take about {expected:.0f}s here; --max_new_tokens sets the length (its time '
              f'grows with the square of it)', flush=True)
        for name, use_cache in (('nanoGPT generate', False), ('KV cache', True)):
            print(f'{name}...', flush=True)
            torch.manual_seed(seed)
            synchronize()
            t0 = time.perf_counter()
            tokens = model.generate(prompt, max_new_tokens, use_cache=use_cache)
            synchronize()
            runs[name] = (tokens, time.perf_counter() - t0)
            print(f'{name:<16} {runs[name][1]:9.2f}s {max_new_tokens / runs[name][1]:9.1f} tokens/s')
    (uncached, uncached_s), (cached, cached_s) = runs.values()
    print(f'speed-up: {uncached_s / cached_s:.1f}x, same tokens: {torch.equal(uncached, cached)}')


def bench_card():
    """training/card.py's measurements of this device with the presets, added to card_report as each part ends."""
    names = [name for name in card_presets.split(',') if name]
    result = card.run(device, device_type, names, steps=card_steps, seconds=card_seconds,
                      part_seconds=card_preset_seconds, report=card_report,
                      progress=lambda line: print(line, flush=True))
    print(card_markdown(result))
    print(f"wrote {card_report}.md and {card_report}.json ({result['runs'][-1]['seconds']:.0f} s; measured: "
          f"{', '.join(result['runs'][-1]['measured']) or 'nothing, the report was complete'})")


if mode == 'train' and count_ops:
    bench_count_ops()
elif mode == 'train':
    bench_train()
elif mode == 'loss':
    bench_loss()
elif mode == 'card':
    bench_card()
else:
    bench_sample()
