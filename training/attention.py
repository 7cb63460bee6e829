"""
The attention kernels GPT gets on a GPU (`kernels`), which skip what model.py's masks empty, and their helpers: for
documents and windows by position, FlashAttention's variable-length kernel (Ampere or later); for windows in blocks
(attn_window_block), FlexAttention, whose tiles flex_kernel_options fits to the GPU's shared memory and flex_probe
tries before a run. Where neither runs, model.py's SDPA under a mask computes the same attention (choose_attention).

Besides, window_document_attention: gpt2026.py's attention (its window by position within documents) in the same
variable-length kernel, which a CUDA run passes to GPT2026 in place of its SDPA under a mask.
"""
import functools
import inspect

import torch
from torch.nn import functional as F

from model import document_ids

try: # FlexAttention: torch 2.5 and later
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:
    BlockMask = flex_attention = None


class Kernels:
    """GPT's `kernels`: the attention of a forward in FlashAttention's variable-length kernel (documents, windows by
    position) or FlexAttention's (windows in blocks), where one runs; None leaves it to model.py's SDPA under a mask.
    flash and flex: None where the kernel runs (flash: an Ampere or later GPU; flex: CUDA with a torch that has it),
    True on any device (estimate_memory.py traces a CUDA run on a CPU, tests run stand-ins there), False never.
    flex_options: FlexAttention's kernel_options ({}: torch's tiles; training.step picks them for the GPU)."""

    def __init__(self, flash=None, flex=None):
        self.flash, self.flex, self.flex_options = flash, flex, {}

    def __call__(self, config, idx, window, dtype):
        """(function, *arguments) of the attention of a forward on idx (B, T) under config's rule, or None."""
        t = idx.size(1)
        block = config.attn_window_block
        if block and window and t > window: # a window in blocks: FlashAttention's is by position
            if not self.flex_runs(config, idx.device):
                return None
            doc = None if config.doc_token < 0 else document_ids(idx, config.doc_token)
            return (flex_document_attention, flex_block_mask(doc, t, window // block, block, idx.device),
                    self.flex_options, dtype)
        kernel = self.varlen_kernel(idx.device, dtype, config.n_embd // config.n_head)
        if kernel is None:
            return None
        # in `dtype`: value_residual's fp32 lambda makes v fp32, qk_norm leaves q and k in fp32
        return (document_attention, kernel, dtype, *document_segments(idx, config.doc_token), window)

    def varlen_kernel(self, device, dtype, head_size):
        """varlen_kernel's FlashAttention variable-length kernel where it runs here (flash), else None."""
        return varlen_kernel(device, dtype, head_size, self.flash)

    def flex_runs(self, config, device):
        """Whether FlexAttention runs config's windows in blocks on `device` (flex None: on CUDA, with a torch that has
        it): its tiles need blocks of a multiple of 128 positions and heads of a power of 2 from 16."""
        head_size = config.n_embd // config.n_head
        block = config.attn_window_block
        fits = block > 0 and block % 128 == 0 and head_size >= 16 and head_size & (head_size - 1) == 0
        on_cuda = self.flex if self.flex is not None else device.type == 'cuda'
        return fits and on_cuda and flex_attention is not None


def kind(attention):
    """The kind of model.py's Attention as it runs: its own, or which of Kernels' kernels, 'varlen' or 'flex'."""
    if attention.kind != 'kernel':
        return attention.kind
    return 'varlen' if attention.kernel[0] is document_attention else 'flex'


# -----------------------------------------------------------------------------
# FlashAttention's variable-length kernel: documents and windows by position

# torch._disable_dynamo is torch.compiler.disable that imports torch's compiler at the first call, not at import
@torch._disable_dynamo
@functools.cache
def flash_varlen_attn():
    """torch's FlashAttention over variable-length sequences (CUDA only), attn_window and doc_token's kernel, if this
    torch has it with a sliding window (2.12+), else None. Imported when first asked: its module loads the compiler."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn if 'window_size' in inspect.signature(varlen_attn).parameters else None

def varlen_kernel(device, dtype, head_size, flash_kernel=None):
    """FlashAttention's variable-length kernel where it runs (flash_kernel None: an Ampere or later GPU; True: on any
    device, as estimate_memory.py traces a CUDA run on a CPU; False: never), else None (varlen_missing says why)."""
    return None if varlen_missing(device, dtype, head_size, flash_kernel) else flash_varlen_attn()

def varlen_missing(device, dtype, head_size, flash_kernel=None, dropout=False):
    """What FlashAttention's variable-length kernel needs and lacks on `device` (varlen_kernel's arguments), in a few
    words; None where it runs: an Ampere or later GPU, bf16 or fp16 (the matrix products' dtype), heads of a multiple
    of 8 up to 256 wide (SDPA pads other sizes for its kernel, varlen_attn doesn't), no dropout, a torch that has it."""
    on_cuda = flash_kernel if flash_kernel is not None else (
        device.type == 'cuda' and torch.cuda.get_device_capability(device) >= (8, 0))
    if not on_cuda:
        return 'an Ampere or later GPU'
    if dtype not in (torch.bfloat16, torch.float16):
        return 'bf16 or fp16 (--dtype=bfloat16)'
    if head_size % 8 != 0 or head_size > 256:
        return 'heads a multiple of 8 wide, up to 256'
    if dropout:
        return 'no dropout (--dropout=0)'
    if flash_varlen_attn() is None: # the last: its import loads the compiler
        return f'torch 2.12 or later (this one is {torch.__version__})'
    return None

def segments(starts):
    """(cu_seqlens, longest), as varlen_attn takes them: the offsets of the segments of starts (B, T) flattened, each
    starting where `starts` is True (every row's first position must be), and a bound on their lengths, T: no
    segment crosses a row. The kernel sizes its grid by the bound (blocks past a segment's end return at once);
    their longest would be read from the GPU, which then waits for the CPU to launch what follows. Their count is
    read all the same (nonzero): once a forward."""
    cu_seqlens = F.pad(starts.view(-1).nonzero().view(-1), (0, 1), value=starts.numel()).to(torch.int32)
    return cu_seqlens, starts.size(1)

@torch._disable_dynamo # the number of documents depends on the tokens: computed eagerly, outside a compiled graph
def document_segments(idx, doc_token):
    """segments of the documents of idx (B, T): each row starts one, and each doc_token (if >= 0) another."""
    starts = torch.zeros(idx.shape, dtype=torch.bool, device=idx.device)
    starts[:, 0] = True
    if doc_token >= 0:
        starts |= idx == doc_token
    return segments(starts)

def document_attention(q, k, v, varlen_attn, dtype, cu_seqlens, longest, window):
    """Causal attention within each document, over at most `window` positions (0: all), with FlashAttention's
    variable-length kernel varlen_attn in `dtype` (GPT.compute_dtype's): only what blocked_attention's mask keeps.
    q, k, v (B, nh, T, hs), which autocast leaves in fp32 after qk_norm's RMSNorm or value_residual's fp32 lambda."""
    B, nh, T, hs = q.shape
    q, k, v = (t.transpose(1, 2).reshape(B * T, nh, hs).to(dtype) for t in (q, k, v)) # as SDPA casts them
    y = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, longest, longest, window_size=(window - 1 if window else -1, 0))
    return y.view(B, T, nh, hs).transpose(1, 2)

@torch._disable_dynamo # as document_segments: the number of documents depends on the tokens
def position_segments(docs):
    """segments of docs (B, T), each position's document id (ids grow along a row): one starts at each row and
    wherever the id changes."""
    return segments(F.pad(docs.diff(dim=1) != 0, (1, 0), value=True))

def window_document_attention(q, k, v, segments, window, scale):
    """gpt2026.attend with FlashAttention's variable-length kernel, GPT2026's attention on CUDA (Ampere or later):
    q, k, v (B, T, H, D), each query t seeing the keys from t - window to t of its document (segments: the
    documents' (cu_seqlens, longest), position_segments', which GPT2026 makes once a forward), window_size=(window,
    0), without attend's (B, 1, T, T) mask; in autocast's dtype (q and k leave RMSNorm in fp32 under it)."""
    B, T, H, D = q.shape
    device_type = q.device.type
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else v.dtype
    cu_seqlens, longest = segments
    q, k, v = (t.reshape(B * T, H, D).to(dtype) for t in (q, k, v))
    y = flash_varlen_attn()(q, k, v, cu_seqlens, cu_seqlens, longest, longest, scale=scale, window_size=(window, 0))
    return y.view(B, T, H, D)


# -----------------------------------------------------------------------------
# FlexAttention: windows in blocks (the records' block masks), the blocks outside them never computed

@torch._disable_dynamo # made eagerly, a compiled model's input: its window is no constant of the compiled graph
def flex_block_mask(doc, t, window_blocks, block, device=None):
    """FlexAttention's BlockMask of local_attention_mask(pos, pos, window_blocks * block, doc, doc, block) for rows of
    t positions on `device`, built from facts about blocks alone, never a (t, t) tensor: each block's first and last
    document (doc (B, t); None: one document a row). A block of keys is skipped where it lies after the query block,
    window_blocks or more blocks back, or shares no document with it; it is full (its mask not computed) where it lies
    before the query block and both hold one and the same document; the rest are partial, masked in the kernel by
    the whole rule (mask_mod), which alone is the mask where FlexAttention runs without a kernel (eagerly)."""
    n = -(-t // block)
    q_block = torch.arange(n, device=device)[:, None]
    kv_block = q_block.view(1, n)
    near = (kv_block <= q_block) & (kv_block > q_block - window_blocks)
    if doc is None:
        partial, full = near[None] & (kv_block == q_block), near[None] & (kv_block < q_block)
    else:
        last = torch.arange(1, n + 1, device=device).mul(block).clamp(max=t) - 1
        first_doc, last_doc = doc[:, ::block], doc[:, last] # (B, n): documents only grow along a row
        q_first, q_last, kv_first, kv_last = first_doc[:, :, None], last_doc[:, :, None], first_doc[:, None], \
            last_doc[:, None]
        shared = (kv_first <= q_last) & (kv_last >= q_first)
        full = near & (kv_block < q_block) & (q_first == q_last) & (kv_first == kv_last) & (kv_first == q_first)
        partial = near & shared & ~full
        doc = F.pad(doc, (0, n * block - t), value=-1) # a position past t: in no document, never attended to

    first_kv_block = q_block.view(n) - window_blocks + 1 # each query block's first key block

    def local(b, h, q_idx, kv_idx): # local_attention_mask's rule, position by position
        allowed = (kv_idx <= q_idx) & (kv_idx // block >= first_kv_block[q_idx // block])
        return allowed if doc is None else allowed & (doc[b, q_idx] == doc[b, kv_idx])

    def as_indices(blocks): # (B, n, n) bool: each query block's count, and its key blocks' indices, those first
        return (blocks.sum(-1, dtype=torch.int32)[:, None],
                torch.argsort(~blocks, dim=-1, stable=True).to(torch.int32)[:, None])

    return BlockMask.from_kv_blocks(*as_indices(partial), *as_indices(full), BLOCK_SIZE=block, mask_mod=local,
                                    seq_lengths=(t, t))

@torch._disable_dynamo
@functools.cache
def compiled_flex_attention():
    """torch's flex_attention compiled: outside a compiled model it runs as eager PyTorch materializing every score,
    slow and large. Made when first asked: compiling loads the compiler."""
    return torch.compile(flex_attention, dynamic=False)

def flex_document_attention(q, k, v, block_mask, kernel_options, dtype):
    """Attention of q, k, v (B, nh, T, hs) under block_mask (flex_block_mask's) in FlexAttention's kernel, in
    `dtype` (q and k may be fp32 after qk_norm under autocast, which FlexAttention does not cast)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    flex = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
    return flex(q, k, v, block_mask=block_mask, kernel_options=kernel_options)

# Shared memory a thread block may use from which torch's own FlexAttention tiles compile (an A100 has 163 KiB, an
# H100 227); consumer cards (RTX 30 and 40 series, A10, L4) have 99 KiB, less than its forward tiles need.
FLEX_DEFAULT_TILES_BYTES = 160 * 1024
# Tiles for less, fastest first: forward (BLOCK_M, BLOCK_N, stages, warps); backward the same of both its loops
FLEX_FORWARD_TILES = ((128, 64, 2, 8), (64, 64, 2, 4), (64, 32, 1, 4), (32, 16, 1, 4))
FLEX_BACKWARD_TILES = ((64, 64, 3, 4), (64, 64, 2, 4), (32, 32, 1, 4), (16, 16, 1, 4))

def flex_tile_bytes(kept_rows, streamed_rows, stages, head_size):
    """Shared memory of a FlexAttention kernel's tiles of bf16 rows of head_size: the tile it keeps, and `stages`
    buffers of the two tiles streamed past it; Triton's own figure for torch's forward tiles at head size 128
    (128 x 64, 3 stages) is this one's 131,072 bytes, plus 2."""
    return 2 * head_size * (kept_rows + 2 * stages * streamed_rows)

def flex_kernel_options(properties, head_size):
    """FlexAttention's kernel_options for a GPU of `properties` (torch.cuda.get_device_properties') at head_size, in
    the order to try them: torch's own tiles ({}) where the GPU has the shared memory they need; else the fastest
    tiles whose estimated shared memory fits it, then the smallest as a fallback."""
    shared = properties.shared_memory_per_block_optin
    if shared >= FLEX_DEFAULT_TILES_BYTES:
        return ({},)
    smallest = (FLEX_FORWARD_TILES[-1], FLEX_BACKWARD_TILES[-1])
    forward = [tiles for tiles in FLEX_FORWARD_TILES if flex_tile_bytes(*tiles[:3], head_size) <= shared]
    backward = [(m, n, s, w) for m, n, s, w in FLEX_BACKWARD_TILES if flex_tile_bytes(n, m, s, head_size) <= shared]
    picks = [smallest] if not (forward and backward) else list(dict.fromkeys([(forward[0], backward[0]), smallest]))
    return tuple(dict(fwd_BLOCK_M=m, fwd_BLOCK_N=n, fwd_num_stages=stages, fwd_num_warps=warps,
                      bwd_BLOCK_M1=m1, bwd_BLOCK_N1=n1, bwd_BLOCK_M2=n1, bwd_BLOCK_N2=m1,
                      bwd_num_stages=bwd_stages, bwd_num_warps=bwd_warps)
                 for (m, n, stages, warps), (m1, n1, bwd_stages, bwd_warps) in picks)

def flex_probe(device, n_head, head_size, dtype, block, kernel_options):
    """None where FlexAttention's forward and backward compile and run on `device` with kernel_options, on two
    blocks of `block` positions holding two documents; else why not, in one line."""
    try:
        q, k, v = (torch.randn(1, n_head, 2 * block, head_size, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        doc = (torch.arange(2 * block, device=device) >= block + block // 2).long()[None]
        mask = flex_block_mask(doc, 2 * block, 2, block, device)
        flex_document_attention(q, k, v, mask, kernel_options, dtype).sum().backward()
        if not bool(torch.isfinite(q.grad).all()):
            return 'its gradients are not finite'
    except Exception as e: # out of shared memory, a Triton or compiler error, a torch without flex: all fall back
        lines = str(e).strip().splitlines()
        return f'{type(e).__name__}: {lines[0]}' if lines else type(e).__name__
    return None
