"""tests/record_reference.py, the reference of modded-nanogpt's 24 Nov 2024 record, checked against the record's
description (docs/record.md) by other means than its own code: the mask by brute force, documents run alone, the
schedules' values computed by hand, Adam's first step, Muon's orthogonalized and scaled update."""
import math

import pytest
import torch
import torch.nn.functional as F

import record_reference as R

SMALL = R.RecordConfig(vocab_size=64, n_layer=4, n_head=2, n_embd=32, doc_token=0, ns_dtype=None)
T = 24


def tokens(seed, rows=2):
    """Rows of random tokens with a document starting (doc_token 0) at 5, 12 and 19."""
    idx = torch.randint(1, SMALL.vocab_size, (rows, T), generator=torch.Generator().manual_seed(seed))
    idx[:, 5::7] = 0
    return idx


def trained_weights(seed):
    """The record's initialization, with its zeros (projections, head) and constants made random, as after some
    training, so that every parameter gets a gradient."""
    g = torch.Generator().manual_seed(seed)
    w = R.init_weights(SMALL, g, torch.float64)
    for name, t in w.items():
        if not name.endswith('wte.weight'):
            w[name] = t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype)
    return w


def test_the_full_size_model_has_the_records_parameters():
    shapes = R.record_shapes(R.RecordConfig())
    assert sum(math.prod(s) for s in shapes.values()) == 162_201_642
    groups = R.param_groups({n: torch.empty(s, device='meta') for n, s in shapes.items()})
    assert [len(groups[k]) for k in ('embed', 'head', 'muon', 'scalar')] == [1, 1, 72, 25]
    assert sorted(sum(groups.values(), [])) == sorted(shapes)  # every parameter in exactly one group


def test_initialization_is_pytorchs_default_with_zero_projections_and_head():
    w = R.init_weights(SMALL, torch.Generator().manual_seed(12))
    assert w['transformer.wte.weight'].std().item() == pytest.approx(1.0, abs=0.05)  # nn.Embedding's N(0, 1)
    for name in ('attn.c_q.weight', 'attn.c_v.weight', 'mlp.c_fc.weight'):  # nn.Linear's U(-1/sqrt(32), 1/sqrt(32))
        t = w[f'transformer.h.1.{name}']
        assert 0.95 / math.sqrt(32) < t.abs().max() <= 1 / math.sqrt(32)
    assert all(w[n].abs().max() == 0 for n in ('lm_head.weight', 'transformer.h.3.attn.c_proj.weight',
                                                  'transformer.h.3.mlp.c_proj.weight'))
    assert w['transformer.h.2.lambdas'].tolist() == [1.0, 0.0] and w['transformer.h.2.attn.lamb'].item() == 0.5
    assert w['skip_weights'].tolist() == [1.0, 1.0]


def test_the_embedding_is_normed_and_the_mlp_is_relu_squared():
    w, idx = trained_weights(13), tokens(13)
    scaled = {**w, 'transformer.wte.weight': 7 * w['transformer.wte.weight']}
    torch.testing.assert_close(R.forward(scaled, idx, 6, SMALL), R.forward(w, idx, 6, SMALL), rtol=0, atol=1e-12)
    x = torch.randn(3, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(13))
    p = 'transformer.h.1.'
    torch.testing.assert_close(R.mlp(w, p, 2 * x), 4 * R.mlp(w, p, x))  # relu(x)**2 is homogeneous of degree 2
    assert (R.mlp(w, p, -x) - R.mlp(w, p, x)).abs().max() > 0.1  # and not even


