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

The modern recipes against nanoGPT's (docs/recipe.md): 'baseline' is nanoGPT's GPT-2 architecture, AdamW and cosine
schedule, run at each learning rate of --baseline_lrs, whose best is the baseline every run is measured against;
'recipe' is the CPU-tuned recipe (recipe.RECIPES['cpu_tuned']: modern architecture, Muon,
warmup-stable-decay); 'record' is modded-nanogpt's record of 4 Jan 2025 that the speedrun presets port, and
'record_2024_11_24' the one of 24 Nov 2024 they ported before (recipe.RECIPES: each record's architecture,
initialization, optimizer groups and learning rates at this run's size, its schedule's shape over this run's steps;
the layout, the documents and window of the presets, is not theirs here); 'recipe-X' is the recipe without its
component X (recipe.ABLATIONS), 'recipe+X' with the component X it left out (recipe.DROPPED); --runs=ablation runs
all of them. 'recipe+documents', 'recipe+packed', 'recipe+window_warmup' and 'recipe+window_warmup_long'
(recipe.LAYOUTS) attend within the documents eot_token separates, the last three over sequences 4 blocks long
windowed at block_size (the last two's window growing over the run, to block_size or 7/4 of it): the same tokens a
step and the same validation tokens, as every run then reads rows of 4 blocks and splits them into its own
sequences. With several --seeds (each
its own initial weights, batches and validation windows) the curves are means over the seeds, and the summary gives
each run's final val loss and the step at which it first reaches the reference's final val loss, seed by seed (the
reference: the best baseline, or the first run).
$ python bench_optim.py --dataset=shakespeare_char --runs=ablation --seeds=1,2
$ python bench_optim.py --dataset=shakespeare_char --runs=baseline,recipe,record,record_2024_11_24 --seeds=1,2

Keys are overridden as in train.py: config files, then --key=value (python bench_optim.py --help lists them).
"""
import itertools
import json
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

from training import configurator
from training import recipe, rules, step
from training.device import TORCH_DTYPES
from training.errors import ConfigError, install_handler
from training.optim import build_optimizer, check_config, muon_matrices, schedule_groups
from training.schedule import scheduled_lr, scheduled_window

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)

# -----------------------------------------------------------------------------
runs = 'adamw,muon' # comma-separated names of RUNS to compare
eot_token = 50256 # the token between the dataset's documents (GPT-2's <|endoftext|>): recipe.LAYOUTS' doc_token
seeds = '1337' # comma-separated; each seed's initial weights, batches and validation windows are every run's
json_path = '' # also write the curves and the summary to this JSON file
baseline_lrs = '1e-3,2e-3,4e-3,8e-3,1.6e-2' # 'baseline' runs at each learning_rate (min_lr in proportion); its
                                            # best final val loss is the other runs' target ('': learning_rate alone)
# train.py's keys this benchmark sets apart from train.py's defaults (for train.py's description, no comment):
# a small model briefly trained on the CPU, 4 layers, d=128, GPT-2's vocabulary (or meta.pkl's), 128-token windows
dataset = 'shakespeare'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 16 # windows a step, every run the same tokens (no accumulation)
max_iters = 200
eval_interval = 25 # steps between validation losses
eval_iters = 20 # validation batches of batch_size windows: the same windows at every evaluation
learning_rate = 1e-3 # AdamW's (optim='muon': for the embeddings, LayerNorms and biases)
warmup_iters = 10
lr_decay_iters = 200
min_lr = 1e-4
dtype = 'float32' # bfloat16: every run under bf16 autocast, as train.py's dtype (the bf16-weight runs need it)
# -----------------------------------------------------------------------------
# train.py's keys the runs read at train.py's defaults, where a run of RUNS sets none of its own
TRAIN_KEYS = ('data_dir', 'muon_learning_rate', 'muon_momentum', 'muon_momentum_warmup_iters', 'weight_decay', 'beta1',
              'beta2', 'grad_clip', 'attn_window_warmup_iters', 'attn_window_warmup_start', 'attn_window_warmup_end',
              'lr_schedule', 'cooldown_frac', 'autocast_cache', 'activation_checkpointing', 'loss_chunk_mib',
              'attention_kernel')
# -----------------------------------------------------------------------------
# name: train.py keys of the run ('nearest': torch's AdamW on bf16 weights, which rounds each update to nearest)
RUNS = {'adamw': {'optim': 'adamw'}, 'muon': {'optim': 'muon'},
        'bf16_weights': {'optim': 'adamw', 'weight_dtype': 'bfloat16'},
        'bf16_nearest': {'optim': 'adamw', 'weight_dtype': 'bfloat16', 'nearest': True},
        'autocast_cache': {'optim': 'adamw', 'autocast_cache': True}}  # the same losses: its cost is the time
RUNS.update(recipe.RUNS) # 'baseline', 'recipe', recipe.RECORDS, 'recipe-X' (recipe.ABLATIONS), 'recipe+X' (DROPPED)
RUN_GROUPS = {'ablation': [name for name in recipe.RUNS
                           if name not in recipe.RECORDS and name[len('recipe+'):] not in recipe.LAYOUTS]}


def seed_numbers(seeds):
    """The seeds of the `seeds` key: integers, comma-separated."""
    try:
        return [int(seed) for seed in seeds.split(',')]
    except ValueError:
        raise ConfigError(f"seeds={seeds!r}: give whole numbers, comma-separated, e.g. --seeds=1,2") from None


def run_names(runs):
    """The run names of the `runs` key: RUNS' names and RUN_GROUPS' groups, comma-separated."""
    names = [name for part in runs.split(',') for name in RUN_GROUPS.get(part, [part])]
    for name in names:
        if name not in RUNS:
            raise ConfigError(f"unknown run {name!r}: use some of {', '.join([*RUNS, *RUN_GROUPS])}")
    return names


train_keys = configurator.train_keys()
config = configurator.load_config({**configurator.read_keys(__file__, base=train_keys),
                                   **{key: train_keys[key] for key in TRAIN_KEYS}}, sys.argv[1:], rules.CHOICES)
names = run_names(config['runs'])
seed_list = seed_numbers(config['seeds'])
sweep = recipe.baseline_sweep(config['baseline_lrs'], config) if 'baseline' in names else {}
if sweep: # the baseline's runs in its place, one a learning rate
    RUNS.update(sweep)
    names = [swept for name in names for swept in (sweep if name == 'baseline' else [name])]
config.update(optimizer_in_backward=False, parallelism='ddp', weight_dtype='float32', init_from='scratch',
              hellaswag=False, bias=False, dropout=0.0, model_file='model.py') # one process, standard step, a
                                                                                # model.py GPT from scratch
# the windows every run reads: `span` tokens, the longest sequence of any run, split into each run's sequences
keys_by_run = {name: recipe.run_keys(RUNS[name], config) for name in names}
span = max(keys['block_size'] for keys in keys_by_run.values())
if config['batch_size'] * config['block_size'] % span:
    raise ConfigError(f"batch_size={config['batch_size']} rows of block_size={config['block_size']} do not fill "
                      f"whole sequences of {span} tokens (--runs={config['runs']}): use a multiple of "
                      f"{span // config['block_size']} for --batch_size")
for keys in keys_by_run.values():
    check_config(keys, 1)
    rules.check_architecture(keys)
    rules.check_window_warmup(keys)
rules.check_dataset({**config, 'block_size': span})
meta_vocab = rules.meta_vocab_size(config)
vocab_size = meta_vocab or rules.DEFAULT_VOCAB_SIZE
globals().update(config)
# -----------------------------------------------------------------------------


def windows(split, generator):
    """batch_size * block_size tokens of `split` (and their targets) in rows of `span` tokens from random offsets."""
    data = np.memmap(os.path.join(data_dir, dataset, f'{split}.bin'), dtype=np.uint16, mode='r')
    ix = generator.integers(len(data) - span, size=batch_size * block_size // span)
    x = torch.stack([torch.from_numpy(data[i:i + span].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + span].astype(np.int64)) for i in ix])
    return x, y


@torch.no_grad()
def val_loss(model, batches, ctx, window):
    model.eval()
    with ctx:
        losses = [model(*(t.view(-1, model.config.block_size) for t in batch), attn_window=window)[1].item()
                  for batch in batches]
    model.train()
    return sum(losses) / len(losses)


def state_bytes(optimizer, params):
    """Bytes of the optimizer's state tensors for `params`."""
    return sum(t.nbytes for p in params for t in optimizer.state[p].values() if isinstance(t, torch.Tensor))


def build(run, seed):
    """The model, optimizer, autocast context and train.py keys of `run`, from the seed's initial weights (built as
    train.py builds them)."""
    keys = keys_by_run[run]
    torch.manual_seed(seed)
    model_args, _ = rules.model_args(keys, meta_vocab)
    model = step.build_model(keys, model_args)
    if keys.get('nearest'): # torch's AdamW, which rounds each update of bf16 weights to nearest
        optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), 'cpu')
    else:
        optimizer = build_optimizer(model, keys, 'cpu')
    ctx = nullcontext() if dtype == 'float32' else torch.autocast('cpu', dtype=TORCH_DTYPES[dtype],
                                                                  cache_enabled=keys['autocast_cache'])
    return model, optimizer, ctx, keys


