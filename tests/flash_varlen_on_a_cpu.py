"""torch.nn.attention.varlen's varlen_attn on a CPU: kernels for its two operators (forward and backward) that check
what FlashAttention's CUDA kernel checks and compute what it computes, so that the real varlen_attn (its window_size
convention, autograd and torch.compile support) runs in the tests of training/attention.py's document_attention, and
what the GPU rejects is rejected here.

What the CUDA kernel does, from FlashAttention's README and torch's flash_api.cpp (mha_varlen_fwd, mha_varlen_bwd):
- query i of a sequence sees the keys from i + n_k - n_q - left to i + n_k - n_q + right (-1: no limit that side);
- a left or right of max_seqlen_k or more is no limit; is_causal sets right to 0;
- it raises a RuntimeError unless: q, k, v (and backward's gradient) are all fp16 or all bf16, with a contiguous
  last dimension; heads a multiple of 8 up to 256 wide; cu_seqlens int32 and contiguous.
full_precision() lets fp32 and fp64 through too, for a test that compares the kernel with another attention to more
digits than bf16 keeps; each use says why."""
import contextlib
import functools

import torch

from training import attention

FLASH_DTYPES = (torch.float16, torch.bfloat16)  # the CUDA kernel's: "FlashAttention only support fp16 and bf16"
FULL_PRECISION_DTYPES = (*FLASH_DTYPES, torch.float32, torch.float64)
accepted_dtypes = FLASH_DTYPES  # full_precision() widens it while it lasts


@contextlib.contextmanager
def full_precision():
    """The kernels also take fp32 and fp64 inside the block, which the CUDA one rejects: for comparisons only."""
    global accepted_dtypes
    previous, accepted_dtypes = accepted_dtypes, FULL_PRECISION_DTYPES
    try:
        yield
    finally:
        accepted_dtypes = previous


def check(condition, message):
    """FlashAttention's TORCH_CHECK: a RuntimeError with its message where the condition fails."""
    if not condition:
        raise RuntimeError(message)


def check_inputs(*tensors):
    """mha_varlen_fwd's and mha_varlen_bwd's checks of q, k, v (and out, its gradient): one dtype, fp16 or bf16, and
    a contiguous last dimension."""
    check(tensors[0].dtype in accepted_dtypes, 'FlashAttention only support fp16 and bf16 data type')
    check(all(t.dtype == tensors[0].dtype for t in tensors), 'query, key and value must have the same dtype')
    check(all(t.stride(-1) == 1 for t in tensors), 'Input tensor must have contiguous last dimension')


def window_mask(n_q, n_k, max_k, is_causal, left, right):
    """(n_q, n_k) bool: which keys of a sequence each of its queries sees."""
    left, right = (-1 if size >= max_k else size for size in (left, right))
    if is_causal:
        right = 0
    i = torch.arange(n_q)[:, None] + n_k - n_q
    j = torch.arange(n_k)[None, :]
    mask = torch.ones(n_q, n_k, dtype=torch.bool)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def sequences(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, window_size):
    """Each sequence's (query rows, key rows, mask), after mha_varlen_fwd's checks."""
    head_size = q.size(-1)
    check(head_size <= 256, 'FlashAttention forward only supports head dimension at most 256')
    check(head_size % 8 == 0, 'query, key, value must have a head_size that is a multiple of 8')
    check(cu_seq_q.dtype == cu_seq_k.dtype == torch.int32, 'cu_seqlens_q and cu_seqlens_k must have dtype int32')
    check(cu_seq_q.is_contiguous() and cu_seq_k.is_contiguous(), 'cu_seqlens must be contiguous')
    assert q.dim() == k.dim() == v.dim() == 3 and q.size(1) == k.size(1) == v.size(1)
    assert cu_seq_q[-1] == q.size(0) and cu_seq_k[-1] == k.size(0) == v.size(0)
    assert cu_seq_q.diff().max() <= max_q and cu_seq_k.diff().max() <= max_k  # the kernel reads no further
    left, right = window_size or (-1, -1)
    bounds = zip(cu_seq_q.tolist(), cu_seq_q[1:].tolist(), cu_seq_k.tolist(), cu_seq_k[1:].tolist())
    return [(slice(q0, q1), slice(k0, k1), window_mask(q1 - q0, k1 - k0, max_k, is_causal, left, right))
            for q0, q1, k0, k1 in bounds]


def masked_scores(q, k, mask, scale):
    """(heads, n_q, n_k) attention scores of one sequence's queries and keys, -inf where the mask hides a key."""
    return (torch.einsum('qhd,khd->hqk', q, k) * scale).masked_fill(~mask, float('-inf'))


def forward(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, window_size=None,
            enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    """torch_attn::_varlen_attn's (out, lse, rng_state)."""
    check_inputs(query, key, value)
    scale = scale or query.size(-1) ** -0.5
    wide = torch.promote_types(query.dtype, torch.float32)
    out = torch.empty_like(query)
    lse = torch.empty(query.size(1), query.size(0), dtype=torch.float32)
    for qs, ks, mask in sequences(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, window_size):
        q, k, v = query[qs].to(wide), key[ks].to(wide), value[ks].to(wide)
        scores = masked_scores(q, k, mask, scale)
        lse[:, qs] = scores.logsumexp(-1).float()
        out[qs] = torch.einsum('hqk,khd->qhd', scores.softmax(-1), v).to(query.dtype)
    return out, lse, torch.zeros(2, dtype=torch.uint64)


def backward(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, rng_state,
             scale=None, window_size=None):
    """torch_attn::_varlen_attn_backward's (dq, dk, dv): softmax attention's gradients, sequence by sequence."""
    check_inputs(query, key, value, out, grad_out)
    scale = scale or query.size(-1) ** -0.5
    wide = torch.promote_types(query.dtype, torch.float32)
    dq, dk, dv = (torch.zeros_like(t, dtype=wide) for t in (query, key, value))
    for qs, ks, mask in sequences(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, window_size):
        q, k, v, o, do = (t.to(wide) for t in (query[qs], key[ks], value[ks], out[qs], grad_out[qs]))
        p = masked_scores(q, k, mask, scale).softmax(-1)
        dv[ks] += torch.einsum('hqk,qhd->khd', p, do)
        dp = torch.einsum('qhd,khd->hqk', do, v)
        ds = p * (dp - (do * o).sum(-1).transpose(0, 1)[..., None])  # the softmax's backward
        dq[qs] += torch.einsum('hqk,khd->qhd', ds, k) * scale
        dk[ks] += torch.einsum('hqk,qhd->khd', ds, q) * scale
    return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype)


@functools.cache
def varlen_attn():
    """attention.flash_varlen_attn(), torch's varlen_attn, with its operators' CPU kernels registered (once a process);
    None where this torch has no varlen_attn with a sliding window."""
    kernel = attention.flash_varlen_attn()
    if kernel is not None:
        from torch.nn.attention import varlen
        varlen._varlen_attn.register_kernel('cpu')(forward)
        varlen._varlen_attn_backward.register_kernel('cpu')(backward)
    return kernel
