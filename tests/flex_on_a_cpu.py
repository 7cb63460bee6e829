"""FlexAttention trained on a CPU: torch's flex_attention refuses a backward there (CUDA's kernels are the only ones
that train), but its operator computes forward and backward eagerly on a CPU (every score materialized: small inputs
only). `flex_attention` here takes the call attention.flex_document_attention makes of the compiled kernel, checks
what the CUDA kernel's compilation refuses, and runs the operator; `use()` makes it the model's kernel.

What the CUDA path checks (torch's flex_attention, and Inductor's lowering of its kernel):
- q, k and v are 4-D, of one dtype, fp16, bf16 or fp32, with one head size for q and k;
- the BlockMask covers exactly q's and k's lengths;
- each of kernel_options' tiles divides the BlockMask's block size (BLOCK_M, BLOCK_N and the backward's), the
  backward's BLOCK_N1 is a multiple of its BLOCK_M1 and its BLOCK_M2 of its BLOCK_N2;
- kernel_options names only options the kernel has."""
import torch

from training import attention
from training.memory.estimate import flex_attention_as_on_cuda

FLEX_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TILE_OPTIONS = ('BLOCK_M', 'BLOCK_N', 'BLOCK_M1', 'BLOCK_N1', 'BLOCK_M2', 'BLOCK_N2')
KNOWN_OPTIONS = {*TILE_OPTIONS, 'num_stages', 'num_warps'}
calls = [] # one entry per call: the tests count them


def check(condition, message):
    if not condition:
        raise RuntimeError(message)


def check_inputs(q, k, v, block_mask, kernel_options):
    check(q.dim() == k.dim() == v.dim() == 4, 'NYI: query, key, and value must be 4D tensors')
    check(q.dtype in FLEX_DTYPES and q.dtype == k.dtype == v.dtype,
          f'FlexAttention takes one dtype of fp16, bf16, fp32 for q, k, v: got {q.dtype}, {k.dtype}, {v.dtype}')
    check(q.size(-1) == k.size(-1), f'query and key head sizes differ: {q.size(-1)} and {k.size(-1)}')
    check(tuple(block_mask.seq_lengths) == (q.size(-2), k.size(-2)),
          f'block_mask was created for {tuple(block_mask.seq_lengths)} but got q_len={q.size(-2)}, kv_len={k.size(-2)}')
    tiles = {}
    for key, value in (kernel_options or {}).items():
        name = key.split('_', 1)[1] if key.startswith(('fwd_', 'bwd_')) else key
        check(name in KNOWN_OPTIONS, f'unknown FlexAttention kernel option {key!r}')
        tiles[name] = value
    block_q, block_kv = block_mask.BLOCK_SIZE
    for name in TILE_OPTIONS:
        if name in tiles:
            check((block_q if name[len('BLOCK_')] == 'M' else block_kv) % tiles[name] == 0,
                  f'{name}={tiles[name]} does not divide the BlockMask block size {block_mask.BLOCK_SIZE}')
    if 'BLOCK_M1' in tiles and 'BLOCK_N1' in tiles:
        check(tiles['BLOCK_N1'] % tiles['BLOCK_M1'] == 0, 'BLOCK_N1 must be a multiple of BLOCK_M1')
    if 'BLOCK_M2' in tiles and 'BLOCK_N2' in tiles:
        check(tiles['BLOCK_M2'] % tiles['BLOCK_N2'] == 0, 'BLOCK_M2 must be a multiple of BLOCK_N2')


def flex_attention(q, k, v, block_mask, kernel_options):
    """The compiled flex_attention's call, on the CPU: its operator, forward and backward (the memory estimate's
    trace calls it so too), after the CUDA checks."""
    check_inputs(q, k, v, block_mask, kernel_options)
    calls.append(1)
    return flex_attention_as_on_cuda(q, k, v, block_mask, kernel_options)


def use():
    """FlexAttention's kernel, wherever the model calls it outside a compiled graph, is this file's."""
    attention.compiled_flex_attention = lambda: flex_attention