def train(run, seed, val_batches):
    """({step: val loss}, seconds per step, optimizer-state bytes) of `run` from `seed`."""
    model, optimizer, ctx, keys = build(run, seed)
    batches = step.Prefetcher(tuple(t.view(-1, keys['block_size']) for t in windows('train', np.random.default_rng(
        (seed, 0, it)))) for it in itertools.count()) # as train.py's: each step's batch fetched during the one before
    curve, seconds = {}, 0.0
    for it in range(max_iters + 1):
        window = scheduled_window(it, keys) # as train.py's
        if it % eval_interval == 0 or it == max_iters:
            curve[it] = val_loss(model, val_batches, ctx, window)
            print(f'{run} seed {seed} step {it}: val loss {curve[it]:.4f}', flush=True)
        if it == max_iters:
            break
        t0 = time.perf_counter()
        schedule_groups(optimizer, it, scheduled_lr(it, keys), keys) # as train.py sets them
        step.train_step(model, optimizer, batches, 1, ctx, grad_clip=keys['grad_clip'],
                        forward_args=dict(attn_window=window))
        seconds += time.perf_counter() - t0
    matrices = muon_matrices(model)
    in_muon = {id(p) for p in matrices}
    rest = [p for p in model.parameters() if id(p) not in in_muon]
    return curve, seconds / max_iters, (state_bytes(optimizer, matrices), state_bytes(optimizer, rest))


