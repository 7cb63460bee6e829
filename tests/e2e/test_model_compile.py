"""model.py under torch.compile: the compiled model and its compiled loss chunks compute what eager does. Slow:
each test compiles."""
import model as model_lib
import pytest
import torch

from helpers import tiny_gpt


@pytest.mark.parametrize('options', [{}, dict(pos_emb='rope', norm='rmsnorm', qk_norm=True, mlp='relu2',
                                               tie_weights=False, logit_softcap=3.0)], ids=['gpt2', 'modern'])
def test_compiled_model_matches_eager_and_runs_the_compiled_chunks(monkeypatch, options):
    model = tiny_gpt(**options)
    x = torch.randint(0, 50, (2, 16))
    fused_calls = []
    compiled_chunk = model_lib._compiled_softmax_chunk
    monkeypatch.setattr(model_lib, '_compiled_softmax_chunk', lambda *a: fused_calls.append(1) or compiled_chunk(*a))
    _, eager = model(x, x)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))
    assert not fused_calls  # eager: the eager chunk path
    compiled = torch.compile(model)
    _, loss = compiled(x, x)
    assert fused_calls
    grads = torch.autograd.grad(loss, list(model.parameters()))
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def inputs(dtype, n=70, d=16, v=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (3 * torch.randn(n, d, generator=g, dtype=dtype)).requires_grad_()  # logits well into tanh's flat part
    w = torch.randn(v, d, generator=g, dtype=dtype, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=g)
    t[::7] = -1
    return h, w, t


def test_softcap_compiled_chunks_match_eager():
    h, w, t = inputs(torch.float32)
    results = []
    for fused in (False, True):
        loss = model_lib._chunked_cross_entropy(h, w, t, -1, 16, 'mean', fused=fused, softcap=5.0)
        results.append((loss, *torch.autograd.grad(loss, (h, w))))
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
