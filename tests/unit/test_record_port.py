"""training/recipe.py's 'record_2024_11_24' is modded-nanogpt's record of 24 Nov 2024, which the speedrun presets
ported before the one of 4 Jan 2025 (docs/record.md): our GPT and optimizer, built by training.step.build from
config/speedrun_gpt2_12gb.py's keys with that recipe and the record's lengths and window, scaled down (4 layers, the
preset's 6 heads, rows of 128 tokens holding several documents, the window and its warmup at 1/16 of their size),
against tests/record_reference.py (written from docs/record.md, none of the project's model code), from the same
weights, in float64 on the CPU: the loss, every gradient and the weights after each of two optimizer steps (the second
from the first's state), taken through training.step.train_step as train.py takes them, twice: at the run's start
(momentum and window warming up) and in the cooldown (lr decaying, the window near its end). The initialization is
compared by its distributions. Each difference issue 40 found between the preset and the record, put back on our side,
breaks the agreement."""
import math

import pytest
import torch

from training import configurator
import record_reference as R
from helpers import ROOT
from model import GPT, GPTConfig
from record_port import disagreements as port_disagreements
from training import recipe, rules

PRESET = ROOT / 'config' / 'speedrun_gpt2_12gb.py'
# the record's lengths and window, which the recipe leaves to a run: 1,750 steps, the window by position from 64
NOV_2024 = dict(recipe.RECIPES['record_2024_11_24'], max_iters=1750, lr_decay_iters=1750, attn_window_warmup_iters=1750,
                attn_window_warmup_start=64, attn_window_warmup_end=0, attn_window_block=0)
SMALL = dict(n_layer=4, n_embd=48, block_size=128)  # and the preset's n_head: 6 heads of 8
VOCAB, DOC_TOKEN = 96, 95
SCALE = 16  # the window's start and end: 64 -> 4, 1,792 -> 112 (rows of 128: the window shorter than a row)
RECORD = R.RecordConfig(vocab_size=VOCAB, n_layer=4, n_head=6, n_embd=48, doc_token=DOC_TOKEN, window_block=4,
                        window_final=112, ns_dtype=None)  # Newton-Schulz in float64: the record's maths, exactly
FIRST_STEPS = (0, 1500)  # two steps from each: warming up (window 4, momentum 0.85), and in the cooldown (window 96)
TOLERANCE = 1e-10  # relative to each tensor's largest value, in float64


def preset_keys(**changes):
    """train.py's config of the 12 GB preset, with `changes` (train.py keys at their full-size values), scaled down."""
    config = configurator.load_config(configurator.train_keys(), [str(PRESET)])
    config.update(NOV_2024)
    config.update(changes)
    config.update(SMALL, attn_window=config['attn_window'] // SCALE, doc_token=DOC_TOKEN, batch_size=1,
                  gradient_accumulation_steps=2, attn_window_warmup_start=config['attn_window_warmup_start'] // SCALE,
                  device='cpu', dtype='float32', compile=False, hellaswag=False)
    rules.check_config(config, 1, 'cpu')
    return config


def ours_from_record(weights):
    """The record's parameters under our names: c_q, c_k and c_v stacked as c_attn's rows, lambdas as x0_lambdas,
    lamb as v1_lambda, the skip weights in reverse (ours index the encoder block, the record's the decoder block)."""
    ours = {}
    for name, t in weights.items():
        if name.endswith(('attn.c_k.weight', 'attn.c_v.weight')):
            continue
        if name.endswith('attn.c_q.weight'):
            prefix = name[:-len('c_q.weight')]
            ours[prefix + 'c_attn.weight'] = torch.cat([weights[prefix + f'c_{n}.weight'] for n in 'qkv'])
        elif name == 'skip_weights':
            ours[name] = t.flip(0)
        elif name.endswith('attn.lamb'):  # the record's scalar, ours of shape (1,), as fsdp shards only tensors
            ours[name.replace('attn.lamb', 'attn.v1_lambda')] = t.reshape(1)
        else:
            ours[name.replace('.lambdas', '.x0_lambdas')] = t
    return ours


def record_from_ours(tensors):
    """ours_from_record's inverse, for our parameters, gradients or anything of their shapes."""
    record = {}
    for name, t in tensors.items():
        if name.endswith('attn.c_attn.weight'):
            for n, rows in zip('qkv', t.chunk(3)):
                record[name.replace('c_attn', f'c_{n}')] = rows
        elif name == 'skip_weights':
            record[name] = t.flip(0)
        elif name.endswith('attn.v1_lambda'):
            record[name.replace('attn.v1_lambda', 'attn.lamb')] = t.reshape(())
        else:
            record[name.replace('.x0_lambdas', '.lambdas')] = t
    return record


def off_start_weights():
    """Weights away from the record's start, so that every piece acts in the forward and gets a gradient: random
    projections and head (zero at the start), lambdas, lamb and skip weights off their (1, 0), 0.5 and 1."""
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in R.record_shapes(RECORD).items():
        noise = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith('wte.weight'):
            weights[name] = noise
        elif name.endswith('.weight'):
            weights[name] = noise / math.sqrt(shape[1])
        else:
            start = {'lambdas': torch.tensor([1.0, 0.0]), 'lamb': torch.tensor(0.5)}.get(name.split('.')[-1], 1.0)
            weights[name] = start + 0.3 * noise
    return weights


