"""
This training script can be run both on a single gpu in debug mode,
and also in a larger training run with distributed data parallel (ddp).

To run on a single GPU, example:
$ python train.py --batch_size=32 --compile=False

To run with DDP on 4 gpus on 1 node, example:
$ torchrun --standalone --nproc_per_node=4 train.py

To run with DDP on 4 gpus across 2 nodes, example:
- Run on the first (master) node with example IP 123.456.123.456:
$ torchrun --nproc_per_node=8 --nnodes=2 --node_rank=0 --master_addr=123.456.123.456 --master_port=1234 train.py
- Run on the worker node:
$ torchrun --nproc_per_node=8 --nnodes=2 --node_rank=1 --master_addr=123.456.123.456 --master_port=1234 train.py
(If your cluster does not have Infiniband interconnect prepend NCCL_IB_DISABLE=1)

Two processes on CPU (gloo): torchrun --standalone --nproc_per_node=2 train.py ... --device=cpu

nanoGPT's train.py, with its keys, log lines and ckpt.pt (README.md lists the differences). Two that shape the code:
batches are a function of (seed, iteration, global micro-step), where rank r of world W at micro-step m reads
global micro-step m*W + r, so the data depends neither on the world size nor on restarts; and the logged `iter` loss
is the mean over all micro-batches of all ranks (nanoGPT: the master's last micro-batch). The support code (checks,
checkpoints, optimizers, parallelism, memory) lives in training/, one concern a module.
"""

import os
from training.allocator import use_train_allocator
use_train_allocator() # expandable segments, set before torch is imported (the allocator reads them as CUDA starts)
import gc
import itertools
import sys
import time
import math
import datetime
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group

from training import configurator
from training import rules
from training.checkpoint import (PREVIOUS_NAME, checkpoint_path, load_checkpoint, pending_gradients,
                                 restore_pending_gradients, restore_training_state, save_checkpoint, saved_iteration)
from training.data import check_tokens, get_encoding, sequential_offsets
from training.device import (TORCH_DTYPES, cap_memory, check_device, default_backend, default_compile,
                             default_device, default_dtype, peak_flops)
from training.errors import INTERRUPTED_STATUS, fail, first_line, install_handler, on_error
from training.hellaswag import cached_val_file, context_limit, evaluate, read_examples, report_cut_contexts
from training.memory.advice import cuda_memory_stats, oom_advice
from training.memory.floor import check_floor, training_floor
from training.paths import check_writable_dir
from training.parallel import collective_failure, exit_with_launcher, full_state_dicts, set_gradient_sync
from training.phase_log import PhaseLog
from training.runs import has_activation_checkpointing, make_run
from training.step import Prefetcher, build, train_step

install_handler() # bad input, found anywhere below, ends the run with one line and exit status 2 (training/errors.py)
if int(os.environ.get('RANK', 0)) != 0:
    sys.stdout = open(os.devnull, 'w') # under torchrun rank 0 prints for all: the same config, model and log lines

# -----------------------------------------------------------------------------
# default config values designed to train a gpt2 (124M) on OpenWebText
# (what a key does: its comment, or the `#:` line above a line kept as nanoGPT wrote it; training/configurator.py
# reads them)
# I/O
#: ckpt.pt is written here, and read from here with init_from='resume'
out_dir = 'out'
#: evaluate the train and val loss (and save a checkpoint) every this many iterations
eval_interval = 2000
#: print the loss every this many iterations
log_interval = 1
#: micro-batches averaged for each split's loss at an evaluation
eval_iters = 200
eval_only = False # if True, script exits right after the first eval
always_save_checkpoint = True # if True, always save a checkpoint after each eval
#: the weights to start from; resume also restores out_dir's optimizer state and iteration number
init_from = 'scratch' # 'scratch' or 'resume' or 'gpt2*'
seed = 1337 # initial weights from seed, rank r's dropout from seed + r; batches from (seed, iteration, micro-step)
# wandb logging
#: log losses, learning rates, speed and memory to Weights & Biases (docs/wandb.md; pip install wandb)
wandb_log = False # disabled by default
#: the wandb project the run is logged to
wandb_project = 'owt'
#: the run's name in wandb
wandb_run_name = 'gpt2' # 'run' + str(time.time())
# data
data_dir = 'data' # the dataset is read from data_dir/dataset/: train.bin, val.bin, optional meta.pkl
#: the directory under data_dir, prepared by prepare/<dataset>.py
dataset = 'openwebtext'
gradient_accumulation_steps = 5 * 8 # used to simulate larger batch sizes
batch_size = 12 # if gradient_accumulation_steps > 1, this is the micro-batch size
#: context length in tokens: each sample is this many tokens
block_size = 1024
batch_order = 'random' # 'random' windows of train.bin, or 'sequential': consecutive windows, each token once a pass
eval_batch_size = 0 # estimate_loss's micro-batch (same windows, same loss), 0 = batch_size; no backward: larger fits
hellaswag = False # also score HellaSwag at each evaluation (GPT-2 tokens; its data: data_dir/hellaswag/)
hellaswag_examples = 0 # with hellaswag: the first N validation examples, 0 = all 10,042
# model
model_file = 'model.py' # model.py's GPT (nanoGPT's, with the keys below), or gpt2026.py's GPT2026 trained as the
                        # 24 Jan 2026 record (its optimizer and schedules: training/record2026.py; docs/record_2026.md)
