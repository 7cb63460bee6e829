"""
The kinds of attention model.py's GPT runs, and the one choice among them that GPT.forward makes for all its layers:
GPT-2's causal attention, or what a sliding window (attn_window, in blocks with attn_window_block), documents
(doc_token), padded rows and generation's KV cache restrict it to. Each kind computes the same attention where
another can run; they differ in the kernel and the memory it takes:

| kind | where | kernel |
|---|---|---|
| causal | nothing but causality restricts attention | SDPA's is_causal: FlashAttention on a GPU |
| varlen | a window by position and/or documents, Ampere or later | FlashAttention's variable-length kernel |
| flex | a window in blocks, with or without documents, on CUDA | FlexAttention: the blocks the mask empties skipped |
| window | a window where no kernel above runs (a CPU) | SDPA under a mask, a block of queries at a time |
| masked | padded rows, no window | SDPA under a (T, T) mask |
| cache | generation with a KVCache | SDPA under a mask of the new positions against all cached ones |

Besides, window_document_attention: gpt2026.py's attention (its window by position within documents) in the same
variable-length kernel, which a CUDA run passes to GPT2026 in place of its SDPA under a mask.

Like model.py, this file needs only torch.
"""
import functools
import inspect
from typing import NamedTuple

import torch
from torch.nn import functional as F

try: # FlexAttention: torch 2.5 and later
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:
    BlockMask = flex_attention = None


class Attention(NamedTuple):
    """The attention every layer runs in one forward, chosen once by choose_attention, and what that kind needs."""
    kind: str # 'causal', 'varlen', 'flex', 'window', 'masked', 'cache' (the table above)
    mask: torch.Tensor = None # additive: masked (B, 1, T, T); window (B, n, 1, w, 2w); cache (B or 1, 1, T, keys)
    documents: tuple = () # varlen: (FlashAttention's kernel, its dtype, cu_seqlens, longest: document_segments')
    window: int = 0 # varlen: the sliding window (0: none)
    offset: int = 0 # cache: the position of the first new token
    flex: tuple = () # flex: (its BlockMask, kernel_options, the dtype it runs in)

CAUSAL = Attention('causal')


def attend(q, k, v, attention, cache, dropout_p):
    """The attention of q, k, v (B, nh, T, hs) of the kind `attention` names; cache: this layer's (keys, values) of a
    KVCache; dropout_p: the attention dropout, applied by the kernels that take it."""
    kind = attention.kind
    if kind == 'causal': # flash attention where the hardware has it, never a (T, T) matrix there
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if kind == 'varlen':
        return document_attention(q, k, v, *attention.documents, attention.window)
    if kind == 'flex':
        return flex_document_attention(q, k, v, *attention.flex)
    if kind == 'window':
        return blocked_attention(q, k, v, attention.mask, dropout_p)
    if kind == 'cache': # the new positions join the cached ones, then attend to all of them under the mask
        keys, values = cache
        end = attention.offset + q.size(2)
        keys[:, :, attention.offset:end], values[:, :, attention.offset:end] = k, v
        k, v = keys[:, :, :end], values[:, :, :end]
    if kind in ('masked', 'cache'):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention.mask, dropout_p=dropout_p)
    raise ValueError(f"unknown attention kind {kind!r}")


