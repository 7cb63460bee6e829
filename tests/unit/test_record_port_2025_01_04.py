"""The speedrun preset is modded-nanogpt's record of 4 Jan 2025 (docs/record.md): our GPT and optimizer, built by
training.step.build from config/speedrun_gpt2_12gb.py's keys scaled down (the preset's 12 layers and 6 heads, 48 wide,
rows of 128 tokens holding several documents, the window's blocks, its start and its aim at 1/16 of their size),
against tests/record_reference_2025_01_04.py (written from docs/record.md, none of the project's model code), from
the same weights, in float64 on the CPU: the loss, every gradient and the weights after each of two optimizer steps
(the second from the first's state), taken through training.step.train_step as train.py takes them, twice: at the
run's start (momentum and window warming up) and in the cooldown (lr decaying, the window at its last size but one).
Each difference between this record and the one of 24 Nov 2024, put back on our side, breaks the agreement."""
import math

import pytest
import torch

from training import configurator
import record_reference_2025_01_04 as R
from helpers import ROOT
from model import GPT, GPTConfig
from record_port import disagreements as port_disagreements
from training import rules
from training.schedule import scheduled_window

PRESET = ROOT / 'config' / 'speedrun_gpt2_12gb.py'
SMALL = dict(n_embd=48, block_size=128)  # the preset's 12 layers and 6 heads: heads of 8
VOCAB, DOC_TOKEN = 96, 95
SCALE = 16  # the window's block 128 -> 8, its start 128 -> 8, its aim 1,856 -> 116, its end 1,792 -> 112
RECORD = R.RecordConfig(vocab_size=VOCAB, n_embd=48, doc_token=DOC_TOKEN, window_block=8, window_aim=116,
                        ns_dtype=None)  # Newton-Schulz in float64: the record's maths, exactly
# two steps from each: warming up (1 block of 8, momentum 0.85), and in the cooldown at step 1,340, where the record's
# window has reached 14 blocks (112) and a line aimed at 1,792 (the 24 Nov 2024 record's) would have 13
FIRST_STEPS = (0, 1340)
TOLERANCE = 1e-10  # relative to each tensor's largest value, in float64
# the names of the 24 Nov 2024 record's keys where the two records differ, with that record's values (scaled down)
NOV_2024 = {
    'softcap 30': dict(logit_softcap=30.0),
    'no value embeddings': dict(value_embeds=0),
    'values unscaled without a table': dict(value_scale=False),
    'attention in block 7': dict(no_attn_layer=-1),
    'value residual': dict(value_residual=True),
    'rotary at base 10000': dict(rope_truncated=False),
    'muon momentum summed': dict(muon_momentum_form='sum'),
    'cooldown over 640 of 1,750 steps': dict(cooldown_frac=640 / 1750),
    'window by position': dict(attn_window_block=0),
    'window aimed at its end': dict(attn_window_warmup_end=0),
    'window from 64 by 64 (by position)': dict(attn_window_block=0, attn_window_warmup_start=64),
    '1,750 steps': dict(max_iters=1750, lr_decay_iters=1750, attn_window_warmup_iters=1750),
}
# and what else could be taken for the record's: torch's Muon (the average, divided by max(norm, eps))
OTHER = {'muon divided by max(norm, eps)': dict(muon_momentum_form='ema')}


def preset_keys(**changes):
    """train.py's config of the 12 GB preset, with `changes` (train.py keys at their full-size values), scaled down."""
    config = configurator.load_config(configurator.train_keys(), [str(PRESET)])
    config.update(changes)
    config.update(SMALL, doc_token=DOC_TOKEN, batch_size=1, gradient_accumulation_steps=2, device='cpu',
                  dtype='float32', compile=False, hellaswag=False,
                  **{key: config[key] // SCALE for key in ('attn_window', 'attn_window_block',
                                                           'attn_window_warmup_start', 'attn_window_warmup_end')})
    rules.check_config(config, 1, 'cpu')
    return config


def ours_from_record(weights):
    """The record's parameters under our names: embed as transformer.wte, value_embeds.embed.j as
    transformer.value_embeds.j, blocks.i as transformer.h.i with c_q, c_k and c_v stacked as c_attn's rows, the
    block's lambdas as x0_lambdas and the attention's as value_lambdas, the skip weights in reverse (ours index the
    encoder block, the record's the decoder block)."""
    ours = {}
    for name, t in weights.items():
        if name.endswith(('attn.c_k.weight', 'attn.c_v.weight')):
            continue
        ours_name = name.replace('blocks.', 'transformer.h.', 1).replace('embed.weight', 'transformer.wte.weight')
        ours_name = ours_name.replace('value_embeds.embed.', 'transformer.value_embeds.')
        if name.endswith('attn.c_q.weight'):
            prefix = name[:-len('c_q.weight')]
            ours[ours_name.replace('c_q', 'c_attn')] = torch.cat([weights[prefix + f'c_{n}.weight'] for n in 'qkv'])
        elif name == 'skip_weights':
            ours[name] = t.flip(0)
        elif name.endswith('attn.lambdas'):
            ours[ours_name.replace('attn.lambdas', 'attn.value_lambdas')] = t
        else:
            ours[ours_name.replace('.lambdas', '.x0_lambdas')] = t
    return ours


def record_from_ours(tensors):
    """ours_from_record's inverse, for our parameters, gradients or anything of their shapes."""
    record = {}
    for name, t in tensors.items():
        record_name = name.replace('transformer.h.', 'blocks.').replace('transformer.wte.', 'embed.')
        record_name = record_name.replace('transformer.value_embeds.', 'value_embeds.embed.')
        record_name = record_name.replace('value_lambdas', 'lambdas').replace('x0_lambdas', 'lambdas')
        if name.endswith('attn.c_attn.weight'):
            for n, rows in zip('qkv', t.chunk(3)):
                record[record_name.replace('c_attn', f'c_{n}')] = rows
        else:
            record[record_name] = t.flip(0) if name == 'skip_weights' else t
    return record