#: transformer blocks
n_layer = 12
#: attention heads per block; n_embd must be divisible by it
n_head = 12
#: width of the residual stream
n_embd = 768
dropout = 0.0 # for pretraining 0 is good, for finetuning try 0.1+
bias = False # do we use bias inside LayerNorm and Linear layers?
# modern architecture (modded-nanogpt's; docs/modern_recipe.md): GPT-2's by default, recorded in model_args when changed
pos_emb = 'learned' # how attention sees positions: GPT-2's learned wpe table, or rope's rotary embeddings (no wpe)
norm = 'layernorm' # the normalization at each block's attention and MLP inputs and after the last block
qk_norm = False # RMSNorm each head's queries and keys before attention
mlp = 'gelu' # the MLP's activation (relu2: ReLU squared)
tie_weights = True # False: an untied lm_head, its own matrix
zero_init_proj = False # start the blocks' output projections (and an untied lm_head) at zero
logit_softcap = 0.0 # > 0: logits capped to logit_softcap * tanh(logits / logit_softcap), e.g. 15; 0 = off
value_embeds = 0 # k > 0: k value-embedding tables, each shared by a block of the first k and its mirror in the last k
unet_skips = False # add the first n_layer // 2 blocks' outputs to the mirrored later blocks' inputs, learned weights
x0_shortcut = False # mix the embedding into every block's input, learned weights
embed_norm = False # RMS-norm the token embedding (no gain) before block 0; x0_shortcut's x0 is the normed one
norm_gain = True # False: ln_1, ln_2 and ln_f without weights (nor biases), torch's default eps, as modded-nanogpt
value_residual = False # mix block 0's values into every block's values, a learned weight per block
value_scale = False # blocks without a value_embeds table scale their values by a learned weight (from 0.5)
no_attn_layer = -1 # >= 0: the block of this index has no attention, only its MLP (modded-nanogpt's 4 Jan 2025: 7)
rope_truncated = False # pos_emb='rope': half of each head's pairs turn, from 1 to 1/1024 rad a position; half not
weight_init = 'gpt2' # 'gpt2': N(0, 0.02), c_proj scaled down; 'pytorch': torch's defaults (embedding N(0, 1))
attn_window = 0 # > 0: each position attends to at most this many positions up to itself (sliding window); 0 = all
attn_window_warmup_iters = 0 # > 0: the window grows from attn_window_warmup_start to attn_window over these iters
attn_window_warmup_start = 64 # the window's first size, and its step as it grows (modded-nanogpt: 64 up to 1,792)
attn_window_warmup_end = 0 # the window the warmup's line aims at (0: attn_window), capped at attn_window
attn_window_block = 0 # > 0: the window in whole blocks of this many positions, FlexAttention's block masks (128)
attention_kernel = 'auto' # how windows in blocks run: 'flex' (FlexAttention, CUDA only), 'masked' (SDPA under a mask),
                          # or 'auto': flex on CUDA where its kernels compile, else masked (docs/record.md)
doc_token = -1 # >= 0: a document starts at each of these tokens (GPT-2's <|endoftext|>: 50256); attention stays in one
activation_checkpointing = False # recompute each block in backward: much less activation memory, one more forward
autocast_cache = False # keep autocast's low-precision copy of every weight through each forward (torch's default)
loss_chunk_mib = 1024 # MiB one chunk of the loss may take (logits, softmax buffers): fewer chunks launch fewer
                      # kernels; a rows' loss that fits it whole runs as nanoGPT's (docs/loss.md)
