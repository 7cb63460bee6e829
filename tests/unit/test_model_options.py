"""model.py's modern architecture options (GPTConfig: pos_emb, norm, qk_norm, mlp, tie_weights, zero_init_proj,
logit_softcap, value_embeds, unet_skips, x0_shortcut, embed_norm, norm_gain, value_residual, value_scale,
no_attn_layer, rope_truncated, weight_init, attn_window, attn_window_block, doc_token): the default path against the
implementation before them, bit for bit; each option where it acts; logit soft-capping in the chunked loss against a
naive full-logits reference, forward and backward."""
import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F

import flash_varlen_on_a_cpu
import model as model_lib
from training.chunked_loss import chunked_cross_entropy
from helpers import ROOT, loss_and_gradients, loss_budgets, softcap_inputs, tokens_with_documents
from model import (GPT, Attention, GPTConfig, KVCache, LayerNorm, apply_rotary, blocked_attention, local_attention_mask,
                   rotary_cos_sin, value_embed_table)
from training import attention as kernels
from training.attention import Kernels
from training.opcount import OperatorCounter


# modded-nanogpt's later records: value embeddings, U-net skip connections, the embedding shortcut
LATER = dict(value_embeds=1, unet_skips=True, x0_shortcut=True)
# attention over packed documents: a window shorter than block_size (blocked_attention's path), documents at token 3
PACKED = dict(attn_window=6, doc_token=3)
MODERN = dict(pos_emb='rope', norm='rmsnorm', qk_norm=True, mlp='relu2', tie_weights=False, zero_init_proj=False,
              logit_softcap=3.0, **LATER, **PACKED)
SHAPE = dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=50)


def reference_module():
    """tests/gpt2_model_reference.py: model.py before the options, imported under its own name."""
    spec = importlib.util.spec_from_file_location('gpt2_model_reference', ROOT / 'tests' / 'gpt2_model_reference.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(model, x, y, seed=0):
    """(loss, gradients by name, per-position losses, last-position logits) of one forward-backward."""
    torch.manual_seed(seed)  # dropout's masks
    _, loss = model(x, y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        _, losses = model(x, y, reduction='none')
        logits, _ = model(x)
    model.train()
    return loss.detach(), grads, losses, logits


@pytest.mark.parametrize('bias, dropout, checkpointing', [(True, 0.0, False), (False, 0.1, True)])
def test_default_architecture_is_the_previous_implementation_to_the_bit(bias, dropout, checkpointing):
    reference = reference_module()
    x = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    y[0, :5] = -1
    torch.manual_seed(1337)
    previous = reference.GPT(reference.GPTConfig(**SHAPE, bias=bias, dropout=dropout))
    previous.activation_checkpointing = checkpointing  # the previous model's switch: an attribute
    torch.manual_seed(1337)
    # the architecture to the bit; the loss is the previous one's too (the chunks' sizing and arithmetic have changed
    # since, within rounding: tests/unit/test_model.py)
    model = GPT(GPTConfig(**SHAPE, bias=bias, dropout=dropout), activation_checkpointing=checkpointing,
                loss_fn=reference.chunked_cross_entropy)
    results = [(m.state_dict(), *run(m, x, y)) for m in (previous, model)]
    (state_a, loss_a, grads_a, losses_a, logits_a), (state_b, loss_b, grads_b, losses_b, logits_b) = results
    assert state_a.keys() == state_b.keys() and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    assert torch.equal(loss_a, loss_b) and torch.equal(losses_a, losses_b) and torch.equal(logits_a, logits_b)
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[k], grads_b[k]) for k in grads_a)


def softcapped_naive(h, w, t, softcap, reduction='mean'):
    logits = h @ w.t()
    return F.cross_entropy(softcap * torch.tanh(logits / softcap), t, ignore_index=-1, reduction=reduction)


