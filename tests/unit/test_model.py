"""training/chunked_loss.py against the naive reference, model.py's GPT in nanoGPT's shape (compiled:
e2e/test_model.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from training import chunked_loss
from training import configurator
import model as model_lib
from training.chunked_loss import chunked_cross_entropy, naive_cross_entropy
from helpers import loss_and_grads, loss_budgets, loss_inputs, tiny_gpt
from model import GPT, GPTConfig
from training.memory.tracer import MemoryTracer
from training.step import build_model


def naive(h, w, t):
    return F.cross_entropy(h @ w.t(), t, ignore_index=-1)


BUDGETS = loss_budgets(300, 257)  # loss_inputs' rows and vocabulary


def test_the_budgets_make_the_chunks_their_names_say():
    """chunk_rows of loss_inputs' 300 rows: one row at 1 byte, a few (in fp32 a short last chunk), all rows in one
    chunk where the one piece just does not fit, and the one piece at the default budget."""
    one_row, few, one_chunk, default = (param.values[0] for param in BUDGETS)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        rows = [chunked_loss.chunk_rows(300, 257, 16, dtype, budget) for budget in (one_row, few, one_chunk)]
        assert rows[0] == 1 and 1 < rows[1] < 150 and rows[2] >= 300
        assert dtype != torch.float32 or 300 % rows[1] != 0
    assert chunked_loss.one_piece_bytes(300, 257, torch.float32) > one_chunk
    assert default is None and chunked_loss.one_piece_bytes(300, 257, torch.float64) <= chunked_loss.DEFAULT_CHUNK_BYTES


@pytest.mark.parametrize('budget', BUDGETS)
def test_fp64_and_fp32_match_naive_at_every_budget(budget):
    for dtype, tol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        h, w, t = loss_inputs(dtype=dtype)
        t[::5] = -1
        ref = loss_and_grads(naive, h, w, t)
        ours = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_bytes=budget), h, w, t)
        for a, b in zip(ref, ours):
            torch.testing.assert_close(b, a, rtol=tol, atol=tol)


@pytest.mark.parametrize('budget', BUDGETS)
def test_bf16_autocast_with_fp32_master_weights(monkeypatch, budget):
    # under the smallest budgets the weight gradient in 3 blocks of vocabulary: 257 = 100 + 100 + 57
    monkeypatch.setattr(chunked_loss, "VOCAB_BLOCK", 100)
    h, w, t = loss_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = loss_and_grads(naive, h, w, t)
        ours = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_bytes=budget), h, w, t)
    assert ours[2].dtype == torch.float32
    for a, b in zip(ref, ours):
        torch.testing.assert_close(b.float(), a.float(), rtol=5e-2, atol=5e-3)


@pytest.mark.parametrize('budget', loss_budgets(512, 4096))
def test_fp16_autocast_gradients_do_not_underflow(budget):
    """Per-entry gradients here are about 1 / (n * V) = 5e-7, below fp16's normal range: the softmax must be
    normalized (and 1/n applied) outside the fp16 operands, or the weight gradient loses over 1%. Here the errors
    are about 4e-4, the naive fp16 path's 7e-4."""
    h, w, t = loss_inputs(n=512, d=32, v=4096)
    with torch.no_grad():
        w.mul_(0.05)  # near-uniform softmax: the sum of exps is close to V
    ref = loss_and_grads(naive, h.double(), w.double(), t)
    with torch.autocast("cpu", dtype=torch.float16):
        ours = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_bytes=budget), h, w, t)
    for a, b in zip(ref, ours):
        assert ((b.double() - a).norm() / a.norm()).item() < 3e-3


@pytest.mark.parametrize('budget', BUDGETS)
def test_all_ignored_gives_zero_not_nan(budget):
    h, w, t = loss_inputs()
    ignored = torch.full_like(t, -1)
    loss, gh, gw = loss_and_grads(lambda *a: chunked_cross_entropy(*a, chunk_bytes=budget), h, w, ignored)
    assert loss.item() == 0 and gh.abs().sum() == 0 and gw.abs().sum() == 0


def test_upstream_gradient_scales_stored_gradients():
    """loss / k over k micro-batches equals one big batch; a GradScaler-like factor scales the gradients."""
    h, w, t = loss_inputs(n=200)
    full = loss_and_grads(naive, h, w, t)
    for rows in (slice(0, 100), slice(100, 200)):
        (chunked_cross_entropy(h[rows], w, t[rows], chunk_size=30) / 2 * 1024.0).backward()
    gh, gw = h.grad / 1024.0, w.grad / 1024.0
    torch.testing.assert_close(gh, full[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, full[2], rtol=1e-5, atol=1e-6)


def test_no_grad_computes_loss_only():
    h, w, t = loss_inputs()
    with torch.no_grad():
        loss = chunked_cross_entropy(h, w, t)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, naive(h, w, t).detach())