auto_batch_size = False # on CUDA, estimate_memory.py picks batch_size and gradient_accumulation_steps for the card
gpu_headroom_gb = 0.5 # GiB of the card the estimate leaves to other programs (a desktop, a browser: a few 100 MiB)
# adamw optimizer
learning_rate = 6e-4 # max learning rate
max_iters = 600000 # total number of training iterations
#: AdamW's weight decay, on the 2-D parameters (matrices, embeddings); biases and LayerNorms get none
weight_decay = 1e-1
#: AdamW's first-moment decay
beta1 = 0.9
#: AdamW's second-moment decay
beta2 = 0.95
grad_clip = 1.0 # clip gradients at this value, or disable if == 0.0
optim = 'adamw' # the optimizer (docs/optimizers.md): AdamW with fp32, bf16 or torchao's 8-bit moments, or Muon
muon_learning_rate = 0.02 # optim='muon': max lr of the blocks' matrices (Keller Jordan's Muon; nanochat's matrix_lr)
muon_momentum = 0.95 # optim='muon': Muon's Nesterov momentum (Keller Jordan's, and torch.optim.Muon's default)
muon_momentum_warmup_iters = 0 # optim='muon': momentum from 0.85 up to muon_momentum over these iters (nanochat: 300)
embedding_learning_rate = 0.0 # optim='muon': max lr of the embeddings (AdamW; tied, the head too), 0 = learning_rate
head_learning_rate = 0.0 # optim='muon', tie_weights=False: max lr of the untied lm_head (AdamW), 0 = learning_rate
scalar_learning_rate = 0.0 # optim='muon': max lr of the mixing weights (skip, x0, value; AdamW), 0 = learning_rate
muon_split_qkv = False # optim='muon': orthogonalize c_attn's q, k and v rows each on its own (modded-nanogpt's)
muon_momentum_form = 'ema' # optim='muon': 'ema' (torch's Muon: an average), 'sum' or 'ema_eps' (modded-nanogpt's)
optimizer_in_backward = False # update each parameter in backward and free its gradient: needs accumulation 1, no clip
weight_dtype = 'float32' # the weights' and gradients' dtype; in bfloat16 there is no fp32 copy, and updates are
                         # rounded stochastically (docs/optimizers.md)
# learning rate decay settings
decay_lr = True # whether to decay the learning rate
lr_schedule = 'cosine' # the decay after warmup: nanoGPT's cosine, or wsd: stable at learning_rate, linear at the end
cooldown_frac = 0.2 # lr_schedule='wsd': the last fraction of lr_decay_iters over which the lr decays to min_lr
warmup_iters = 2000 # how many steps to warm up for
lr_decay_iters = 600000 # should be ~= max_iters per Chinchilla
min_lr = 6e-5 # minimum learning rate, should be ~= learning_rate/10 per Chinchilla
# DDP settings
backend = default_backend() # torch.distributed's, under torchrun: nccl where there is a GPU, else gloo
parallelism = 'ddp' # under torchrun, what each process keeps (docs/parallel.md): ddp all of the training state, zero1
                    # a shard of the optimizer's state, fsdp a shard of all of it
fsdp_mixed_precision = False # fsdp: gather weights in dtype (bf16/fp16), half the traffic and gathered memory
timeout = 600 # seconds a process waits for the others in a collective before it stops with an error
# system
device = default_device() # 'cuda' if there is a GPU, else 'cpu'; examples: 'cpu', 'cuda', 'cuda:0', 'cuda:1' or 'mps'
dtype = default_dtype(device) # autocast's: bfloat16 on GPUs that have it, float16 on older ones (with a GradScaler),
                              # float32 off CUDA
compile = default_compile(device) # use PyTorch 2.0 to compile the model to be faster (Triton kernels: CUDA only)
memory_cap_gb = 0.0 # CUDA: hold this process to this many GiB, as a card of that size would (its caching allocator's
                    # limit); bench.py --mode=card runs each preset so on the card it names; 0 = no cap
phase_log = '' # append a JSON line to this file as each phase begins (build, resume, evaluation, checkpoint, step,
               # done), with its time and peak memory (training/phase_log.py; bench.py --mode=card reads it); '' = none
# -----------------------------------------------------------------------------
keys = configurator.read_keys(__file__) # the keys above as configurator reads them (it runs none of them)
config_keys = list(keys) # not every int or str of globals(): an imported constant is no key
# overrides from command line or config file
globals().update(configurator.load_config(keys, sys.argv[1:], rules.CHOICES))
config = {k: globals()[k] for k in config_keys} # will be useful for logging
# -----------------------------------------------------------------------------

