"""model.py's own loss, linear_cross_entropy (the loss of model.py copied alone), against nanoGPT's full logits and
training/chunked_loss.py's tuned loss, which train.py gives GPT in its place: the same losses and gradients."""
import math

import pytest
import torch
import torch.nn.functional as F

from training.chunked_loss import chunked_cross_entropy
from helpers import loss_and_grads, loss_inputs, tiny_gpt
from model import GPT, linear_cross_entropy
from training.memory.tracer import MemoryTracer

V = 257  # loss_inputs' vocabulary: fp32 rows of 1,028 bytes, three buffers of them a row of a chunk
CHUNKS = {'one row': 3 * 8 * V, 'seven rows': 7 * 3 * 8 * V, 'one chunk': 2 ** 30}  # fp64's: 8 bytes a logit


def naive(h, w, t, softcap=0.0, reduction='mean'):
    logits = (h @ w.t()).to(torch.promote_types(h.dtype, torch.float32))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, t, ignore_index=-1, reduction=reduction)


@pytest.mark.parametrize('chunk_bytes', CHUNKS.values(), ids=CHUNKS)
@pytest.mark.parametrize('softcap', [0.0, 5.0], ids=['no cap', 'capped'])
def test_loss_and_gradients_are_nanogpts_in_fp64(chunk_bytes, softcap):
    h, w, t = loss_inputs(dtype=torch.float64)  # 300 rows: the last chunk of seven is short
    t[::5] = -1
    ours = loss_and_grads(lambda *a: linear_cross_entropy(*a, softcap=softcap, chunk_bytes=chunk_bytes), h, w, t)
    for a, b in zip(loss_and_grads(lambda *a: naive(*a, softcap=softcap), h, w, t), ours):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    with torch.no_grad():
        rows = linear_cross_entropy(h, w, t, softcap=softcap, chunk_bytes=chunk_bytes, reduction='none')
        torch.testing.assert_close(rows, naive(h, w, t, softcap=softcap, reduction='none'), rtol=1e-12, atol=1e-14)
        assert (rows[::5] == 0).all()
        mean = linear_cross_entropy(h, w, t, softcap=softcap, chunk_bytes=chunk_bytes)
    torch.testing.assert_close(mean, ours[0], rtol=1e-14, atol=0)  # without gradients: the same mean


def test_bf16_autocast_gives_the_tuned_losss_results():
    """Under bf16 autocast with fp32 weights, as train.py runs: training/chunked_loss.py's loss and gradients within
    bf16's rounding, the gradients in the inputs' fp32."""
    h, w, t = loss_inputs()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        tuned = loss_and_grads(chunked_cross_entropy, h, w, t)
        ours = loss_and_grads(lambda *a: linear_cross_entropy(*a, chunk_bytes=7 * 3 * 4 * V), h, w, t)
    assert [g.dtype for g in ours[1:]] == [torch.float32, torch.float32]
    for a, b in zip(tuned, ours):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-3)


def test_every_target_ignored_gives_zero_and_zero_gradients():
    h, w, t = loss_inputs(n=20)
    t[:] = -1
    loss, grad_h, grad_w = loss_and_grads(linear_cross_entropy, h, w, t)
    assert loss.item() == 0 and not grad_h.any() and not grad_w.any()


def test_the_upstream_gradient_scales_the_gradients():
    """Gradient accumulation's 1 / k reaches the gradients computed in forward."""
    h, w, t = loss_inputs(dtype=torch.float64)
    ref = loss_and_grads(naive, h, w, t)
    (linear_cross_entropy(h, w, t, chunk_bytes=CHUNKS['seven rows']) / 4).backward()
    torch.testing.assert_close(h.grad, ref[1] / 4)
    torch.testing.assert_close(w.grad, ref[2] / 4)


def test_reduction_none_refuses_gradients_and_unknown_reductions():
    h, w, t = loss_inputs()
    with pytest.raises(RuntimeError, match=r"reduction='none'\) has no gradients"):
        linear_cross_entropy(h, w, t, reduction='none')
    with pytest.raises(ValueError, match="'sum'"):
        linear_cross_entropy(h, w, t, reduction='sum')


def test_no_tensor_near_n_by_v_in_forward_and_backward():
    """Chunks of 256 rows of a 4096-token vocabulary: no tensor of the (N, V) logits' size, nor of half of it."""
    h, w, t = loss_inputs(n=4096, d=32, v=4096)
    with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker:
        linear_cross_entropy(h, w, t, chunk_bytes=256 * 3 * 4 * 4096).backward()
    assert max(math.prod(shape) for shape, _, _ in tracker.allocations) < 4096 * 4096 // 2


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_a_chunk_holds_as_many_rows_as_three_buffers_of_its_dtype_fit(dtype):
    """chunk_bytes of three buffers of 7 rows in the softmax's dtype (fp64's 8 bytes for fp64 inputs): chunks of 7
    rows, no larger."""
    h, w, t = loss_inputs(dtype=dtype)
    with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker:
        linear_cross_entropy(h, w, t, chunk_bytes=7 * 3 * dtype.itemsize * V).backward()
    assert max(shape[0] for shape, _, _ in tracker.allocations if len(shape) == 2 and shape[1] == V) == 7


@pytest.mark.parametrize('softcap', [0.0, 15.0], ids=['no cap', 'capped'])
@pytest.mark.parametrize('autocast', [False, True], ids=['fp32', 'bf16 autocast'])
def test_a_chunk_takes_at_most_chunk_bytes(softcap, autocast):
    """Forward and backward in chunks of 64 rows of a 4096-token vocabulary: beyond the inputs' gradients and the
    weight's copy, which do not grow with the chunk, at most chunk_bytes at once, with the cap's tanh kept too."""
    h, w, t = loss_inputs(n=512, d=16, v=4096)
    chunk_bytes = 64 * 3 * 4 * 4096
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
        with MemoryTracer(alignment=1, existing=(h, w, t)) as tracker:
            linear_cross_entropy(h, w, t, softcap=softcap, chunk_bytes=chunk_bytes).backward()
    whole_rows = (h.numel() + w.numel() + 2 * (512 + 4096 * 16)) * 4  # the gradients, the losses, the weight's copy
    assert tracker.peak <= chunk_bytes + whole_rows


def test_a_gpt_on_its_own_loss_trains_as_on_the_tuned_one():
    """model.py's GPT without loss_fn (its own loss) against the same weights on training/chunked_loss.py's: the same
    loss and gradients, in fp64, with a soft-capped untied head."""
    model = tiny_gpt(logit_softcap=5.0, tie_weights=False).double()
    tuned = GPT(model.config, loss_fn=chunked_cross_entropy).double()
    tuned.load_state_dict(model.state_dict())
    x = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    results = []
    for gpt in (model, tuned):
        _, loss = gpt(x, x.roll(1, 1))
        loss.backward()
        results.append((loss, *(p.grad for p in gpt.parameters())))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