@pytest.mark.parametrize('dtype, tolerance', [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize('budget', loss_budgets(70, 97))  # softcap_inputs' rows and vocabulary
def test_softcap_loss_and_gradients_match_naive(dtype, tolerance, budget):
    h, w, t = softcap_inputs(dtype)
    loss = chunked_cross_entropy(h, w, t, chunk_bytes=budget, softcap=5.0)
    grads = torch.autograd.grad(loss, (h, w))
    expected = softcapped_naive(h, w, t, 5.0)
    expected_grads = torch.autograd.grad(expected, (h, w))
    torch.testing.assert_close(loss, expected, rtol=tolerance, atol=tolerance)
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance)
    with torch.no_grad():
        torch.testing.assert_close(chunked_cross_entropy(h, w, t, chunk_bytes=budget, softcap=5.0),
                                   expected.detach(), rtol=tolerance, atol=tolerance)
        rows = chunked_cross_entropy(h, w, t, chunk_bytes=budget, softcap=5.0, reduction='none')
        torch.testing.assert_close(rows, softcapped_naive(h, w, t, 5.0, 'none'), rtol=tolerance, atol=tolerance)
    assert (rows[t == -1] == 0).all()
    # the cap changes the loss: a test of it that would pass without it is no test
    assert abs(loss.item() - F.cross_entropy(h @ w.t(), t, ignore_index=-1).item()) > 0.1


@pytest.mark.parametrize('budget', loss_budgets(70, 97))
def test_softcap_under_bf16_autocast_is_close_to_fp32(budget):
    h, w, t = softcap_inputs(torch.float32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = chunked_cross_entropy(h, w, t, chunk_bytes=budget, softcap=5.0)
    grads = torch.autograd.grad(loss, (h, w))
    expected = softcapped_naive(h, w, t, 5.0)
    torch.testing.assert_close(loss, expected, rtol=2e-2, atol=2e-2)
    for got, want in zip(grads, torch.autograd.grad(expected, (h, w))):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=2e-3)


def test_rotary_attention_scores_depend_only_on_the_distance():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)
    cos, sin = rotary_cos_sin(torch.arange(40), 8)
    cos, sin = cos.double(), sin.double()

    def score(m, n):
        return (apply_rotary(q, cos[m:m + 1], sin[m:m + 1]) * apply_rotary(k, cos[n:n + 1], sin[n:n + 1])).sum()
    # the angles are fp32 (rotary_cos_sin's): position 30's carry fp32 rounding, beyond float64's default tolerance
    torch.testing.assert_close(score(3, 1), score(30, 28), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rotary(q, cos[:1], sin[:1]), q)  # position 0: no rotation
    assert not torch.allclose(score(3, 1), score(3, 2))


def test_rmsnorm_and_relu2_compute_what_they_say():
    x = torch.randn(4, 16, dtype=torch.float64)
    norm = LayerNorm(16, bias=True, rms=True).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    assert norm.bias is None  # RMSNorm has none
    torch.testing.assert_close(norm(x), x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * norm.weight)
    mlp = model_lib.MLP(GPTConfig(**SHAPE, mlp='relu2')).double()
    torch.testing.assert_close(mlp(x), mlp.c_proj(F.relu(mlp.c_fc(x)) ** 2))


def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys():
    torch.manual_seed(0)
    attn = model_lib.CausalSelfAttention(GPTConfig(**SHAPE, qk_norm=True)).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    before, _ = attn(x)
    with torch.no_grad():
        attn.c_attn.weight[:32].mul_(10.0)  # the query and key rows
        attn.c_attn.bias[:32].mul_(10.0)
    torch.testing.assert_close(attn(x)[0], before)
    attn.qk_norm = False
    assert not torch.allclose(attn(x)[0], before)


def test_modern_state_dict_rope_has_no_table_and_the_untied_head_its_own_matrix():
    model = GPT(GPTConfig(**SHAPE, **MODERN))
    state = model.state_dict()
    assert 'transformer.wpe.weight' not in state and 'transformer.ln_f.bias' not in state
    assert model.lm_head.weight is not model.transformer.wte.weight
    # less wte and the value-embedding table: embeddings
    assert model.get_num_params() == sum(p.numel() for p in model.parameters()) - 2 * 50 * 16
    model.crop_block_size(8)
    assert model.config.block_size == 8
    default = GPT(GPTConfig(**SHAPE))
    assert default.lm_head.weight is default.transformer.wte.weight


def test_zero_init_projections_start_every_block_as_identity_and_the_head_uniform():
    model = GPT(GPTConfig(**SHAPE, tie_weights=False, zero_init_proj=True))
    for name, p in model.named_parameters():
        if name.endswith('c_proj.weight') or name == 'lm_head.weight':
            assert (p == 0).all(), name
    x = torch.randint(0, 50, (2, 16))
    _, loss = model(x, x)
    assert loss.item() == pytest.approx(math.log(50), abs=1e-6)  # every token equally likely
    tied = GPT(GPTConfig(**SHAPE, zero_init_proj=True))  # tied: the head is wte, which stays random
    assert tied.lm_head.weight.abs().sum() > 0


def test_modern_gpt_matches_a_full_logits_reference_in_loss_gradients_and_inference_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, **MODERN)).double()
    x, y = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    y[1, 3:] = -1
    chunked = loss_and_gradients(model, x, y)
    naive = lambda h, w, t, ignore_index, reduction, softcap: softcapped_naive(h, w, t, softcap, reduction)
    state, model = model.state_dict(), GPT(model.config, loss_fn=naive).double()
    model.load_state_dict(state)
    torch.testing.assert_close(chunked, loss_and_gradients(model, x, y))
    # the logits of generation are capped as the loss's are: the last position's loss from either agrees
    logits, _ = model(x)
    assert logits.abs().max() < MODERN['logit_softcap']
    with torch.no_grad():
        _, losses = model(x, y, reduction='none')
    last = F.cross_entropy(logits[[0, 2], -1], y[[0, 2], -1], reduction='none')
    torch.testing.assert_close(last, losses[[0, 2], -1])