# various inits, derived attributes, I/O setup
ddp = int(os.environ.get('RANK', -1)) != -1 # is this a ddp run?
if ddp:
    ddp_rank = int(os.environ['RANK'])
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    ddp_world_size = int(os.environ['WORLD_SIZE'])
    master_process = ddp_rank == 0 # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank # each process gets a different seed
else:
    # if not ddp, we are running on a single gpu, and one process
    master_process = True
    seed_offset = 0
    ddp_world_size = 1
    ddp_rank = 0 # the batches and the evaluation's shares are numbered by rank
# everything is checked before anything is created or written: bad input fails here, with one line
device_type = check_device(device, dtype)
rules.check_config(config, ddp_world_size, device_type)
check_writable_dir(out_dir)
rules.check_dataset(config)
meta_vocab_size = rules.meta_vocab_size(config)
if meta_vocab_size is not None:
    print(f"found vocab_size = {meta_vocab_size} (inside {os.path.join(rules.dataset_path(config), 'meta.pkl')})")
if wandb_log and master_process:
    try:
        import wandb # imported only when asked for; WANDB_MODE=offline or disabled needs no network
    except ImportError:
        fail('wandb_log=True but wandb is not installed: pip install wandb, or pass --wandb_log=False')
data_path = rules.dataset_path(config)

if ddp and device_type == 'cuda':
    device = f'cuda:{ddp_local_rank}'
    torch.cuda.set_device(device)
if memory_cap_gb: # before anything is allocated, so that nothing is ever reserved beyond it
    cap_memory(device, memory_cap_gb)
phases = PhaseLog(phase_log if master_process else '', device if device_type == 'cuda' else None)
if auto_batch_size: # the largest micro-batch that estimate_memory.py finds to fit this card, same tokens per step
    from training.memory.fit import pick_batch_size # before the process group: its trace makes one of its own
    batch_size, gradient_accumulation_steps = pick_batch_size(dict(config, world_size=ddp_world_size),
                                                              torch.cuda.mem_get_info(device)[0])
memory_estimate = None # estimate_memory.py's estimate of the GPU memory, for wandb's run config; none off CUDA
if wandb_log and master_process and device_type == 'cuda':
    # costs a trace on the CPU before training starts (docs/wandb.md: how long); before the process group, as the
    # trace makes a fake one of its own
    from training.memory.fit import run_summary
    memory_estimate = run_summary(dict(config, batch_size=batch_size, world_size=ddp_world_size,
                                       gradient_accumulation_steps=gradient_accumulation_steps),
                                  torch.cuda.get_device_properties(device).total_memory)
if ddp: # before the model: zero1's optimizer and fsdp's sharding need the process group
    init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout))
    exit_with_launcher() # should torchrun itself be killed, its workers must not train on
    on_error(RuntimeError, lambda e: collective_failure(e, timeout)) # another process stopped answering: one line
if auto_batch_size:
    if ddp: # the ranks' free memory can differ a little: all take the master's choice
        choice = [batch_size, gradient_accumulation_steps]
        dist.broadcast_object_list(choice, src=0)
        batch_size, gradient_accumulation_steps = choice
    config.update(batch_size=batch_size, gradient_accumulation_steps=gradient_accumulation_steps)
    print(f'auto_batch_size: batch_size = {batch_size}, gradient_accumulation_steps = {gradient_accumulation_steps}')
# world_size number of processes will be training simultaneously, so we can scale
# down the desired gradient accumulation iterations per process proportionally
gradient_accumulation_steps //= ddp_world_size
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")

torch.manual_seed(seed) # the same initial weights on every rank: fsdp keeps each rank's own shard of them
torch.backends.cuda.matmul.allow_tf32 = True # allow tf32 on matmul
torch.backends.cudnn.allow_tf32 = True # allow tf32 on cudnn
# note: float16 data type will automatically use a GradScaler
ptdtype = TORCH_DTYPES[dtype]
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=ptdtype,
                                                                  cache_enabled=autocast_cache)

# poor man's data loader
def get_batch(split, key, rows, rows_before=None):
    """`rows` random windows of split.bin and their next-token targets; the offsets come from a generator seeded by
    `key` alone, so a batch never depends on the world size, the rank or a restart. rows_before: consecutive windows
    instead, after that many (batch_order='sequential')."""
    # We recreate np.memmap every batch to avoid a memory leak, as per
    # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
    data = np.memmap(os.path.join(data_path, f'{split}.bin'), dtype=np.uint16, mode='r')
    if documents is not None: # gpt2026.py's rows, each from a document's start (training/documents.py)
        tokens = torch.from_numpy(documents.rows(data, key, rows, rows_before))
        return on_device(tokens[:, :-1], tokens[:, 1:], data)
    if rows_before is not None:
        return windows(data, sequential_offsets(len(data), block_size, rows_before, rows))
    return windows(data, np.random.default_rng(key).integers(len(data) - block_size, size=rows))