def mean(values):
    return sum(values) / len(values)


results = {name: {} for name in names} # name: {seed: train()'s}
for seed in seed_list:
    generator = np.random.default_rng((seed, 1))
    val_batches = [windows('val', generator) for _ in range(eval_iters)]
    for name in names:
        results[name][seed] = train(name, seed, val_batches)
curves = {name: {it: mean([results[name][seed][0][it] for seed in seed_list]) for it in results[name][seed_list[0]][0]}
          for name in names} # the mean over the seeds
finals = {name: [results[name][seed][0][max_iters] for seed in seed_list] for name in names}
# the reference: the first run, or the baseline's best learning rate; its final val loss, seed by seed, is the
# target whose first step each run reports
reference = min(sweep, key=lambda name: mean(finals[name])) if sweep else names[0]
targets = {seed: results[reference][seed][0][max_iters] for seed in seed_list}
summary = {}
for name in names:
    reached = [recipe.first_step_reaching(results[name][seed][0], targets[seed]) for seed in seed_list]
    summary[name] = dict(final_mean=mean(finals[name]), final_min=min(finals[name]), final_max=max(finals[name]),
                         reached=reached, reached_mean=None if None in reached else mean(reached),
                         ms_per_step=1000 * mean([results[name][seed][1] for seed in seed_list]))
print(f'\n{dataset}, {n_layer} layers, d={n_embd}, vocab {vocab_size}, batch {batch_size} x {block_size}, '
      f'{max_iters} steps, lr {learning_rate:g} (muon_learning_rate {muon_learning_rate:g}), {dtype}, seeds '
      f'{seeds}, {torch.get_num_threads()} threads')
width = max(12, *(len(name) + 2 for name in names))
print(f"\n{'run':<{width + 2}}  final val loss (mean, min-max)  step reaching {reference}'s final (by seed; mean)"
      f"  ms/step")
for name, row in summary.items():
    reached = ', '.join('-' if step is None else str(step) for step in row['reached'])
    reached_mean = '-' if row['reached_mean'] is None else f"{row['reached_mean']:.0f}"
    print(f"{name:<{width + 2}}  {row['final_mean']:.4f} ({row['final_min']:.4f}-{row['final_max']:.4f})"
          f"{'':<12}{reached + '; ' + reached_mean:<42}{row['ms_per_step']:.0f}")
if json_path:
    with open(json_path, 'w') as f:
        json.dump(dict(config=config, curves={name: {str(it): loss for it, loss in curve.items()}
                                              for name, curve in curves.items()},
                       seeds={name: {str(seed): {str(it): loss for it, loss in result[0].items()}
                                     for seed, result in by_seed.items()} for name, by_seed in results.items()},
                       summary=summary, reference=reference), f, indent=1)
print(f'\nval loss, mean over seeds {seeds}')
print('step  ' + ''.join(f'{name:>{width}}' for name in names))
for it in curves[names[0]]:
    print(f'{it:>4}  ' + ''.join(f'{curves[name][it]:>{width}.4f}' for name in names))
for name in names:
    curve, step_seconds, (matrix_bytes, rest_bytes) = results[name][seed_list[0]]
    final = summary[name]['final_mean'] / summary[reference]['final_mean'] - 1
    print(f"{name}: optimizer state {matrix_bytes + rest_bytes:,} bytes, of which the blocks' matrices "
          f"{matrix_bytes:,} and the rest {rest_bytes:,}; {summary[name]['ms_per_step']:.0f} ms a step; final val "
          f"loss {final:+.2%} against {reference}'s")
if len(sweep) > 1:
    edge = reference in (min(sweep, key=lambda name: sweep[name]['learning_rate']),
                         max(sweep, key=lambda name: sweep[name]['learning_rate']))
    print(f"{reference} is the baseline's best of --baseline_lrs={baseline_lrs}"
          + (": at the sweep's edge, widen it for a fair baseline" if edge else ""))
