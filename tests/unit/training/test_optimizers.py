"""training/optimizers.py's updates, each against its definition: bf16 values rounded stochastically (unbiased, onto a
neighbour), AdamW's update on bf16 weights, and Muon's momentum forms and split matrices against the records' Muon in
float64."""
import pytest
import torch

from training import optim, optimizers


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    torch.manual_seed(0)
    x = torch.tensor([1.0 + 2 ** -10, -3.0 - 2 ** -9 - 2 ** -11, 1e-3 * (1 + 2 ** -12)])  # between bf16 values
    below = x.to(torch.bfloat16).float()  # a neighbour; the other is one bf16 step further from zero
    draws = torch.stack([_rounded(x) for _ in range(4000)])
    steps = draws - below
    assert set(draws.view(-1).tolist()) <= set(below.tolist()) | set((below + steps.abs().amax(0) * x.sign()).tolist())
    assert draws.mean(0) == pytest.approx(x.tolist(), rel=2e-4)  # a draw's error is up to 2**-8: 4000 average it out
    exact = torch.tensor([1.5, -2.0])  # representable: never moves
    assert all(torch.equal(_rounded(exact), exact) for _ in range(10))


def _rounded(x):
    stored = torch.empty_like(x, dtype=torch.bfloat16)
    optimizers._store_bf16_stochastic(stored, x.clone())
    return stored.float()


def test_a_bf16_weight_update_lands_on_a_neighbour_of_the_fp32_update():
    """One step from the same weights and gradients: each bf16 weight is torch's fp32 update rounded down or up."""
    torch.manual_seed(0)
    weights = torch.randn(3000, dtype=torch.bfloat16) * 0.02
    grads = torch.randn(3000, dtype=torch.bfloat16) * 1e-3
    fp32 = torch.nn.Parameter(weights.float())
    bf16 = torch.nn.Parameter(weights.clone())
    reference = torch.optim.AdamW([fp32], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, foreach=False)
    ours = optim.optimizer_class('adamw', 'bfloat16')([bf16], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    fp32.grad, bf16.grad = grads.float(), grads.clone()
    reference.step()
    ours.step()
    nearest = fp32.detach().to(torch.bfloat16).float()
    ulp = nearest.abs().mul(2 ** -7).clamp(min=2 ** -133)  # a bf16 step near the value (8 significant bits)
    assert bf16.dtype == torch.bfloat16 and ((bf16.float() - fp32).abs() <= ulp * 1.001).all()
    assert (bf16.float() != nearest).any() and (bf16.float() == nearest).any()  # rounded both ways, not to nearest


def record_muon_update(g, buf, momentum, ns_eps=1e-7):
    """modded-nanogpt's Muon on one float64 matrix, its Newton-Schulz from tests/record_reference.py: (update, buf)."""
    import record_reference
    buf = momentum * buf + g
    return record_reference.newton_schulz(g + momentum * buf, record_reference.RecordConfig(ns_dtype=None)), buf


def test_muon_sum_form_and_split_are_the_records_muon_on_q_k_and_v():
    """momentum_form='sum' and split=3 on a (3d, d) matrix: the record's Muon on three (d, d) matrices, over two steps
    whose momentum differs (a warmup), in float64; 'ema' (torch's) gives another update there."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 16, generator=g, dtype=torch.float64)
    grads = [torch.randn(48, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    results = {}
    for form in ('sum', 'ema'):
        p = torch.nn.Parameter(weight.clone())
        muon = optimizers.Muon([dict(params=[p], split=3, momentum_form=form)], lr=0.05, weight_decay=0.0)
        for grad, momentum in zip(grads, (0.85, 0.86)):
            p.grad = grad.clone()
            muon.param_groups[0]['momentum'] = momentum
            muon.step()
        results[form] = p.detach()
    expected = []
    for rows in range(3):
        w, buf = weight[16 * rows:16 * (rows + 1)], torch.zeros(16, 16, dtype=torch.float64)
        for grad, momentum in zip(grads, (0.85, 0.86)):
            update, buf = record_muon_update(grad[16 * rows:16 * (rows + 1)], buf, momentum)
            w = w - 0.05 * update  # a square block: no lr adjustment
        expected.append(w)
    torch.testing.assert_close(results['sum'], torch.cat(expected), rtol=0, atol=1e-12)
    assert (results['ema'] - results['sum']).abs().max() > 1e-6


def test_muon_ema_eps_form_is_the_2025_records_muon():
    """momentum_form='ema_eps': the 4 Jan 2025 record's Muon, an average as torch's (buf = lerp(buf, g, 1 - mu),
    Nesterov lerp(g, buf, mu)) divided by norm + eps, over two steps of a warmup, in float64 on a (4d, d) matrix (lr
    adjustment 2); 'ema' (torch's, max(norm, eps)) differs on small gradients."""
    import record_reference
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 16, generator=g, dtype=torch.float64)
    grads = [1e-3 * torch.randn(64, 16, generator=g, dtype=torch.float64) for _ in range(2)]
    w, buf = weight, torch.zeros(64, 16, dtype=torch.float64)
    for grad, momentum in zip(grads, (0.85, 0.86)):
        buf = torch.lerp(buf, grad, 1 - momentum)
        w = w - 0.05 * 2 * record_reference.newton_schulz(torch.lerp(grad, buf, momentum),
                                                          record_reference.RecordConfig(ns_dtype=None))
    results = {}
    for form in ('ema_eps', 'ema'):
        p = torch.nn.Parameter(weight.clone())
        muon = optimizers.Muon([dict(params=[p], momentum_form=form)], lr=0.05, weight_decay=0.0)
        for grad, momentum in zip(grads, (0.85, 0.86)):
            p.grad = grad.clone()
            muon.param_groups[0]['momentum'] = momentum
            muon.step()
        results[form] = p.detach()
    torch.testing.assert_close(results['ema_eps'], w, rtol=0, atol=1e-12)
    assert (results['ema'] - results['ema_eps']).abs().max() > 1e-9