@pytest.mark.parametrize('budget', BUDGETS)
def test_reduction_none_matches_naive_per_row_losses(budget):
    for dtype, tol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        h, w, t = loss_inputs(dtype=dtype)
        t[::5] = -1
        with torch.no_grad():
            ours = chunked_cross_entropy(h, w, t, chunk_bytes=budget, reduction='none')
        ref = F.cross_entropy(h @ w.t(), t, ignore_index=-1, reduction='none')
        assert ours.shape == (300,) and ours.dtype == dtype
        assert (ours[::5] == 0).all() and (ours[1::5] > 0).all()
        torch.testing.assert_close(ours, ref.detach(), rtol=tol, atol=tol)


@pytest.mark.parametrize('budget', BUDGETS)
def test_reduction_none_under_bf16_autocast_and_all_ignored(budget):
    h, w, t = loss_inputs()
    t[1::3] = -1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ours = chunked_cross_entropy(h, w, t, chunk_bytes=budget, reduction='none')
        ref = F.cross_entropy(h @ w.t(), t, ignore_index=-1, reduction='none')
        nothing = chunked_cross_entropy(h, w, torch.full_like(t, -1), chunk_bytes=budget, reduction='none')
    assert ours.dtype == torch.float32  # as F.cross_entropy under autocast
    torch.testing.assert_close(ours, ref.float(), rtol=5e-2, atol=5e-2)
    assert nothing.shape == (300,) and (nothing == 0).all()


def test_reduction_none_refuses_gradients_and_unknown_reductions():
    h, w, t = loss_inputs()
    with pytest.raises(RuntimeError, match='no gradients'):
        chunked_cross_entropy(h, w, t, reduction='none')
    with pytest.raises(ValueError, match="'sum'"):
        chunked_cross_entropy(h, w, t, reduction='sum')


def largest_tensor(tracker):
    """The most elements of any tensor whose storage was allocated under `tracker` (since its last reset_peak)."""
    return max(math.prod(shape) for shape, _, _ in tracker.allocations)


def test_no_tensor_near_n_by_v_in_forward_and_backward():
    h, w, t = loss_inputs(n=4096, d=32, v=4096)
    with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker:
        chunked_cross_entropy(h, w, t, chunk_size=256).backward()
    assert largest_tensor(tracker) < 4096 * 4096 // 2


def test_backward_scales_the_saved_gradients_in_place():
    """No second copy of the (V, d) weight gradient in backward: the upstream factor is applied in place."""
    h, w, t = loss_inputs(n=512, d=32, v=4096)
    with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker:
        loss = chunked_cross_entropy(h, w, t, chunk_size=64) / 4
        tracker.reset_peak()  # from here on, what backward allocates
        loss.backward()
    assert largest_tensor(tracker) < w.numel()
    ref = loss_and_grads(naive, h, w, t)
    torch.testing.assert_close(h.grad, ref[1] / 4)
    torch.testing.assert_close(w.grad, ref[2] / 4)


def test_retained_graph_gives_the_right_gradients_each_backward():
    h, w, t = loss_inputs()
    ref = loss_and_grads(naive, h, w, t)
    loss = chunked_cross_entropy(h, w, t, chunk_size=64)
    for factor in (3.0, 5.0, 1.0):
        grads = torch.autograd.grad(loss, (h, w), grad_outputs=torch.tensor(factor), retain_graph=True)
        for ours, expected in zip(grads, ref[1:]):
            torch.testing.assert_close(ours, expected * factor)
    loss.backward()  # the last backward, graph freed: the in-place path
    torch.testing.assert_close(w.grad, ref[2])