def test_modern_activation_checkpointing_same_loss_and_gradients():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, **MODERN))
    x = torch.randint(0, 50, (3, 16))
    plain_loss, plain_grads = loss_and_gradients(model, x, x)
    state, model = model.state_dict(), GPT(model.config, activation_checkpointing=True)
    model.load_state_dict(state)
    loss, grads = loss_and_gradients(model, x, x)
    assert torch.equal(loss, plain_loss) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))


def test_a_default_architecture_checkpoint_loads_in_the_previous_model_py():
    """train.py's model_args and state dict of a GPT-2 architecture, as nanoGPT's model.py (the reference has its
    GPTConfig) reads a ckpt.pt: GPTConfig(**model_args), then load_state_dict."""
    from training import configurator
    from training import rules
    config = {**configurator.train_defaults(), **SHAPE, 'device': 'cpu', 'dtype': 'float32'}
    model_args, _ = rules.model_args(config, 50)
    state = GPT(GPTConfig(**model_args)).state_dict()
    reference = reference_module()
    reference.GPT(reference.GPTConfig(**model_args)).load_state_dict(state)  # strict: the same keys and shapes
    # a modern model's model_args carry keys nanoGPT's GPTConfig does not take: an error, not a GPT-2 built silently
    with pytest.raises(TypeError):
        reference.GPTConfig(**rules.model_args({**config, 'pos_emb': 'rope'}, 50)[0])


def test_value_embedding_tables_serve_the_first_and_last_blocks_in_mirror():
    config = GPTConfig(**{**SHAPE, 'n_layer': 7}, value_embeds=3)
    assert [value_embed_table(config, i) for i in range(7)] == [0, 1, 2, None, 0, 1, 2]
    model = GPT(config)
    assert [block.attn.value_lambdas is not None for block in model.transformer.h] == [True] * 3 + [False] + [True] * 3
    assert len(model.transformer.value_embeds) == 3
    default = GPT(GPTConfig(**SHAPE))
    assert default.transformer.value_embeds is None and default.skip_weights is None


def test_value_embeds_adds_the_tokens_table_row_to_the_values_of_its_blocks():
    """The other weights are the same seed's as without the tables; at weights (1, 0) the values are the plain ones."""
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SHAPE))
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, value_embeds=1))
    state = model.state_dict()
    assert all(torch.equal(value, state[name]) for name, value in plain.state_dict().items())
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    _, loss = model(x, x)
    loss.backward()
    for block in model.transformer.h:  # both blocks share table 0, and learn their mix
        assert block.attn.value_lambdas.grad.abs().min() > 0
    assert model.transformer.value_embeds[0].weight.grad[x.unique()].abs().sum(1).min() > 0  # the tokens' rows
    assert loss.item() != plain(x, x)[1].item()
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.value_lambdas.copy_(torch.tensor([1.0, 0.0]))
        assert torch.equal(model(x, x)[1], plain(x, x)[1])
        # attention is linear in the values: zero rows at weights (0.5, 0.5) halve what the values contribute
        attn, plain_attn = model.transformer.h[0].attn, plain.transformer.h[0].attn
        attn.value_lambdas.copy_(torch.tensor([0.5, 0.5]))
        h = torch.randn(1, 4, 16)
        bias = plain_attn.c_proj.bias
        (y, _), (plain_y, _) = attn(h, value_embed=torch.zeros(1, 4, 16)), plain_attn(h)
        torch.testing.assert_close(y, 0.5 * (plain_y - bias) + bias)


def block_inputs_and_outputs(model, x):
    """The residual stream going into and out of each block in a forward of x."""
    seen = []
    hooks = [block.register_forward_hook(lambda module, args, out: seen.append((args[0], out[0])))
             for block in model.transformer.h]
    model(x, x)
    for hook in hooks:
        hook.remove()
    return seen


def test_unet_skips_add_the_first_half_of_the_blocks_outputs_to_the_mirrored_inputs():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SHAPE, 'n_layer': 5}, unet_skips=True))
    with torch.no_grad():
        model.skip_weights.copy_(torch.tensor([0.7, -1.3]))
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    (in0, out0), (in1, out1), (in2, out2), (in3, out3), (in4, _) = block_inputs_and_outputs(model, x)
    torch.testing.assert_close(in2, out1)  # the middle block of an odd count has no mirror
    torch.testing.assert_close(in3, out2 - 1.3 * out1)  # innermost pair first
    torch.testing.assert_close(in4, out3 + 0.7 * out0)
    _, loss = model(x, x)
    loss.backward()
    assert model.skip_weights.grad.abs().min() > 0
    plain = GPT(GPTConfig(**{**SHAPE, 'n_layer': 5}))
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != 'skip_weights'})
    with torch.no_grad():  # at weights 0 it is the plain model
        model.skip_weights.zero_()
        assert torch.equal(model(x, x)[1], plain(x, x)[1])