@pytest.mark.parametrize('silent', ['mlp', 'attn'])
def test_attention_and_mlp_see_normed_inputs_and_queries_and_keys_are_normed(silent):
    """With one of the two silenced (its projection at zero), what a block adds to its stream does not change when
    the stream is scaled; scaling a block's query or key matrix changes nothing."""
    w, idx = trained_weights(14), tokens(14)
    p = 'transformer.h.2.'
    w[p + f'{silent}.c_proj.weight'] = torch.zeros_like(w[p + f'{silent}.c_proj.weight'])
    w[p + 'lambdas'] = torch.tensor([1.0, 0.0], dtype=torch.float64)
    g = torch.Generator().manual_seed(14)
    shapes = ((2, T, 32), (2, T, 32), (2, T, 2, 16))
    x, x0, v1 = (torch.randn(shape, dtype=torch.float64, generator=g) for shape in shapes)
    mask, rotary = R.attention_mask(idx, 6, 0), R.rotary(T, 16, 10000.0, torch.float64)
    added = [R.block(w, p, s * x, x0, v1, mask, *rotary, SMALL)[0] - s * x for s in (1, 5)]
    torch.testing.assert_close(added[1], added[0])
    logits = R.forward(w, idx, 6, SMALL)
    for name in ('attn.c_q.weight', 'attn.c_k.weight'):
        scaled = {**w, p + name: 5 * w[p + name]}
        torch.testing.assert_close(R.forward(scaled, idx, 6, SMALL), logits, rtol=0, atol=1e-12)


def test_mask_is_causal_within_the_window_and_the_document_by_brute_force():
    idx, window = tokens(0), 4
    mask = R.attention_mask(idx, window, SMALL.doc_token)
    for b in range(idx.size(0)):
        doc = [int((idx[b, :p + 1] == SMALL.doc_token).sum()) for p in range(T)]  # a doc_token opens its document
        expected = torch.tensor([[k <= q and q - k < window and doc[q] == doc[k] for k in range(T)] for q in range(T)])
        assert torch.equal(mask[b, 0], expected)


def test_each_document_of_a_row_gives_the_logits_it_gives_alone():
    """Document masking: nothing crosses a document's start; rotary positions are relative, so the row's offset of a
    document changes nothing (up to the fp32 rotary tables)."""
    w, idx = trained_weights(1), tokens(1, rows=1)
    logits = R.forward(w, idx, T, SMALL)
    for start, end in ((0, 5), (5, 12), (12, 19), (19, T)):
        alone = R.forward(w, idx[:, start:end], T, SMALL)
        torch.testing.assert_close(logits[:, start:end], alone, rtol=0, atol=1e-5)


def test_a_token_reaches_only_what_the_window_lets_it_through_the_layers():
    """With window w, each layer looks w - 1 positions back: after n_layer layers, n_layer * (w - 1)."""
    w, idx, window = trained_weights(2), tokens(2, rows=1), 2
    idx[0, 12:] = 5  # one long document from 12 to the end
    base = R.forward(w, idx, window, SMALL)
    changed = idx.clone()
    changed[0, 13] = 6
    moved = (R.forward(w, changed, window, SMALL) - base).abs().amax(-1)[0]
    reach = 13 + SMALL.n_layer * (window - 1)
    assert moved[:13].max() == 0 and (moved[13:reach + 1] > 1e-6).all() and moved[reach + 1:].max() == 0