def off_start_weights():
    """Weights away from the record's start, so that every piece acts in the forward and gets a gradient: random
    projections and head (zero at the start), lambdas and skip weights off their (1, 0), (0.5, 0.5) and 1."""
    g = torch.Generator().manual_seed(0)
    weights = {}
    for name, shape in R.record_shapes(RECORD).items():
        noise = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.startswith(('embed.', 'value_embeds.')):
            weights[name] = noise
        elif name.endswith('.weight'):
            weights[name] = noise / math.sqrt(shape[1])
        else:
            start = torch.tensor([0.5, 0.5] if 'attn' in name else [1.0, 0.0]) if 'lambdas' in name else 1.0
            weights[name] = start + 0.3 * noise
    return weights


def tokens():
    """Two rows of 128 tokens and their targets (2, 129 -> x, y): in row 0 a document from 5 to the end, longer than
    the window, in row 1 three, none starting at a block's start (8), so that the window's size and blocks show."""
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, DOC_TOKEN, (2, SMALL['block_size'] + 1), generator=g)
    data[0, 5] = data[1, [13, 70]] = DOC_TOKEN
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


# the record's steps from the start weights and batch every case shares: computed once a module
REFERENCE_STEPS = {}


def disagreements(**changes):
    """(what, relative error) over TOLERANCE of the preset's port (with `changes`) against the record, for the loss,
    the gradients and the weights after each step, of the parameters both have: yielded as found."""
    x, y = tokens()
    return port_disagreements(preset_keys(**changes), VOCAB, off_start_weights(), x, y, FIRST_STEPS,
                              lambda w, state, x, y, it: R.train_step(w, state, x, y, it, RECORD),
                              ours_from_record, record_from_ours, TOLERANCE, REFERENCE_STEPS)


def test_the_preset_is_the_record_loss_gradients_and_two_steps_in_float64():
    assert dict(disagreements()) == {}


def test_the_presets_window_is_the_records_at_every_step():
    """1 block of 128 at first, 14 (1,792) from step 1,339 to the final validation at 1,390, as the record's."""
    config = configurator.load_config(configurator.train_keys(), [str(PRESET)])
    ours = [scheduled_window(it, config) for it in range(config['max_iters'] + 1)]
    assert ours == [128 * R.window_blocks_at(it, R.RecordConfig()) for it in range(1391)]
    assert (ours[0], ours[1338], ours[1339], ours[-1]) == (128, 1664, 1792, 1792)


def test_the_presets_model_has_the_records_parameters_and_initialization():
    """275,742,772 parameters at full size, each of the record's shape under the weight map; each tensor drawn from
    the record's distribution: zero, its constants, N(0, 1) (the embeddings) or U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    config = configurator.load_config(configurator.train_keys(), [str(PRESET)])
    model_args, _ = rules.model_args(config, None)
    with torch.device('meta'):
        model = GPT(GPTConfig(**model_args))
    ours = record_from_ours(dict(model.named_parameters()))
    assert {n: tuple(t.shape) for n, t in ours.items()} == R.record_shapes(R.RecordConfig())
    assert sum(p.numel() for p in model.parameters()) == 275_742_772
    torch.manual_seed(0)
    small = record_from_ours(dict(GPT(GPTConfig(**{**model_args, 'vocab_size': VOCAB, 'n_embd': 256, 'n_head': 8,
                                                   'block_size': 128})).named_parameters()))
    reference = R.init_weights(R.RecordConfig(vocab_size=VOCAB, n_head=8, n_embd=256))
    assert {n: t.shape for n, t in small.items()} == {n: t.shape for n, t in reference.items()}
    for name, t in small.items():
        expected = reference[name]
        if expected.abs().max() == 0 or expected.dim() < 2:  # zeros, lambdas and skip weights: exactly
            assert torch.equal(t.detach(), expected), name
        elif name.startswith(('embed.', 'value_embeds.')):
            assert 0.98 < t.std() < 1.02, name
        else:
            bound = 1 / math.sqrt(t.size(1))
            assert t.abs().max() <= bound and abs(t.std() - bound / math.sqrt(3)) < 0.02 * bound, name


@pytest.mark.parametrize('name', [*NOV_2024, *OTHER])
def test_each_difference_from_the_record_breaks_the_agreement(name):
    assert next(disagreements(**{**NOV_2024, **OTHER}[name]), None)  # one is enough


def test_the_references_full_size_model_and_groups_are_the_records():
    """The record's count from its code: 5 tables of 50,304 x 768 (embedding, 3 value tables, head), 12 MLPs, 11
    attentions of 4 square matrices, 2 lambdas per block and per attention, 6 skip weights; Adam takes the embedding
    with the value tables, the head and the 24 tensors of under 2 dimensions, Muon the 68 block matrices."""
    shapes = R.record_shapes(R.RecordConfig())
    assert sum(math.prod(s) for s in shapes.values()) == 5 * 50304 * 768 + 12 * 8 * 768 ** 2 + 11 * 4 * 768 ** 2 + 52
    groups = R.param_groups({n: torch.empty(s, device='meta') for n, s in shapes.items()})
    assert [len(groups[k]) for k in ('embed', 'head', 'muon', 'scalar')] == [4, 1, 68, 24]
    assert sorted(sum(groups.values(), [])) == sorted(shapes)  # every parameter in exactly one group