def windows(data, ix):
    """The block_size windows of `data` at offsets ix and their next-token targets, on the device."""
    x = torch.stack([torch.from_numpy((data[i:i+block_size]).astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy((data[i+1:i+1+block_size]).astype(np.int64)) for i in ix])
    return on_device(x, y, data)

def on_device(x, y, data):
    check_tokens(data.filename, model_args['vocab_size'], x, y) # on the CPU: a GPU would stop at a device-side assert
    if device_type == 'cuda':
        # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y

def train_batches(first_iter):
    """This rank's micro-batches from iteration first_iter on, in order: micro-step m of iteration `it` is global
    micro-step m * world + rank (batch_order='sequential': the rows after all earlier global micro-steps' rows)."""
    micro_steps_before = sum(map(run.micro_steps, range(first_iter))) # all ranks', of the iterations before
    for it in itertools.count(first_iter):
        for micro_step in range(run.micro_steps(it) // ddp_world_size):
            micro = micro_step * ddp_world_size + ddp_rank
            rows_before = (micro_steps_before + micro) * batch_size
            yield get_batch('train', (seed, 0, it, micro), batch_size,
                            rows_before if batch_order == 'sequential' else None)
        micro_steps_before += run.micro_steps(it)

# init these up here, can override if init_from='resume' (i.e. from a checkpoint)
iter_num = 0
best_val_loss = 1e9
# model init: model_args first, so they are checked before any weights are built, loaded or downloaded
checkpoint = None
phases.enter('resume' if init_from == 'resume' else 'build')
if init_from == 'scratch':
    print("Initializing a new model from scratch")
    if meta_vocab_size is None:
        print("defaulting to vocab_size of GPT-2 to 50304 (50257 rounded up for efficiency)")
elif init_from == 'resume':
    print(f"Resuming training from {out_dir}")
    # on the CPU: the GPU never holds the checkpoint beside the model and optimizer state it is loaded into
    checkpoint = load_checkpoint(out_dir, 'cpu', required=('optimizer', 'iter_num', 'best_val_loss'))
    iter_num = checkpoint['iter_num']
    best_val_loss = float(checkpoint['best_val_loss']) # nanoGPT saved a tensor
else:
    print(f"Initializing from GPT-2 weights: {init_from}")
# another run's ckpt.pt in out_dir, which this run's first save replaces (nanoGPT's): kept as ckpt.prev.pt, so that a
# run started without --init_from=resume loses nothing
keep_other_run = init_from != 'resume' and not eval_only and master_process and os.path.exists(checkpoint_path(out_dir))
if keep_other_run:
    other_iter = saved_iteration(out_dir)
    print(f"{checkpoint_path(out_dir)} holds another run{'' if other_iter is None else f' (iteration {other_iter})'}: "
          f"this run's first checkpoint keeps it as {PREVIOUS_NAME}; --init_from=resume would continue it")
# the shape is the checkpoint's or OpenAI's, only dropout as configured; block_size and meta.pkl must fit it
model_args, _ = rules.model_args(config, meta_vocab_size, checkpoint and checkpoint['model_args'])
check_floor(training_floor(config, model_args), device, f'lower batch_size ({batch_size}), block_size, n_layer or '
            f'n_embd; estimate_memory.py estimates a config') # sizes that cannot fit: one line, nothing allocated
if hellaswag: # its data and tokenizer before the weights: a missing file fails early; the master downloads, once
    hellaswag_dir = os.path.join(data_dir, 'hellaswag')
    if master_process:
        cached_val_file(hellaswag_dir)
    if ddp:
        dist.barrier()
    hellaswag_set = read_examples(cached_val_file(hellaswag_dir), hellaswag_examples)
    enc = get_encoding('gpt2')

# the model and its optimizer (training/step.py): the one build that the memory estimator and the benchmarks run too
model, optimizer = build(config, model_args, device, device_type, checkpoint, sharded=ddp)
torch.manual_seed(seed + seed_offset) # then each rank its own dropout
raw_model = model # the plain (or fully_shard-ed) module: saved, and asked for MFU, without DDP's and compile's wrappers
if hellaswag and master_process: # once a run, not at each evaluation
    report_cut_contexts(hellaswag_set, enc, context_limit(raw_model))
# the model file's iteration: its schedules, forward's arguments and micro-steps (training/runs.py)
run = make_run(config, raw_model, optimizer)
# gpt2026.py's training rows start at documents (training/documents.py); model.py's are windows (None)
documents = run.document_rows(os.path.join(data_path, 'train.bin'), block_size)

# initialize a GradScaler. If enabled=False scaler is a no-op
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == 'float16'))
if init_from == 'resume':
    # the optimizer's state, the GradScaler's and each rank's RNG: what an exact resume needs beyond the weights
    restore_training_state(checkpoint, optimizer, scaler, config, ddp_rank, ddp_world_size, device)
    restore_pending_gradients(raw_model, checkpoint, master_process)