def test_x0_shortcut_starts_as_the_plain_model_and_learns_to_mix_the_embedding_in():
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**SHAPE))
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, x0_shortcut=True))
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    _, loss = model(x, x)
    assert torch.equal(loss, plain(x, x)[1])  # weights (1, 0): each block's input as it was
    loss.backward()
    for block in model.transformer.h:
        assert block.x0_lambdas.grad.abs().min() > 0  # the embedding's weight too, from 0
    with torch.no_grad():
        model.transformer.h[1].x0_lambdas.copy_(torch.tensor([0.5, 2.0]))
    (in0, _), (in1, out1) = block_inputs_and_outputs(model, x)
    embedding = model.transformer.wte(x) + model.transformer.wpe(torch.arange(16))
    torch.testing.assert_close(out1, plain.transformer.h[1](0.5 * in1 + 2.0 * embedding)[0])
    torch.testing.assert_close(in0, embedding)



def test_every_layer_runs_the_attention_its_forward_chose_by_name(monkeypatch, flash_kernel):
    """GPT.attention picks one kind a forward, from the config, the call's attn_window, the kernel and the cache, and
    every layer's attention runs that kind; a kind it does not know is an error."""
    kinds = []
    attend = model_lib.attend
    monkeypatch.setattr(model_lib, 'attend', lambda q, k, v, attention, cache, dropout_p:
                        kinds.append(kernels.kind(attention)) or attend(q, k, v, attention, cache, dropout_p))
    x = tokens_with_documents((2, 16), 1)

    def run(config, forward_args={}, **options):
        kinds.clear()
        model = GPT(GPTConfig(**SHAPE, pos_emb='rope', **config), **options).eval()
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            model(x, **forward_args)
        return kinds
    assert run({}) == ['causal'] * 2
    assert run(dict(attn_window=16)) == ['causal'] * 2  # a window as long as the sequence: causal alone
    assert run(dict(attn_window=6)) == ['window'] * 2
    assert run(dict(attn_window=16), dict(attn_window=6)) == ['window'] * 2  # the call's window
    assert run(dict(doc_token=3)) == ['masked'] * 2
    assert run(dict(attn_window=6, doc_token=3), kernels=Kernels(flash=True)) == ['varlen'] * 2
    assert run(dict(attn_window=6, doc_token=3), kernels=Kernels(flash=False)) == ['window'] * 2
    assert run({}, dict(cache=KVCache(GPTConfig(**SHAPE), 2, 16, 'cpu', torch.bfloat16))) == ['cache'] * 2
    with pytest.raises(ValueError, match="'sparse'"):
        model_lib.CausalSelfAttention(GPTConfig(**SHAPE))(torch.randn(1, 4, 16), attention=Attention('sparse'))


@pytest.mark.parametrize('t, window, doc_token, kind', [(16, 6, 3, 'window'), (16, 4, -1, 'window'),
                                                      (13, 5, 3, 'window'), (16, 0, 3, 'masked'),
                                                      (16, 16, -1, 'causal')],
                         ids=['window and documents', 'window', 'window, padded block', 'documents', 'whole block'])