def test_rotary_turns_each_half_split_pair_backwards_by_its_frequency():
    """Pair j of a head (x[j], x[j + hd/2]) as the complex x[j] + i x[j + hd/2], times exp(-i t base**(-2j / hd))."""
    hd = 8
    x = torch.randn(1, 5, 1, hd, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    y = R.apply_rotary(x, *R.rotary(5, hd, 10000.0, torch.float64))
    theta = torch.arange(5, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, hd, 2) / hd)
    z = torch.complex(x[..., :hd // 2], x[..., hd // 2:]) * torch.exp(-1j * theta)[None, :, None]
    torch.testing.assert_close(y, torch.cat((z.real, z.imag), -1), rtol=0, atol=1e-6)  # fp32 tables


def test_skip_weights_0_feeds_the_last_encoder_output_to_the_first_decoder_block():
    """With the decoder blocks adding nothing, decoder block 0's input is the last encoder block's output, e1: adding
    skip_weights[0] * e1 only scales the stream, which the final norm undoes; skip_weights[1] adds block 0's."""
    w, idx = trained_weights(10), tokens(10)
    for i in (2, 3):
        w[f'transformer.h.{i}.lambdas'] = torch.tensor([1.0, 0.0], dtype=torch.float64)
        w[f'transformer.h.{i}.attn.c_proj.weight'] = torch.zeros(32, 32, dtype=torch.float64)
        w[f'transformer.h.{i}.mlp.c_proj.weight'] = torch.zeros(32, 128, dtype=torch.float64)
    logits = {}
    for skips in ((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)):
        w['skip_weights'] = torch.tensor(skips, dtype=torch.float64)
        logits[skips] = R.forward(w, idx, 6, SMALL)
    torch.testing.assert_close(logits[1.0, 0.0], logits[0.0, 0.0], rtol=0, atol=1e-12)
    assert (logits[0.0, 1.0] - logits[0.0, 0.0]).abs().max() > 1e-3


def test_block_0_reaches_the_others_through_its_values_alone_when_cut_off():
    """lambdas (0, 1) in block 1 replace the stream by the embedding, and skip_weights[1] = 0 drops block 0's U-net
    output: block 0 then acts only through its values v1 (c_v of its mixed input), which every later block mixes in
    (lamb)."""
    w, idx = trained_weights(11), tokens(11)
    w['transformer.h.1.lambdas'] = torch.tensor([0.0, 1.0], dtype=torch.float64)
    w['skip_weights'] = torch.tensor([0.7, 0.0], dtype=torch.float64)
    _, grads = R.loss_and_grads(w, idx, torch.roll(idx, -1, 1), 6, SMALL)
    zero = [n for n, g in grads.items() if n.startswith('transformer.h.0.') and g.abs().max() == 0]
    assert sorted(zero) == [f'transformer.h.0.{n}' for n in ('attn.c_k.weight', 'attn.c_proj.weight', 'attn.c_q.weight',
                                                              'attn.lamb', 'mlp.c_fc.weight', 'mlp.c_proj.weight')]
    w['transformer.h.2.attn.lamb'] = torch.tensor(1.0, dtype=torch.float64)  # block 2 takes block 0's values only
    _, grads = R.loss_and_grads(w, idx, torch.roll(idx, -1, 1), 6, SMALL)
    assert grads['transformer.h.2.attn.c_v.weight'].abs().max() == 0


def test_loss_is_the_cross_entropy_of_the_soft_capped_logits():
    w, idx = trained_weights(3), tokens(3)
    targets = torch.roll(idx, -1, 1)
    w['lm_head.weight'] = 30 * w['lm_head.weight']  # logits beyond the cap
    logits = R.forward(w, idx, 6, SMALL)
    assert 0.9 * SMALL.logit_softcap < logits.abs().max() < SMALL.logit_softcap
    expected = F.cross_entropy(logits.view(-1, SMALL.vocab_size), targets.view(-1))
    torch.testing.assert_close(R.loss_fn(w, idx, targets, 6, SMALL), expected, rtol=1e-12, atol=0)


def test_at_initialization_the_zero_head_predicts_uniform_and_only_the_head_learns():
    """The record's first logged val loss, 10.8258, is ln(50304): its head starts at zero."""
    w, idx = R.init_weights(SMALL, torch.Generator().manual_seed(4), torch.float64), tokens(4)
    loss, grads = R.loss_and_grads(w, idx, torch.roll(idx, -1, 1), 6, SMALL)
    assert loss.item() == pytest.approx(math.log(SMALL.vocab_size), abs=1e-12)
    assert grads['lm_head.weight'].abs().max() > 0
    assert all(g.abs().max() == 0 for n, g in grads.items() if n != 'lm_head.weight')


def test_block_0s_value_mix_has_no_effect_and_the_others_do():
    w, idx = trained_weights(5), tokens(5)
    _, grads = R.loss_and_grads(w, idx, torch.roll(idx, -1, 1), 6, SMALL)
    lamb = [grads[f'transformer.h.{i}.attn.lamb'].abs().item() for i in range(SMALL.n_layer)]
    assert lamb[0] == 0 and min(lamb[1:]) > 0


@pytest.mark.parametrize('step, window', [(0, 64), (64, 64), (65, 128), (130, 192), (875, 896), (1000, 1024),
                                          (1749, 1728), (1750, 1792)])
def test_window_schedule_at_hand_computed_steps(step, window):
    # 64 * floor((step / 1750 * 1728 + 64) / 64): e.g. step 65: 64.18 + 64 -> 128; step 875: 864 + 64 = 928 -> 896
    assert R.window_at(step, R.RecordConfig()) == window


@pytest.mark.parametrize('step, factor, momentum', [(0, 1.0, 0.85), (150, 1.0, 0.90), (300, 1.0, 0.95),
                                                    (1109, 1.0, 0.95), (1110, 1.0, 0.95), (1111, 639 / 640, 0.95),
                                                    (1749, 1 / 640, 0.95)])
def test_lr_and_momentum_schedules_at_hand_computed_steps(step, factor, momentum):
    cfg = R.RecordConfig()
    assert R.lr_factor(step, cfg) == pytest.approx(factor, abs=1e-15)
    assert R.muon_momentum_at(step, cfg) == pytest.approx(momentum, abs=1e-15)


@pytest.mark.parametrize('step', [0, 1500])
def test_adams_first_step_moves_each_element_by_its_groups_scheduled_lr(step):
    """Adam's first step (bias-corrected) is lr * g / (|g| + eps): lr where the gradient is far from 0."""
    w, idx = trained_weights(6), tokens(6)
    loss, grads, new, state = R.train_step(w, {}, idx, torch.roll(idx, -1, 1), step, SMALL)
    factor = 1.0 if step == 0 else (1750 - step) / 640
    groups = R.param_groups(w)
    for group, lr in (('embed', 0.6), ('head', 0.008), ('scalar', 0.04)):
        for name in groups[group]:
            moved, g = (w[name] - new[name]).abs(), grads[name]
            strong = g.abs() > 1e-4
            torch.testing.assert_close(moved[strong], torch.full_like(moved[strong], lr * factor), rtol=1e-3, atol=0)
            assert state[name]['step'] == 1
    unseen = torch.ones(SMALL.vocab_size, dtype=torch.bool)
    unseen[idx.unique()] = False
    assert torch.equal(new['transformer.wte.weight'][unseen], w['transformer.wte.weight'][unseen])


def test_muons_update_is_orthogonalized_scaled_and_its_momentum_sums_gradients():
    w, idx = trained_weights(7), tokens(7)
    targets = torch.roll(idx, -1, 1)
    _, grads, new, state = R.train_step(w, {}, idx, targets, 0, SMALL)
    for name in R.param_groups(w)['muon']:
        update = (w[name] - new[name]) / SMALL.muon_lr
        scale = 2.0 if name.endswith('c_fc.weight') else 1.0  # sqrt(max(1, rows / cols)): 4d x d, the others d wide
        s = torch.linalg.svdvals(update / scale)
        assert s.max() < 1.25 and torch.quantile(s, 0.25) > 0.6, name
        u, _, vh = torch.linalg.svd(grads[name], full_matrices=False)  # the first step's direction: polar(g)
        assert F.cosine_similarity(update.flatten(), (u @ vh).flatten(), dim=0) > 0.9, name
    # a second step: buffer = momentum * buffer + gradient (not an average), Nesterov's update from gradient + buffer
    _, grads2, new2, state2 = R.train_step(new, state, idx, targets, 150, SMALL)
    name = 'transformer.h.1.attn.c_q.weight'
    buffer = 0.9 * grads[name] + grads2[name]
    torch.testing.assert_close(state2[name]['momentum_buffer'], buffer)
    nesterov = R.newton_schulz(grads2[name] + 0.9 * buffer, SMALL)
    torch.testing.assert_close(new[name] - new2[name], SMALL.muon_lr * nesterov)


def test_newton_schulz_in_bf16_as_the_record_is_float64s_to_bf16_precision():
    g = torch.randn(32, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    exact = R.newton_schulz(g, SMALL)
    bf16 = R.newton_schulz(g, R.RecordConfig(ns_dtype=torch.bfloat16))
    assert bf16.dtype == torch.bfloat16 and exact.dtype == torch.float64
    assert 0 < (bf16.double() - exact).norm() / exact.norm() < 0.05