checkpoint = None # free up memory

def interrupted(e):
    """Ctrl-C: one line saying what the last checkpoint holds and how to go on, and the shell's status 130, from rank
    0 alone (Ctrl-C reaches every rank). Nothing is lost: save_checkpoint replaces ckpt.pt whole, so a save that
    Ctrl-C cut short leaves the last one as it was."""
    saved_iter = saved_iteration(out_dir) if master_process else None
    if saved_iter is None:
        held = f'no checkpoint written yet (one is saved at each eval_interval={eval_interval} iterations)'
    else:
        held = f'{checkpoint_path(out_dir)} holds iter {saved_iter}: go on with --init_from=resume'
    return f'interrupted at iter {iter_num}: {held}', dict(status=INTERRUPTED_STATUS, every_rank_has_it=True)
on_error(KeyboardInterrupt, interrupted)

# compile the model
if compile:
    print("compiling the model... (takes a ~minute)")
    # each window size (model.py's warmup) or stage of gpt2026.py's run may compile the model anew: run's count
    dynamo = torch._dynamo.config # cache_size_limit: every torch from 2.4 has it (newer: recompile_limit's alias)
    dynamo.cache_size_limit = max(dynamo.cache_size_limit, run.compiled_variants())
    model = torch.compile(model) # requires PyTorch 2.0

# wrap model into DDP container (fsdp's sharding is done: before the optimizer, which must see the shards); gpt2026.py's
# optimizer sums the gradients over the ranks itself, as the record's does
gradient_sync = ddp and not run.optimizer_sums_gradients
if gradient_sync and parallelism != 'fsdp':
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)

# helps estimate an arbitrarily accurate loss over either split using many batches: eval_iters x batch_size windows,
# as in nanoGPT (rounded up to a multiple of the world size), drawn as one set, split evenly over the ranks and run in
# micro-batches of eval_batch_size, which changes the memory, not the loss. Every rank gets the same result.
@torch.no_grad()
def estimate_loss(it):
    out = {}
    model.eval()
    rows = eval_batch_size or batch_size
    forward_args = run.forward_args(it, training=False) # the sliding window (or windows) the model trains with at `it`
    share = math.ceil(eval_iters * batch_size / ddp_world_size) # windows per rank: the same number on every rank,
    for split_index, split in enumerate(['train', 'val']):      # as fsdp's forward is a collective
        data = np.memmap(os.path.join(data_path, f'{split}.bin'), dtype=np.uint16, mode='r')
        offsets = np.random.default_rng((seed, 1 + split_index, it)).integers(len(data) - block_size,
                                                                               size=share * ddp_world_size)
        loss_sum = torch.zeros((), device=device)
        for start in range(ddp_rank * share, (ddp_rank + 1) * share, rows):
            X, Y = windows(data, offsets[start:min(start + rows, (ddp_rank + 1) * share)])
            with ctx:
                logits, loss = model(X, Y, **forward_args)
            loss_sum += loss.float() * len(X) # every window has block_size targets: weight by rows
        if ddp:
            dist.all_reduce(loss_sum)
        out[split] = loss_sum.item() / len(offsets)
    model.train()
    return out