def test_attention_in_blocks_is_attention_under_the_dense_mask(monkeypatch, t, window, doc_token, kind):
    """attn_window's blocked_attention (each block of queries against two blocks of keys) and doc_token's mask give the
    loss and gradients of attention under the whole (t, t) mask of what each position may see."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, pos_emb='rope', attn_window=window, doc_token=doc_token)).double()
    x, y = tokens_with_documents((3, t), 1), torch.randint(0, 50, (3, t), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(t)
    docs = (x == doc_token).cumsum(1) if doc_token >= 0 else torch.zeros_like(x)
    dense = local_attention_mask(pos, pos, window, docs, docs).unsqueeze(1)
    assert model.attention(x, pos, None, window).kind == kind
    blocked = loss_and_gradients(model, x, y)
    monkeypatch.setattr(model, 'attention', lambda idx, pos, cache, window: Attention('masked', mask=dense))
    torch.testing.assert_close(blocked, loss_and_gradients(model, x, y))


def test_a_window_in_blocks_of_a_part_of_a_block_is_refused():
    """A window of 6 in blocks of 4 would be one block (4 positions) in rows longer than 6 and causal (all) in shorter
    ones: the same position seeing more or less by the row's length. train.py refuses it (training.rules); so does
    model.py alone."""
    with pytest.raises(AssertionError, match='attn_window=6 must be a multiple of attn_window_block=4'):
        GPT(GPTConfig(**SHAPE, attn_window=6, attn_window_block=4))


def test_a_position_sees_only_its_window_of_its_own_document():
    """One block: the loss at position i changes with the token at j exactly when j is one of the attn_window=4
    positions up to i and no doc_token starts a document in (j, i]."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SHAPE, 'n_layer': 1}, pos_emb='rope', attn_window=4, doc_token=3)).double().eval()
    x, y = tokens_with_documents((1, 16), 1, every=7), torch.randint(0, 50, (1, 16))  # documents start at 2 and 9
    document = (x[0] == 3).cumsum(0).tolist()
    with torch.no_grad():
        base = model(x, y, reduction='none')[1][0]
        for j in [j for j in range(16) if x[0, j] != 3]:  # replacing a doc_token would move a document's start
            changed = x.clone()
            changed[0, j] = 4 if x[0, j] != 4 else 5
            moved = (model(changed, y, reduction='none')[1][0] - base).abs() > 1e-12
            assert moved.tolist() == [0 <= i - j < 4 and document[i] == document[j] for i in range(16)], j


@pytest.mark.parametrize('window, doc_token', [(6, 3), (0, 3), (4, -1)])
def test_document_attention_passes_flash_attentions_kernel_the_documents_and_window(monkeypatch, flash_kernel,
                                                                                    window, doc_token):
    """On CUDA attention runs torch's varlen_attn over document_segments' segments; with kernels that compute what
    FlashAttention's does (flash_varlen_on_a_cpu), that gives blocked_attention's loss and gradients (the mask of what
    each position may see)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, pos_emb='rope', qk_norm=True, attn_window=window, doc_token=doc_token)).double()
    x, y = tokens_with_documents((3, 16), 1), torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    blocked = loss_and_gradients(model, x, y)
    model.kernels = Kernels()
    monkeypatch.setattr(Kernels, 'varlen_kernel', lambda self, device, dtype, head_size: flash_kernel)
    with flash_varlen_on_a_cpu.full_precision(), OperatorCounter() as operators:  # in fp64: a key let in or out
        flash = loss_and_gradients(model, x, y)                                  # shows above rounding
    torch.testing.assert_close(blocked, flash)
    # the count of documents, read from the GPU once a forward (nonzero): the only wait for it, whatever the layers
    assert sum(operators.waits.values()) == 1


def test_flash_attentions_kernel_gets_autocasts_dtype_whatever_the_values_mix_in(flash_kernel):
    """Under bf16 autocast, value_residual's and value_embeds' fp32 lambdas and qk_norm make fp32 values, queries and
    keys: the kernel, which takes only fp16 and bf16 (its stand-in too), gets all three in bf16, forward and
    backward, and its output is bf16 like the masked attention's."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, pos_emb='rope', qk_norm=True, value_residual=True, value_embeds=1, attn_window=6,
                          doc_token=3), kernels=Kernels(flash=True))
    x, y = tokens_with_documents((2, 16), 1), torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(2))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        attention = model.attention(x, torch.arange(16), None, 6)
        assert kernels.kind(attention) == 'varlen' and attention.kernel[2] == torch.bfloat16
        loss, grads = loss_and_gradients(model, x, y)
    assert loss.isfinite() and all(g.isfinite().all() for g in grads)
    assert model.transformer.h[1].attn.v1_lambda.grad.abs() > 0  # the values' mix reaches the loss through the kernel


@pytest.mark.parametrize('kernel', ['blocks', 'varlen'])
def test_a_calls_attn_window_is_the_model_built_with_that_window(monkeypatch, request, kernel):
    """A window warmup's window of the moment (forward's attn_window) gives the loss and gradients of the same weights
    built with that attn_window, in blocked_attention and through torch's varlen_attn (on CPU kernels)."""
    if kernel == 'varlen':
        flash_kernel = request.getfixturevalue('flash_kernel')
        monkeypatch.setattr(Kernels, 'varlen_kernel', lambda self, device, dtype, head_size: flash_kernel)
    torch.manual_seed(0)
    wide, narrow = (GPT(GPTConfig(**SHAPE, pos_emb='rope', attn_window=window, doc_token=3), kernels=Kernels()).double()
                    for window in (8, 3))
    narrow.load_state_dict(wide.state_dict())
    x, y = tokens_with_documents((3, 16), 1, every=9), torch.randint(0, 50, (3, 16))
    with flash_varlen_on_a_cpu.full_precision():  # in fp64: the two models' results agree to rounding, not to bf16's
        torch.testing.assert_close(loss_and_gradients(wide, x, y, attn_window=3), loss_and_gradients(narrow, x, y))
        assert loss_and_gradients(wide, x, y)[0] != loss_and_gradients(narrow, x, y)[0]  # None: the model's own 8


