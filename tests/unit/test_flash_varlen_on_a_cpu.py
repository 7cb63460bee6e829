"""tests/flash_varlen_on_a_cpu.py, FlashAttention's variable-length kernel on a CPU: it refuses, with the CUDA
kernel's RuntimeError, what mha_varlen_fwd and mha_varlen_bwd refuse, and takes fp32 and fp64 only inside
full_precision()."""
import pytest
import torch

import flash_varlen_on_a_cpu


def inputs(dtype=torch.bfloat16, head_size=16, cu_seqlens=(0, 5, 12)):
    """(q, k, v, cu_seqlens) of two sequences (5 and 7 positions) of 2 heads, needing gradients."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(12, 2, head_size, generator=g).to(dtype).requires_grad_() for _ in range(3))
    return q, k, v, torch.tensor(cu_seqlens, dtype=torch.int32)


def attend(q, k, v, cu_seqlens, longest=7):
    return flash_varlen_on_a_cpu.varlen_attn()(q, k, v, cu_seqlens, cu_seqlens, longest, longest,
                                               window_size=(-1, 0))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_fp16_and_bf16_run_forward_and_backward(flash_kernel, dtype):
    q, k, v, cu_seqlens = inputs(dtype)
    out = attend(q, k, v, cu_seqlens)
    out.float().square().sum().backward()
    assert out.dtype == q.grad.dtype == dtype and q.grad.abs().sum() > 0


def test_what_the_cuda_kernel_refuses_is_refused(flash_kernel):
    q, k, v, cu_seqlens = inputs()
    for args, message in [
        (inputs(torch.float32), 'only support fp16 and bf16'),
        (inputs(torch.float64), 'only support fp16 and bf16'),
        ((q, k, v.detach().half(), cu_seqlens), 'must have the same dtype'),
        ((q, k.detach().transpose(0, 2).contiguous().transpose(0, 2), v, cu_seqlens), 'contiguous last dimension'),
        ((q, k, v, cu_seqlens.long()), 'must have dtype int32'),
        ((q, k, v, torch.tensor([0, 0, 5, 5, 12, 12], dtype=torch.int32)[::2]), 'cu_seqlens must be contiguous'),
        (inputs(head_size=12), 'multiple of 8'),
        (inputs(head_size=264), 'at most 256'),
    ]:
        with pytest.raises(RuntimeError, match=message):
            attend(*args)


def test_the_backward_refuses_a_gradient_of_another_dtype(flash_kernel):
    """Autograd hands the backward a gradient of the output's dtype; the operator itself checks it as CUDA's does."""
    q, k, v, cu_seqlens = (t.detach() for t in inputs())
    out, lse, rng_state = flash_varlen_on_a_cpu.forward(q, k, v, cu_seqlens, cu_seqlens, 7, 7, is_causal=True)
    with pytest.raises(RuntimeError, match='must have the same dtype'):
        flash_varlen_on_a_cpu.backward(out.float(), q, k, v, out, lse, cu_seqlens, cu_seqlens, 7, 7, True, rng_state)


def test_full_precision_lets_fp32_and_fp64_through_while_it_lasts(flash_kernel):
    with flash_varlen_on_a_cpu.full_precision():
        for dtype in (torch.float32, torch.float64):
            assert attend(*inputs(dtype)).dtype == dtype
    with pytest.raises(RuntimeError, match='only support fp16 and bf16'):
        attend(*inputs(torch.float32))