def hellaswag_scores():
    """HellaSwag acc and acc_norm over all ranks' shares of the examples, each pass 4 rows an example: about the tokens
    of an estimate_loss micro-batch, so no more memory than that."""
    examples_per_pass = max(1, (eval_batch_size or batch_size) // 4)
    result = evaluate(raw_model, hellaswag_set, enc, device, ctx, examples_per_pass, ddp_rank, ddp_world_size)
    counts = torch.tensor([result['correct'], result['correct_norm'], result['n']], device=device)
    if ddp:
        dist.all_reduce(counts)
    correct, correct_norm, n = counts.tolist()
    return dict(acc=correct / n, acc_norm=correct_norm / n, n=n)

def rng_states_of_all_ranks():
    """Every rank's torch (and CUDA) RNG state, gathered for the master's checkpoint. All ranks must call it."""
    state = {'torch': torch.get_rng_state(),
             'cuda': torch.cuda.get_rng_state(device) if device_type == 'cuda' else None}
    if not ddp:
        return [state]
    states = [None] * ddp_world_size
    dist.all_gather_object(states, state)
    return states

def fail_not_finite(what, value):
    """Stop before a diverged model can be saved; the last good ckpt.pt stays as it is."""
    path = checkpoint_path(out_dir)
    kept = f'{path} keeps the last good state' if os.path.exists(path) else 'no checkpoint was written'
    fixes = [f'a lower --learning_rate (now {learning_rate:g})']
    if grad_clip == 0.0:
        fixes.append('--grad_clip=1.0')
    if dtype == 'float16':
        fixes.append('--dtype=bfloat16 on a GPU that has it (float16 overflows more easily)')
    fail(f"{what} is {value} at iter {iter_num}: stopping without saving, {kept}; try {' or '.join(fixes)}")

# MFU is measured against the peak of the device in use, where it is known (training/device.py)
device_peak = peak_flops(device)
if device_peak is not None:
    print(f"mfu: against the {device_peak[1]}'s dense {'bf16' if dtype == 'bfloat16' else 'fp16'} peak, "
          f"{device_peak[0] / 1e12:g} TFLOPS")

# logging
if wandb_log and master_process:
    try:
        wandb.init(project=wandb_project, name=wandb_run_name, config={**config, 'memory_estimate': memory_estimate})
    except Exception as e: # not logged in, no network: the same fixes
        fail(f'wandb could not start a run ({first_line(e)}): run `wandb login`, or set WANDB_MODE=offline, or pass '
             f'--wandb_log=False')

# training loop
batches = Prefetcher(train_batches(iter_num)) # fetch the very first batch
t0 = time.time()
t_start = t0 # for the ETA: the average time of this process's iterations so far, evaluations included
local_iter_num = 0 # number of iterations in the lifetime of this process
running_mfu = -1.0
if device_type == 'cuda':
    torch.cuda.reset_peak_memory_stats(device)
    fixed_memory = torch.cuda.memory_allocated(device) # weights (and resumed optimizer state): what the batch is not

def set_sync(last):
    """in DDP training we only need to sync gradients at the last micro step (fsdp: reduce-scatter them)"""
    set_gradient_sync(raw_model if parallelism == 'fsdp' else model, parallelism, last)

def oom_message(e):
    """An out-of-memory error ends the run with what ran out, at what micro-batch, and the next step to take."""
    stats = cuda_memory_stats(device, memory_cap_gb) if device_type == 'cuda' else None
    phase, rows = ('training', batch_size) if raw_model.training else ('evaluation', eval_batch_size or batch_size)
    advice = oom_advice(phase, rows, gradient_accumulation_steps * ddp_world_size, ddp_world_size,
                        activation_checkpointing, stats, fixed_memory if stats else 0, optimizer_in_backward,
                        checkpointing_possible=has_activation_checkpointing(config), parallelism=parallelism)
    return advice, dict(every_rank=True)
on_error(torch.OutOfMemoryError, oom_message)

while True:

    # determine and set the learning rate for this iteration, and what else the model file's run schedules
    lr = run.start_step(iter_num) # model.py's: lr_schedule's, the sliding window; gpt2026.py's: the record's

    # evaluate the loss on train/val sets and write checkpoints
    if iter_num % eval_interval == 0 or eval_only:
        phases.enter('evaluation', iter_num)
        rng_states = rng_states_of_all_ranks() # collectives from here on: every rank takes part, the master saves
        losses = estimate_loss(iter_num) # the same on every rank, so every rank takes the same decisions below
        for split, value in losses.items():
            if not math.isfinite(value):
                fail_not_finite(f'the {split} loss', value)
        scores = hellaswag_scores() if hellaswag else {}
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if scores: # a line of its own: scripts parse the step line as nanoGPT prints it
            print(f"hellaswag {iter_num}: acc {scores['acc']:.4f}, acc_norm {scores['acc_norm']:.4f} "
                  f"({scores['n']} examples)")
        if wandb_log and master_process:
            wandb.log({
                "iter": iter_num,
                "train/loss": losses['train'],
                "val/loss": losses['val'],
                "lr": lr,
                **({"mfu": running_mfu*100} if running_mfu >= 0 else {}), # convert to percentage
                **{f"hellaswag/{name}": scores[name] for name in ('acc', 'acc_norm') if scores},
            }, step=iter_num) # wandb's step is the iteration: this and the iteration's own log make one row
        if (losses['val'] < best_val_loss or always_save_checkpoint) and not eval_only:
            best_val_loss = losses['val']
            if iter_num > 0:
                phases.enter('checkpoint', iter_num)
                # full tensors for the master whatever the parallelism, so any mode and world size can resume
                model_state, optimizer_state = full_state_dicts(raw_model, optimizer, master_process)
                pending = pending_gradients(raw_model, master_process) # gpt2026.py's Adam's, after an even iter
                if master_process:
                    print(f"saving checkpoint to {out_dir}")
                    save_checkpoint({
                        'model': model_state,
                        'optimizer': optimizer_state,
                        'model_args': model_args,
                        'iter_num': iter_num,
                        'best_val_loss': best_val_loss,
                        'config': config,
                        'scaler': scaler.state_dict(),
                        'rng_states': rng_states,
                        'pending_gradients': pending,
                    }, out_dir, keep_previous=keep_other_run)
                    keep_other_run = False
                model_state = optimizer_state = pending = None # free the gathered copies before training goes on
    if eval_only:
        break

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    # and using the GradScaler if data type is float16 (training/step.py: the step the estimator and benchmarks take)
    phases.enter('step', iter_num)
    micro_steps = run.micro_steps(iter_num) // ddp_world_size # gpt2026.py's grow with the record's batch
    loss_sum, grad_norm = train_step(model, optimizer, batches, micro_steps, ctx, scaler, grad_clip,
                                     set_sync if gradient_sync else None, run.forward_args(iter_num),
                                     run.gradient_scale)
    run.end_step(iter_num) # gpt2026.py's embedding splits from its head at two thirds
    tokens_per_iter = micro_steps * ddp_world_size * batch_size * block_size

    # timing and logging
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0:
        if ddp:
            dist.all_reduce(loss_sum) # every rank's share, so the logged loss covers the whole batch
        # get loss as float. note: this is a CPU-GPU sync point
        lossf = loss_sum.item() / ddp_world_size
        if not math.isfinite(lossf):
            fail_not_finite('the training loss', lossf)
        if local_iter_num >= 5 and device_peak is not None: # let the training loop settle a bit
            mfu = run.mfu(iter_num, batch_size * micro_steps, dt, device_peak[0])
            running_mfu = mfu if running_mfu == -1.0 else 0.9*running_mfu + 0.1*mfu
        seconds_per_iter = (t1 - t_start) / (local_iter_num + 1)
        eta = datetime.timedelta(seconds=round(max(max_iters - iter_num, 0) * seconds_per_iter))
        memory = (f", peak mem {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
                  if device_type == 'cuda' else '')
        mfu_text = f", mfu {running_mfu*100:.2f}%" if running_mfu >= 0 else '' # once measured
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms{mfu_text}, "
              f"{tokens_per_iter / dt:,.0f} tok/s, eta {eta}{memory}") # rank 0 prints: the others' stdout is devnull
        if wandb_log and master_process: # docs/wandb.md: what is logged, and when
            wandb.log({
                "iter": iter_num,
                "train/loss_iter": lossf, # this iteration's batch; nanoGPT's train/loss is the evaluation's
                "lr": lr,
                **{"lr/muon": group['lr'] for group in optimizer.param_groups if group.get('muon')},
                "tokens_per_sec": tokens_per_iter / dt,
                **({"mfu": running_mfu*100} if running_mfu >= 0 else {}), # convert to percentage
                **({"grad_norm": grad_norm.item()} if grad_clip != 0.0 else {}),
                **({"memory/max_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
                    "memory/max_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30}
                   if device_type == 'cuda' else {}),
            }, step=iter_num)
    iter_num += 1
    local_iter_num += 1

    # termination conditions
    if iter_num > max_iters:
        break
phases.enter('done', iter_num)
if ddp:
    dist.barrier() # no rank tears its process group down while another still has a collective in flight
if ddp:
    # The models and the optimizer hold the process group (DDP's and fsdp's hooks, ZeRO): freed first, it is destroyed
    # here, its gloo threads joined while Python is alive. Left to interpreter exit, a thread still releasing a
    # finished collective's tensors needs the GIL of an interpreter being torn down, and the process aborts.
    model = raw_model = optimizer = None
    gc.collect()
    destroy_process_group()