def choose_attention(config, idx, pos, cache, window, dtype, varlen_kernel=None, flex_options=None):
    """The Attention every layer of a forward on idx (B, T) runs, chosen once from what causality, the sliding
    `window`, config.doc_token, the cache and padding (pos: GPT.forward's positions, 2-D with padding) let each
    position see. dtype: the one the attention's matrix products run in (GPT.compute_dtype's). varlen_kernel:
    FlashAttention's variable-length kernel where it runs (GPT.varlen_kernel), else None; flex_options: the
    kernel_options of FlexAttention where it runs (GPT.flex_kernel_options; {}: torch's tiles), else None."""
    doc_token = config.doc_token
    b, t = idx.size()
    padded = pos.dim() == 2
    if cache is None and doc_token < 0 and not (window and t > window) and not padded:
        return CAUSAL # nothing but causality restricts attention here
    block = config.attn_window_block # a window in blocks: FlashAttention's is by position, the masks here
    by_position = not (block and window and t > window)
    kernel = varlen_kernel if cache is None and not padded and by_position else None
    if kernel is not None: # in `dtype`: value_residual's fp32 lambda makes v fp32, qk_norm leaves q and k in fp32
        return Attention('varlen', documents=(kernel, dtype, *document_segments(idx, doc_token)), window=window)
    doc = None
    if doc_token >= 0: # a document's id: how many doc_tokens up to and including the position
        doc = ((idx == doc_token) & (pos >= 0)).cumsum(1) # padding is in no document's count
        if cache is not None:
            if cache.length:
                doc = doc + cache.docs[:, cache.length - 1:cache.length]
            cache.docs[:, cache.length:cache.length + t] = doc
    if cache is not None or not window or padded: # a mask of every query against every key: the cached ones too
        keys, k_doc = pos, doc
        if cache is not None:
            keys = torch.arange(cache.length + t, device=idx.device)
            k_doc = None if doc is None else cache.docs[:, :cache.length + t]
        mask = local_attention_mask(pos, keys, window, doc, k_doc, block).unsqueeze(-3) # (B or 1, 1, t, keys)
        if padded: # a padding query attends to itself alone: no row of the mask empty (SDPA's NaN)
            mask = mask | torch.eye(t, dtype=torch.bool, device=idx.device)
        mask = additive_mask(mask, dtype)
        return Attention('masked', mask=mask) if cache is None else Attention('cache', mask, offset=cache.length)
    if flex_options is not None and not by_position:
        mask = flex_block_mask(doc, t, window // block, block, idx.device)
        return Attention('flex', flex=(mask, flex_options, dtype))
    n = -(-t // window) # blocks of `window` queries, the last one padded; each sees its block and the one before
    q_pos = torch.arange(n * window, device=idx.device).view(n, window)
    k_pos = torch.arange(-window, (n + 1) * window, device=idx.device).unfold(0, 2 * window, window)[:n]
    q_doc = k_doc = None
    if doc is not None: # padding positions get document -1, which no real position has
        framed = F.pad(doc, (window, n * window - t + window), value=-1)
        q_doc = framed[:, window:(n + 1) * window].view(b, n, window)
        k_doc = framed.unfold(1, 2 * window, window)[:, :n]
    mask = local_attention_mask(q_pos, k_pos, window, q_doc, k_doc, block) # in blocks: none over window - 1 back
    mask = additive_mask(mask, dtype)
    return Attention('window', mask=mask.expand(b, n, window, 2 * window).unsqueeze(2).contiguous())


# -----------------------------------------------------------------------------
# Masks, and attention under them: what runs where no kernel skips the masked keys

def local_attention_mask(q_pos, k_pos, window, q_doc=None, k_doc=None, block=0):
    """(..., Tq, Tk) bool, True where a query may attend to a key: a key at a position from 0 up to the query's,
    fewer than `window` back (0: any), and of the same document (with the documents' ids q_doc, k_doc). block > 0
    (attn_window_block): `window` counts blocks of `block` positions from 0, FlexAttention's block masks: a key in
    one of the window // block blocks up to the query's, every such key up to the query in its document."""
    q_pos, k_pos = q_pos[..., :, None], k_pos[..., None, :]
    mask = (k_pos >= 0) & (k_pos <= q_pos)
    if window: # each side compared as it is, not their (Tq, Tk) difference: no int64 matrix beside the mask
        near = k_pos // block > q_pos // block - window // block if block else k_pos > q_pos - window
        mask = mask & near
    if q_doc is not None:
        mask = mask & (q_doc[..., :, None] == k_doc[..., None, :])
    return mask

def additive_mask(mask, dtype):
    """A bool mask (True: attend) as the float mask SDPA adds to its scores, 0 or -inf in `dtype`, made once a
    forward: given the bool mask, SDPA converts it in every layer and keeps each layer's copy for backward."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float('-inf'))

def blocked_attention(q, k, v, mask, dropout_p):
    """Sliding-window attention in blocks: the queries of each block of w positions (w = attn_window) against the
    keys of their block and of the block before, under `mask` (B, n_blocks, 1, w, 2w): memory and compute grow as
    T * w, not T**2. q, k, v (B, nh, T, hs); T is padded to whole blocks, and one block of keys goes in front."""
    B, nh, T, hs = q.shape
    n, w = mask.size(1), mask.size(-2)
    pad = n * w - T
    q = F.pad(q, (0, 0, 0, pad)).view(B, nh, n, w, hs)
    k, v = (F.pad(t, (0, 0, w, pad)) for t in (k, v))
    k, v = (torch.cat((t[:, :, :-w].view(B, nh, n, w, hs), t[:, :, w:].view(B, nh, n, w, hs)), dim=3) for t in (k, v))
    # each block a batch entry of attention's 4-D kernels: (B * n, nh, w or 2w, hs)
    q, k, v = (t.transpose(1, 2).reshape(B * n, nh, -1, hs) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.view(B * n, 1, w, 2 * w), dropout_p=dropout_p)
    return y.view(B, n, nh, w, hs).transpose(1, 2).reshape(B, nh, n * w, hs)[:, :, :T]


# -----------------------------------------------------------------------------
# FlashAttention's variable-length kernel: documents and windows by position

# torch._disable_dynamo is torch.compiler.disable that imports torch's compiler at the first call, not with model.py
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

def varlen_kernel(device, dtype, head_size, flash_kernel=None, dropout=False):
    """FlashAttention's variable-length kernel where it runs (flash_kernel None: an Ampere or later GPU; True: on any
    device, as estimate_memory.py traces a CUDA run on a CPU; False: never), else None (varlen_missing says why)."""
    return None if varlen_missing(device, dtype, head_size, flash_kernel, dropout) else flash_varlen_attn()

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

# -----------------------------------------------------------------------------
# Generation's cache

class KVCache:
    """The keys and values of every layer for the positions run so far, so that generation feeds the model only its
    new tokens. Static, as gpt-fast's: max_len positions; GPT.forward(idx, cache=...) writes at length, advances it."""

    def __init__(self, config, batch_size, max_len, device, dtype):
        shape = (batch_size, config.n_head, max_len, config.n_embd // config.n_head)
        self.layers = [(torch.empty(shape, device=device, dtype=dtype), torch.empty(shape, device=device, dtype=dtype))
                       for _ in range(config.n_layer)]
        # doc_token: the document of each position, for the masks of the positions that follow
        self.docs = torch.zeros(batch_size, max_len, dtype=torch.long, device=device) if config.doc_token >= 0 else None
        self.max_len = max_len
        self.length = 0 # positions filled
