"""
Training recipes side by side: the same small GPT trained on the CPU from the same initial weights, on the same
batches, for the same steps, with train.py's optimizer (training.optim.build_optimizer), schedule and step; prints
each one's validation-loss curve, time per step and optimizer-state bytes. A benchmark, not a test. The runs (RUNS):
adamw and muon (optim='muon'); and, under bf16 autocast, fp32 weights (adamw), bf16 weights with stochastic rounding
(bf16_weights: weight_dtype='bfloat16') and, for comparison, bf16 weights rounded to nearest (torch's AdamW on them);
autocast_cache=True (the same losses as adamw, its cost is in the time a step).

$ python prepare/shakespeare.py && python bench_optim.py    # adamw against muon, Tiny Shakespeare in GPT-2 BPE
$ python bench_optim.py --dataset=shakespeare_char          # without tiktoken: the character-level set
$ python bench_optim.py --runs=adamw,bf16_weights,bf16_nearest --dtype=bfloat16 --dataset=shakespeare_char
$ python bench_optim.py --runs=adamw,autocast_cache --dtype=bfloat16 --activation_checkpointing=True

Keys are overridden as in train.py: config files, then --key=value (python bench_optim.py --help lists them).
"""
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

import configurator
from model import GPT, GPTConfig
from training import rules
from training.device import TORCH_DTYPES
from training.errors import ConfigError, install_handler
from training.optim import build_optimizer, check_config, group_lr, muon_matrices
from training.schedule import cosine_lr

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)

# -----------------------------------------------------------------------------
runs = 'adamw,muon' # comma-separated names of RUNS to compare
data_dir = 'data'
dataset = 'shakespeare' # data_dir/dataset/train.bin and val.bin, as train.py reads them
seed = 1337 # the initial weights, the batches and the validation windows: the same for every optimizer
# model: 4 layers, d=128, GPT-2's vocabulary (or meta.pkl's), 128-token windows
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16
# training: train.py's keys and meaning
max_iters = 200
eval_interval = 25
eval_iters = 20 # validation batches of batch_size windows: the same windows at every evaluation
learning_rate = 1e-3 # AdamW's (optim='muon': for the embeddings, LayerNorms and biases)
muon_learning_rate = 0.02
muon_momentum = 0.95
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup_iters = 10
lr_decay_iters = 200
min_lr = 1e-4
dtype = 'float32' # 'bfloat16': every run under bf16 autocast, as train.py's dtype (the bf16-weight runs need it)
autocast_cache = False # train.py's key: a run may turn it on
activation_checkpointing = False # every run
# -----------------------------------------------------------------------------
# name: train.py keys of the run ('nearest': torch's AdamW on bf16 weights, which rounds each update to nearest)
RUNS = {'adamw': {'optim': 'adamw'}, 'muon': {'optim': 'muon'},
        'bf16_weights': {'optim': 'adamw', 'weight_dtype': 'bfloat16'},
        'bf16_nearest': {'optim': 'adamw', 'weight_dtype': 'bfloat16', 'nearest': True},
        'autocast_cache': {'optim': 'adamw', 'autocast_cache': True}}  # the same losses: its cost is the time
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str))]
config = configurator.load_config({k: globals()[k] for k in config_keys}, sys.argv[1:])
names = config['runs'].split(',')
config.update(optimizer_in_backward=False, parallelism='ddp', weight_dtype='float32') # one process, standard step
for name in names:
    if name not in RUNS:
        raise ConfigError(f"unknown run {name!r}: use some of {', '.join(RUNS)}")
    check_config({**config, **RUNS[name]}, 1)
rules.check_dataset(config)
vocab_size = rules.meta_vocab_size(config) or rules.DEFAULT_VOCAB_SIZE
globals().update(config)
# -----------------------------------------------------------------------------


def windows(split, generator, rows):
    data = np.memmap(os.path.join(data_dir, dataset, f'{split}.bin'), dtype=np.uint16, mode='r')
    ix = generator.integers(len(data) - block_size, size=rows)
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x, y


@torch.no_grad()
def val_loss(model, batches, ctx):
    model.eval()
    with ctx:
        losses = [model(x, y)[1].item() for x, y in batches]
    model.train()
    return sum(losses) / len(losses)


def state_bytes(optimizer, params):
    """Bytes of the optimizer's state tensors for `params`."""
    return sum(t.nbytes for p in params for t in optimizer.state[p].values() if isinstance(t, torch.Tensor))


def build(run):
    """The model, optimizer and autocast context of `run`, from the seed's initial weights (cast as train.py casts
    them)."""
    keys = {**config, **RUNS[run]}
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                          vocab_size=vocab_size, bias=False, dropout=0.0)).to(TORCH_DTYPES[keys['weight_dtype']])
    model.activation_checkpointing = activation_checkpointing
    ctx = nullcontext() if dtype == 'float32' else torch.autocast('cpu', dtype=TORCH_DTYPES[dtype],
                                                                  cache_enabled=keys['autocast_cache'])
    if keys.get('nearest'):
        return model, model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), 'cpu'), ctx
    return model, build_optimizer(model, keys, 'cpu'), ctx


def train(run, val_batches):
    """({step: val loss}, seconds per step, optimizer-state bytes) of `run`."""
    model, optimizer, ctx = build(run)
    curve, seconds = {}, 0.0
    for it in range(max_iters + 1):
        if it % eval_interval == 0 or it == max_iters:
            curve[it] = val_loss(model, val_batches, ctx)
            print(f'{run} step {it}: val loss {curve[it]:.4f}', flush=True)
        if it == max_iters:
            break
        t0 = time.perf_counter()
        lr = cosine_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters) # as train.py sets it
        for group in optimizer.param_groups:
            group['lr'] = group_lr(group, lr, config)
        x, y = windows('train', np.random.default_rng((seed, 0, it)), batch_size)
        with ctx:
            _, loss = model(x, y)
        loss.backward()
        if grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds += time.perf_counter() - t0
    matrices = muon_matrices(model)
    in_muon = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if id(p) not in in_muon]
    return curve, seconds / max_iters, (state_bytes(optimizer, matrices), state_bytes(optimizer, rest))


generator = np.random.default_rng((seed, 1))
val_batches = [windows('val', generator, batch_size) for _ in range(eval_iters)]
results = {name: train(name, val_batches) for name in names}
print(f'\n{dataset}, {n_layer} layers, d={n_embd}, vocab {vocab_size}, batch {batch_size} x {block_size}, '
      f'{max_iters} steps, lr {learning_rate:g} (muon_learning_rate {muon_learning_rate:g}), {dtype}, seed {seed}, '
      f'{torch.get_num_threads()} threads')
width = max(12, *(len(name) + 2 for name in names))
print('step  ' + ''.join(f'{name:>{width}}' for name in names))
for it in results[names[0]][0]:
    print(f'{it:>4}  ' + ''.join(f'{results[name][0][it]:>{width}.4f}' for name in names))
for name, (curve, step_seconds, (matrix_bytes, rest_bytes)) in results.items():
    target = min(results[names[0]][0].values()) # the first run's best val loss: when does each reach it?
    reached = next((it for it, loss in curve.items() if loss <= target), None)
    final = curve[max_iters] / results[names[0]][0][max_iters] - 1
    print(f"{name}: optimizer state {matrix_bytes + rest_bytes:,} bytes, of which the blocks' matrices "
          f"{matrix_bytes:,} and the rest {rest_bytes:,}; {step_seconds * 1000:.0f} ms a step; val loss "
          f"{target:.4f} first reached at step {reached}; final val loss {final:+.2%} against {names[0]}'s")