def tokens():
    """Two rows of 128 tokens and their targets (2, 129 -> x, y), three documents each (DOC_TOKEN starts one), two of
    them longer than the window in the cooldown (96; the former preset's, 52), so that its size shows."""
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, DOC_TOKEN, (2, SMALL['block_size'] + 1), generator=g)
    data[0, [30, 100]] = data[1, [10, 50]] = DOC_TOKEN
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


# the record's steps from the start weights and batch every case shares: computed once a module
REFERENCE_STEPS = {}


def disagreements(**changes):
    """(what, relative error) over TOLERANCE of the recipe's port (with `changes`) against the record, for the loss,
    the gradients and the weights after each step, of the parameters both have: yielded as found."""
    x, y = tokens()
    return port_disagreements(preset_keys(**changes), VOCAB, off_start_weights(), x, y, FIRST_STEPS,
                              lambda w, state, x, y, it: R.train_step(w, state, x, y, it, RECORD),
                              ours_from_record, record_from_ours, TOLERANCE, REFERENCE_STEPS)


def init_disagreements(**changes):
    """What differs between our initialization (the preset's keys, seeded) and the record's: the names and shapes,
    then each tensor's distribution: zero, the record's constants, N(0, 1) (the embedding) or
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (every other matrix)."""
    config = preset_keys(**changes)
    model_args, _ = rules.model_args(config, VOCAB)
    torch.manual_seed(0)
    ours = record_from_ours(dict(GPT(GPTConfig(**{**model_args, 'n_embd': 256, 'n_head': 8})).named_parameters()))
    shapes = R.record_shapes(R.RecordConfig(vocab_size=VOCAB, n_layer=4, n_head=8, n_embd=256))
    reference = R.init_weights(R.RecordConfig(vocab_size=VOCAB, n_layer=4, n_head=8, n_embd=256))
    if {n: tuple(t.shape) for n, t in ours.items()} != shapes:
        return ['names or shapes']
    wrong = []
    for name, t in ours.items():
        expected = reference[name]
        if expected.abs().max() == 0 or expected.dim() < 2:  # zeros, lambdas, lamb and skip weights: exactly
            if not torch.equal(t.detach(), expected):
                wrong.append(name)
        elif name.endswith('wte.weight'):
            if not 0.98 < t.std() < 1.02:
                wrong.append(name)
        else:
            bound = 1 / math.sqrt(t.size(1))
            if not (t.abs().max() <= bound and abs(t.std() - bound / math.sqrt(3)) < 0.02 * bound):
                wrong.append(name)
    return wrong


def test_the_preset_is_the_record_loss_gradients_and_two_steps_in_float64():
    assert dict(disagreements()) == {}


def test_the_presets_initialization_is_the_records():
    assert init_disagreements() == []


def test_the_presets_model_has_the_records_parameters():
    """162,201,642 parameters at full size, each of the record's shape under the weight map."""
    config = {**configurator.load_config(configurator.train_keys(), [str(PRESET)]), **NOV_2024}
    model_args, _ = rules.model_args(config, None)
    with torch.device('meta'):
        model = GPT(GPTConfig(**model_args))
    ours = record_from_ours(dict(model.named_parameters()))
    assert {n: tuple(t.shape) for n, t in ours.items()} == R.record_shapes(R.RecordConfig())
    assert sum(p.numel() for p in model.parameters()) == 162_201_642


# issue 40's table, each row put back on our side as the preset had it (and the other pieces the port added)
MUTATIONS = {
    'embedding norm': dict(embed_norm=False),
    'heads': dict(n_head=12),
    'value residual': dict(value_residual=False),
    'x0 shortcut': dict(x0_shortcut=False),
    'value embeddings': dict(value_embeds=1),
    'softcap': dict(logit_softcap=15.0),
    'weight decay': dict(weight_decay=0.1),
    'betas': dict(beta1=0.9),
    'scalar lr': dict(scalar_learning_rate=0.0),
    'clipping': dict(grad_clip=1.0),
    'cooldown': dict(cooldown_frac=0.2, min_lr=6e-5),
    'warmup': dict(warmup_iters=100),
    'muon on q, k, v': dict(muon_split_qkv=False),
    'muon momentum form': dict(muon_momentum_form='ema'),
    'muon lr': dict(muon_learning_rate=0.02),
    'muon momentum warmup': dict(muon_momentum_warmup_iters=500),
    'embedding lr': dict(embedding_learning_rate=0.01),
    'head lr': dict(head_learning_rate=0.004),
    'norm gains': dict(norm_gain=True),
    'window': dict(attn_window=1024),
}
# the rows that show in the initialization only
INIT_MUTATIONS = {'head init': dict(zero_init_proj=False), 'init': dict(weight_init='gpt2')}


@pytest.mark.parametrize('name', MUTATIONS)
def test_each_difference_from_the_record_breaks_the_agreement(name):
    assert next(disagreements(**MUTATIONS[name]), None)  # one is enough


@pytest.mark.parametrize('name', INIT_MUTATIONS)
def test_each_difference_in_the_initialization_breaks_it(name):
    assert init_disagreements(**INIT_MUTATIONS[name])