def test_gpt_loss_matches_naive_head_and_tied_weight_gets_both_gradients():
    model = tiny_gpt()
    x = torch.randint(0, 50, (3, 16))
    logits, loss = model(x, x)
    assert logits is None
    loss.backward()
    ours = model.lm_head.weight.grad.clone()
    model.zero_grad()
    hidden = model.transformer.ln_f(_blocks(model, x))
    ref = F.cross_entropy(model.lm_head(hidden).view(-1, 50), x.view(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(ours, model.lm_head.weight.grad)
    assert model.transformer.wte.weight is model.lm_head.weight


def test_gpt_reduction_none_gives_each_positions_loss():
    model = tiny_gpt().eval()
    x = torch.randint(0, 50, (3, 16))
    y = torch.randint(0, 50, (3, 16))
    y[:, :5] = -1
    with torch.no_grad():
        _, losses = model(x, y, reduction='none')
        _, mean = model(x, y)
        logits = model.lm_head(model.transformer.ln_f(_blocks(model, x)))
    ref = F.cross_entropy(logits.view(-1, 50), y.view(-1), ignore_index=-1, reduction='none').view(3, 16)
    assert losses.shape == (3, 16) and (losses[:, :5] == 0).all()
    torch.testing.assert_close(losses, ref)
    torch.testing.assert_close(losses.sum() / 33, mean)


def _blocks(model, x):
    pos = torch.arange(x.shape[1])
    y = model.transformer.wte(x) + model.transformer.wpe(pos)
    for block in model.transformer.h:
        y, _ = block(y)
    return y


def test_generate_and_last_position_logits():
    model = tiny_gpt().eval()
    logits, loss = model(torch.zeros(2, 5, dtype=torch.long))
    assert logits.shape == (2, 1, 50) and loss is None
    out = model.generate(torch.zeros(2, 3, dtype=torch.long), max_new_tokens=20, top_k=5)
    assert out.shape == (2, 23)


def test_activation_checkpointing_same_loss_and_gradients(monkeypatch):
    """GPT(config, activation_checkpointing=True) runs each block through torch's checkpoint, to the same results."""
    config, x = tiny_gpt().config, torch.randint(0, 50, (3, 16))
    checkpointed = []
    checkpoint = model_lib.checkpoint
    monkeypatch.setattr(model_lib, 'checkpoint', lambda *a, **k: checkpointed.append(1) or checkpoint(*a, **k))
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        model = GPT(config, activation_checkpointing=on)
        _, loss = model(x, x)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        assert len(checkpointed) == (2 if on else 0)  # each of the 2 blocks, once
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b)


def test_constructor_options_are_keywords_whose_defaults_are_nanogpts_model():
    """GPT(config): no checkpointing, model.py's own chunked loss, no kernels from outside (model.py alone); loss_fn
    replaces the loss, called as GPT.forward calls it."""
    model = tiny_gpt()
    assert (model.activation_checkpointing, model.loss_fn, model.kernels) == (False, model_lib.linear_cross_entropy,
                                                                              None)
    with pytest.raises(TypeError):
        GPT(model.config, True)
    calls = []

    def loss_fn(hidden, weight, targets, **kwargs):
        calls.append(kwargs)
        return naive_cross_entropy(hidden, weight, targets, **kwargs)
    naive = GPT(model.config, loss_fn=loss_fn)
    naive.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (3, 16))
    torch.testing.assert_close(naive(x, x)[1], model(x, x)[1])
    assert calls == [dict(ignore_index=-1, reduction='mean')]
    # loss_chunk_mib (train.py's key, through build_model) reaches the loss as its chunk_bytes, in no model_args
    budgeted = GPT(model.config, loss_fn=loss_fn, loss_chunk_mib=3)
    budgeted(x, x)
    assert calls[-1] == dict(ignore_index=-1, reduction='mean', chunk_bytes=3 * 2 ** 20)
    config = {**configurator.defaults(configurator.train_keys()), 'loss_chunk_mib': 3, 'init_from': 'scratch'}
    built = build_model(config, dict(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=50))
    assert built.loss_options == {'chunk_bytes': 3 * 2 ** 20} and model.loss_options == {}


def test_from_hf_model_matches_hugging_face_logits():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_positions=16, n_embd=16, n_layer=2, n_head=2, vocab_size=50)).eval()
    config = GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=2, n_embd=16)
    model = GPT.from_hf_model(hf, config, loss_fn=naive_cross_entropy).eval()
    assert model.loss_fn is naive_cross_entropy  # GPT's options pass through
    x = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        ref = hf(x).logits[:, -1:, :]
        ours, _ = model(x)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


def test_autocast_cache_changes_no_loss_or_gradient():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64, dropout=0.0))
    x = torch.randint(64, (4, 16))
    results = []
    for cache in (True, False):
        model.zero_grad()
        with torch.autocast('cpu', dtype=torch.bfloat16, cache_enabled=cache):
            _, loss = model(x, x)
        loss.backward()
        results.append([loss.detach()] + [p.grad.clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results))