def test_flash_attentions_kernel_runs_where_it_can(flash_kernel):
    """CUDA (or flash=True, as the estimator traces), bf16 or fp16 by autocast or weights, heads the kernel takes, no
    dropout; never with flash=False, nor without kernels (model.py alone)."""
    config = GPTConfig(**SHAPE, attn_window=6, dropout=0.1)
    idx = torch.zeros(1, 16, dtype=torch.long)

    def kind(model):
        return kernels.kind(model.attention(idx, torch.arange(16), None, 6))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert kind(GPT(config, kernels=Kernels()).eval()) == 'window'  # a CPU tensor
        assert kind(GPT(config, kernels=Kernels(flash=False)).eval()) == 'window'
        assert kind(GPT(config).eval()) == 'window'
    model = GPT(config, kernels=Kernels(flash=True)).eval()
    assert kind(model) == 'window'  # fp32
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert kind(model) == 'varlen' and model.attention(idx, torch.arange(16), None, 6).kernel[1] is flash_kernel
        model.train()
        assert kind(model) == 'window'  # dropout, which the kernel does not apply
    model.eval().to(torch.float16)
    assert kind(model) == 'varlen'
    for n_embd in (24, 528):  # heads 12 and 264 wide: FlashAttention takes multiples of 8 up to 256
        other = GPT(GPTConfig(**{**SHAPE, 'n_embd': n_embd}, attn_window=6), kernels=Kernels(flash=True))
        assert kind(other.eval().to(torch.float16)) == 'window'


def test_mfu_counts_attention_over_the_window():
    """A position attends to attn_window positions, whatever block_size: 4 windows of 64 tokens and one sequence of 256
    windowed at 64 are the same FLOPs; without the window, the 256-token sequence's attention costs more."""
    shape = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=50, pos_emb='rope')
    short, packed, dense = (GPT(GPTConfig(**shape, block_size=block, attn_window=window))
                            for block, window in [(64, 0), (256, 64), (256, 0)])
    assert short.estimate_mfu(4, 1.0) == packed.estimate_mfu(1, 1.0) < dense.estimate_mfu(1, 1.0)
    assert dense.estimate_mfu(1, 1.0, attn_window=64) == packed.estimate_mfu(1, 1.0)  # a window warmup's window


def test_embed_norm_starts_the_stream_at_rms_1_and_x0_shortcut_takes_the_normed_embedding():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SHAPE, embed_norm=True, x0_shortcut=True))
    with torch.no_grad():
        model.transformer.h[1].x0_lambdas.copy_(torch.tensor([0.5, 2.0]))
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    (in0, _), (in1, out1) = block_inputs_and_outputs(model, x)
    embedding = model.transformer.wte(x) + model.transformer.wpe(torch.arange(16))
    normed = embedding / embedding.square().mean(-1, keepdim=True).add(torch.finfo(torch.float32).eps).sqrt()
    torch.testing.assert_close(in0, normed)
    torch.testing.assert_close(in0.square().mean(-1), torch.ones(2, 16), rtol=1e-3, atol=0)  # eps: 1.2e-7 / 8e-4
    torch.testing.assert_close(out1, model.transformer.h[1](in1, x0=normed)[0])  # x0 is the normed embedding
    assert not torch.allclose(out1, model.transformer.h[1](in1, x0=embedding)[0])


def test_norm_gain_false_has_no_weights_and_torchs_default_eps():
    """The record's F.rms_norm(x, (d,)): no weight, eps the dtype's machine epsilon (in float64 too)."""
    model = GPT(GPTConfig(**SHAPE, norm='rmsnorm', norm_gain=False, bias=True))
    assert not any('ln_' in name for name, _ in model.named_parameters())
    x = torch.randn(3, 16, dtype=torch.float64) * 1e-5  # small: the eps shows
    for dtype in (torch.float64, torch.float32):
        h, eps = x.to(dtype), torch.finfo(dtype).eps
        torch.testing.assert_close(model.transformer.ln_f(h), h / h.square().mean(-1, keepdim=True).add(eps).sqrt())
    with_gain = LayerNorm(16, bias=False, rms=True)
    assert not torch.allclose(with_gain(x.float()), model.transformer.ln_f(x.float()))  # eps 1e-5 there


def test_value_residual_mixes_block_0s_values_into_every_blocks():
    """Block 0 mixes its values with themselves (its lamb has no effect, as the record's); at lamb 0 each block has its
    own values (the plain model); at lamb 1 a block's own value projection no longer matters, block 0's replace it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**SHAPE, 'n_layer': 3}, value_residual=True))
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**{**SHAPE, 'n_layer': 3}))
    assert [block.attn.v1_lambda.item() for block in model.transformer.h] == [0.5] * 3
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    _, loss = model(x, x)
    loss.backward()
    assert model.transformer.h[0].attn.v1_lambda.grad.abs() < 1e-9  # (1 - lamb) v + lamb v: no gradient
    assert all(block.attn.v1_lambda.grad.abs() > 0 for block in model.transformer.h[1:])
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.v1_lambda.zero_()
        torch.testing.assert_close(model(x, x)[1], plain(x, x)[1], rtol=0, atol=0)
        model.transformer.h[2].attn.v1_lambda.fill_(1.0)
        before = model(x, x)[1]
        model.transformer.h[2].attn.c_attn.weight[32:].normal_()  # block 2's value rows
        torch.testing.assert_close(model(x, x)[1], before, rtol=0, atol=0)
        model.transformer.h[0].attn.c_attn.weight[32:].normal_()  # block 0's: the values every block mixes in
        assert not torch.allclose(model(x, x)[1], before)


def test_weight_init_pytorch_keeps_the_modules_own_initialization():
    """weight_init='pytorch' (the record's): the embedding N(0, 1), every Linear U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    c_proj too unless zero_init_proj zeroes it (and the untied head); GPT-2's init draws N(0, 0.02)."""
    config = dict(n_layer=2, n_head=2, n_embd=64, block_size=16, vocab_size=512, bias=False, tie_weights=False)
    model = GPT(GPTConfig(**config, weight_init='pytorch'))
    assert 0.95 < model.transformer.wte.weight.std() < 1.05
    for name, p in model.named_parameters():
        if p.dim() == 2 and 'wte' not in name and 'wpe' not in name:
            bound = 1 / math.sqrt(p.size(1))
            assert p.abs().max() <= bound and p.abs().max() > 0.95 * bound, name
    zeroed = GPT(GPTConfig(**config, weight_init='pytorch', zero_init_proj=True))
    assert all(p.abs().max() == 0 for name, p in zeroed.named_parameters()
               if name.endswith(('c_proj.weight', 'lm_head.weight')))
    assert 0.019 < GPT(GPTConfig(**config)).transformer.wte.weight.std() < 0.021


def test_rotary_frequencies_are_the_records_to_the_bit():
    """1 / base ** (2i / d) in fp32, as modded-nanogpt computes them (base ** -(2i / d) differs by an ulp at d=128)."""
    pos = torch.arange(4096)
    cos, sin = rotary_cos_sin(pos, 128)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128))
    angles = torch.outer(pos.float(), inv_freq)
    assert torch.equal(cos, angles.cos()) and torch.equal(sin, angles.sin())


def test_value_scale_scales_the_values_of_blocks_without_a_table():
    """value_scale: every attention has value_lambdas; a block without a table multiplies its values by the first (its
    attention output scales with it, as attention is linear in the values) and leaves the second untouched."""
    config = dict(SHAPE, n_layer=4, value_embeds=1)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**config))
    torch.manual_seed(0)
    model = GPT(GPTConfig(**config, value_scale=True))
    assert [block.attn.value_lambdas is not None for block in plain.transformer.h] == [True, False, False, True]
    assert all(block.attn.value_lambdas is not None for block in model.transformer.h)
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    _, loss = model(x, x)
    loss.backward()
    for block in model.transformer.h[1:3]:  # no table: only the scale learns
        assert block.attn.value_lambdas.grad[0] != 0 and block.attn.value_lambdas.grad[1] == 0
    assert loss.item() != plain(x, x)[1].item()  # at 0.5, the middle blocks' values halve
    with torch.no_grad():
        for block in model.transformer.h[1:3]:
            block.attn.value_lambdas[0] = 1.0
        torch.testing.assert_close(model(x, x)[1], plain(x, x)[1], rtol=0, atol=0)


def test_no_attn_layer_leaves_that_block_its_mlp_alone():
    """The block has no attention nor its norm (no parameter without a gradient); its output is x + mlp(norm(x)) of
    its input, and the other blocks keep theirs."""
    shape = {**SHAPE, 'n_layer': 3, 'bias': False}
    model = GPT(GPTConfig(**shape, no_attn_layer=1))
    block = model.transformer.h[1]
    assert block.attn is None and block.ln_1 is None and model.transformer.h[2].attn is not None
    everywhere = GPT(GPTConfig(**shape))  # less c_attn, c_proj and ln_1's gain
    assert sum(p.numel() for p in model.parameters()) == \
        sum(p.numel() for p in everywhere.parameters()) - 4 * 16 * 16 - 16
    h = torch.randn(2, 5, 16)
    torch.testing.assert_close(block(h)[0], h + block.mlp(block.ln_2(h)))
    x = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    model(x, x)[1].backward()
    assert all(p.grad is not None for p in model.parameters())


def test_rope_truncated_turns_half_of_each_heads_pairs_from_1_to_1_1024_radians():
    """The first head_size / 4 pairs at (1/1024)**linspace(0, 1) radians a position, the others not at all: their
    dimensions pass unrotated, and the scores still depend only on the distance."""
    cos, sin = rotary_cos_sin(torch.arange(40), 16, truncated=True)
    angles = torch.atan2(sin[1], cos[1])
    torch.testing.assert_close(angles[:4], torch.tensor([1.0, 1024 ** (-1 / 3), 1024 ** (-2 / 3), 1 / 1024]))
    assert torch.equal(cos[:, 4:], torch.ones(40, 4)) and torch.equal(sin[:, 4:], torch.zeros(40, 4))
    q = torch.randn(1, 1, 1, 16, dtype=torch.float64)
    rotated = apply_rotary(q, cos[30:31].double(), sin[30:31].double())
    unturned = [*range(4, 8), *range(12, 16)]  # pairs (i, i + 8) for i from 4 to 7
    assert torch.equal(rotated[..., unturned], q[..., unturned]) and not torch.allclose(rotated, q)
    model, full = GPT(GPTConfig(**SHAPE, pos_emb='rope', rope_truncated=True)), GPT(GPTConfig(**SHAPE, pos_emb='rope'))
    with torch.no_grad():  # weights large enough that attention depends on the positions
        for p in model.parameters():
            p.normal_(generator=torch.Generator().manual_seed(p.numel()))
    full.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (1, 16), generator=torch.Generator().manual_seed(3))
    assert model(x, x)[1].item() != full(x, x)[1].item()


@pytest.mark.parametrize('options', [dict(doc_token=3), dict(attn_window=8, attn_window_block=4, doc_token=3)],
                         ids=['masked', 'window in blocks'])
def test_every_layer_keeps_the_one_attention_mask_of_its_forward_for_backward(options):
    """The mask goes to SDPA additive, in the compute dtype, made once a forward: a bool one SDPA converts in each
    layer and keeps each layer's copy for backward (0.6 GiB of the 12 GB speedrun preset's activations)."""
    model = GPT(GPTConfig(**{**SHAPE, 'n_layer': 3, 'block_size': 32}, **options))
    x = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(5))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t), \
            torch.autocast('cpu', dtype=torch.bfloat16):
        model(x, x)
    masks = [t for t in saved if t.dim() == 4 and t.size(1) == 1]  # SDPA's attn_mask: one for every head
    assert len(masks) == 3 and all(m.dtype == torch.bfloat16 for m in masks)  # one a layer, in autocast's dtype
    assert len({m.untyped_storage().data_ptr() for m in masks}) == 1  # the same tensor


def test_a_window_in_blocks_sees_whole_blocks_up_to_the_querys_own():
    """attn_window_block=4, window 8: query q sees every key k <= q of its document whose block k // 4 is q's or the
    one before, so from 4 to 7 positions back (not always the last 8 positions), as FlexAttention's block masks."""
    pos = torch.arange(16)
    docs = (torch.arange(16) >= 11).long()  # a document starts at 11
    mask = local_attention_mask(pos, pos, 8, docs, docs, block=4)
    brute = torch.tensor([[k <= q and q // 4 - k // 4 < 2 and docs[q] == docs[k] for k in range(16)]
                          for q in range(16)])
    assert torch.equal(mask, brute)
    assert mask[7].nonzero().view(-1).tolist() == list(range(0, 8))  # the last of block 1: 8 positions back
    assert mask[8].nonzero().view(-1).tolist() == [4, 5, 6, 7, 8]  # the first of block 2: from block 1's start
    assert mask[12].nonzero().view(-1).tolist() == [11, 12]  # its document starts at 11
    # the model: blocked_attention under this mask, the masked attention of every query and key, the same logits
    model = GPT(GPTConfig(**{**SHAPE, 'block_size': 32}, attn_window=8, attn_window_block=4, doc_token=3))
    x = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(5))
    attention = model.attention(x, torch.arange(32), None, 8)
    assert attention.kind == 'window'
    y = torch.randn(2, 2, 32, 8, dtype=torch.float64)
    docs = (x == 3).cumsum(1)
    dense = local_attention_mask(torch.arange(32), torch.arange(32), 8, docs, docs, block=4).unsqueeze(1)
    torch.testing.assert_close(blocked_attention(y, y, y, attention.mask.double(), 0.0),  # as SDPA's q
                               F.scaled_dot_product_attention(y, y, y, attn_mask=dense))
