"""
Chunked, fused linear + cross-entropy, tuned: the loss train.py gives model.py's GPT (its loss_fn), without the (rows,
vocab) logits.

nanoGPT computes `lm_head(x)` for every position, a (B*T, vocab) logits tensor (batch 64 x block 1024 x 50304 in
bf16 is 6.14 GiB, plus fp32 copies in cross-entropy), which is what runs 12 GB cards out of memory.
chunked_cross_entropy fuses the vocabulary projection with cross-entropy over row chunks, so those logits never exist,
in training or in evaluation; naive_cross_entropy is nanoGPT's loss, for comparison. model.py's own
linear_cross_entropy computes the same in fewer lines; this one makes fewer passes over each chunk (folded scales, exp2,
a transposed buffer eagerly, a compiled softmax in a compiled model) and sizes its chunks to what they allocate.
"""

import functools
import math

import torch
from torch.nn import functional as F

# The bytes one chunk may allocate (GPT's loss_chunk_mib, train.py's key of that name): its logits, the buffers of its
# softmax and gradient, and a block of the weight gradient's product; chunk_bytes_per_row counts them. 1 GiB holds
# 3,300 rows of GPT-2's 50304-token vocabulary under bf16 autocast, so batch 12 x 1024 takes 4 chunks: each chunk is
# some 20 operators (kernel launches), which an eager GPU step of a small model waits on, and fewer, larger chunks
# run the matmuls no slower (docs/loss.md). Where nanoGPT's loss of every row fits it whole, that runs, in one piece.
DEFAULT_CHUNK_BYTES = 2 ** 30
LOG2E, LN2 = 1 / math.log(2), math.log(2)  # exp(x) = exp2(x * LOG2E), log(x) = log2(x) * LN2
VOCAB_BLOCK = 8192  # rows of the weight gradient a low-precision product covers at once where the whole one won't fit


def _accumulation_dtype(compute_dtype):
    """fp32, or fp64 for fp64 inputs: torch.promote_types(compute_dtype, fp32), without its operator."""
    return torch.float64 if compute_dtype == torch.float64 else torch.float32


def weight_gradient_block(vocab_size, n_embd, compute_dtype, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Vocabulary rows of the weight gradient's low-precision product (block, d), on its way into the fp32 gradient:
    all of them (one matmul a chunk) where that takes at most a quarter of chunk_bytes, else VOCAB_BLOCK."""
    whole = vocab_size * n_embd * compute_dtype.itemsize
    return vocab_size if whole <= chunk_bytes // 4 else min(vocab_size, VOCAB_BLOCK)


def chunk_bytes_per_row(vocab_size, n_embd, compute_dtype, need_grad=True, fused=False, softcap=0.0):
    """The bytes one row of a chunk allocates: the logits buffer (fp32 eagerly, the compute dtype compiled), beside
    it eagerly under autocast the low-precision product, then the gradient's low-precision copy g, a tanh buffer with
    softcap and gradients (eager), and the row's (1, d) operands in the compute dtype (h scaled, g @ W). The (N, d)
    tensors of every row, as the hidden gradient, are the batch's, not a chunk's."""
    compute = compute_dtype.itemsize
    buffer = compute if fused else _accumulation_dtype(compute_dtype).itemsize
    tanh = buffer if softcap and need_grad and not fused else 0
    low_precision = compute if buffer != compute else 0
    return vocab_size * (buffer + low_precision + tanh) + 2 * n_embd * compute


def one_piece_bytes(n_rows, vocab_size, compute_dtype, need_grad=True):
    """The bytes of nanoGPT's loss in one piece (naive_cross_entropy): (rows, V) logits in the accumulation dtype,
    their log-softmax and, in backward, its gradient (as measured with training/memory/tracer.py; the compute-dtype
    logits die as their fp32 copy is made)."""
    return n_rows * vocab_size * _accumulation_dtype(compute_dtype).itemsize * (3 if need_grad else 2)


def chunk_rows(n_rows, vocab_size, n_embd, compute_dtype, chunk_bytes=DEFAULT_CHUNK_BYTES, need_grad=True,
               fused=False, softcap=0.0):
    """Rows a chunk of n_rows takes within chunk_bytes (at least 1): the fewest chunks that fit, of equal size, a
    multiple of 16 (as matmul kernels like) where that still fits."""
    product = weight_gradient_block(vocab_size, n_embd, compute_dtype, chunk_bytes) * n_embd * compute_dtype.itemsize
    per_row = chunk_bytes_per_row(vocab_size, n_embd, compute_dtype, need_grad, fused, softcap)
    most = max(1, (chunk_bytes - (product if need_grad else 0)) // per_row)
    chunks = max(1, -(-n_rows // most))  # the fewest of at most `most` rows (one for no rows)
    rows = max(1, -(-n_rows // chunks))  # n_rows split evenly over them
    rounded = -(-rows // 16) * 16
    return rounded if rounded <= most else rows


def _compute_dtype(hidden, weight):
    """The dtype F.linear would compute in here: autocast's if autocast is on, else the inputs' common dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)

def _scaled(x, factor, dtype):
    """x * factor, rounded once into `dtype`: no temporary of x's size in x's (fp32) dtype."""
    return torch.mul(x, factor, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def _softmax_chunk(logits, targets, row_factors, need_grad, fold_scales, acc_dtype, softcap=0.0, tanh=None,
                   losses=None):
    """One chunk's cross-entropy. logits: (rows, V) logits in base 2, overwritten; targets (0 on ignored rows) and
    row_factors: (rows, 1). Returns the (rows, 1) losses in bits (written to `losses` if given; ignored rows' too, the
    caller masks them) and, with need_grad, the rows' gradient factors (rows, 1), logits then holding
    sum * (softmax - onehot) (fold_scales) or softmax - onehot.
    softcap > 0: logits come in as z / softcap (natural units) and are capped to softcap * tanh(z / softcap) in bits
    here, the gradient taking the factor 1 - tanh**2 (d capped / d z).
    Run eagerly, logits is an fp32 (fp64: acc_dtype) buffer and every op a pass over it in place: no temporary of the
    chunk's size (with softcap and need_grad, `tanh`, a buffer of logits' shape, keeps the tanh). Compiled
    (_compiled_softmax_chunk), logits may be in the matmul's dtype, upcast inside the kernel (an fp32 softmax without
    an fp32 buffer), and Inductor fuses the same ops: the chunk is read for its max and sum, then read again and the
    gradient written over it, where the eager path makes four to six passes. There the onehot is a comparison of
    column indices, as scatter_add_ would stop the fusion, and `tanh` is None.
    Eagerly each op is a kernel launch, which an eager GPU step of a small model waits on: no op here is spare."""
    compiled = torch.compiler.is_compiling()
    # eagerly logits itself; compiled, a value in registers that only the gradient's write stores (bf16: upcast)
    x = logits.to(acc_dtype, copy=compiled)
    if softcap:
        tanh = torch.tanh(x, out=tanh) if need_grad else x.tanh_()
        x = torch.mul(tanh, softcap * LOG2E, out=x)
    x = x.sub_(x.amax(1, keepdim=True))  # each row's max is 0
    target_logits = x.gather(1, targets)
    x = x.exp2_()
    sum_exp = x.sum(1, keepdim=True)  # >= 1: the max term is 2**0
    losses = torch.sub(sum_exp.log2(), target_logits, out=losses)
    if not need_grad:
        return losses, None
    if fold_scales:
        target_terms, row_scales = sum_exp.neg(), row_factors / sum_exp
    else:
        x = x.div_(sum_exp)
        target_terms, row_scales = torch.full_like(sum_exp, -1.0), row_factors
    if compiled:
        x = torch.where(torch.arange(x.shape[1], device=x.device) == targets, x + target_terms, x)
    else:
        x.scatter_add_(1, targets, target_terms)
    if softcap:
        x = x.mul_(tanh.square_().neg_().add_(1.0))
    if compiled:
        logits.copy_(x)  # eagerly x is logits, written in place
    return losses, row_scales


@functools.cache
def _compiled_softmax_chunk():
    """_softmax_chunk compiled, one graph for all chunk sizes (the last chunk is shorter; reduction='none' keeps any
    number of rows): the rows are a size its kernels take (_dynamic_rows), the vocabulary a constant they are
    compiled for (their loops over a row unrolled, their loads aligned), whatever vocabularies the process saw
    before (dynamic=False: no size becomes one by changing). fullgraph: a graph break would split the fused kernel,
    so it is an error instead."""
    return torch.compile(_softmax_chunk, dynamic=False, fullgraph=True)


def _dynamic_rows(*tensors):
    """Mark the rows of a compiled chunk's (rows, ...) tensors as a size the graph takes, not a constant:
    dynamic=True would make the vocabulary a size too."""
    for t in tensors:
        torch._dynamo.maybe_mark_dynamic(t, 0)


def _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size, compute_dtype,
                            need_hidden_grad, need_weight_grad, per_row=False, fused=False, softcap=0.0,
                            chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Mean cross-entropy of (hidden @ weight.T) against targets, chunk by chunk over the rows.
    With gradients asked for, they are computed in the same pass: d loss / d logits = (softmax - onehot) / n_valid
    for each chunk, then grad_hidden = g @ W and grad_weight += g.T @ h, so the total work is the three N*d*V
    matmuls of the naive path and nothing is recomputed. The weight gradient accumulates in fp32.

    Each chunk's (rows, V) logits live in one buffer allocated once and overwritten in place. Eagerly it is fp32 and
    held transposed, (V, rows) in memory: the (V, d) @ (d, rows) product runs faster on CPU than (rows, d) @ (d, V),
    and the reductions over V run along contiguous columns. Every pass over that buffer is memory-bound time beyond
    the matmuls (and weighs more on a GPU, whose matmuls are faster), so per-row factors go into the small (rows, d)
    operands: log2(e), so that exp2 (faster than exp on CPU) gives the exponentials, and the softmax's 1 / sum with
    1 / n_valid, so the buffer becomes exp - sum * onehot = sum * (softmax - onehot) and is never divided.
    Under fp16 those scales (down to 1 / (n_valid * V)) fall below fp16's normal range, so there the softmax is
    normalized in fp32 before the cast and 1 / n_valid applied to the fp32 results.
    Every per-row tensor is cut into the chunks' rows by one split, and the buffer's views made once a chunk length,
    so a chunk costs its matmuls and softmax passes and little else in operators (kernel launches on a GPU).
    fused=True runs each chunk's softmax as compiled kernels (_compiled_softmax_chunk) instead of eager
    passes; its buffer is row-major, what a kernel reducing along rows reads best, in the compute dtype.
    per_row=True returns the (N,) losses of the rows (0 on ignored rows) instead of their mean.
    softcap > 0 caps the logits z to softcap * tanh(z / softcap): the factor folded into the rows is 1 / softcap
    instead of log2(e), the chunk's softmax applies tanh and log2(e) * softcap, and the eager path keeps the tanh in
    a second buffer of the chunk's size for the gradient. chunk_bytes sizes the weight gradient's product blocks
    (weight_gradient_block)."""
    w = weight.to(compute_dtype)  # the matmuls run in the compute dtype; casts are explicit: autocast changes nothing
    acc_dtype = _accumulation_dtype(compute_dtype)
    fold_scales = compute_dtype != torch.float16
    need_grad = need_hidden_grad or need_weight_grad
    n_rows, vocab_size = hidden.shape[0], weight.shape[0]
    valid = (targets != ignore_index).unsqueeze(1)  # (N, 1), as the rows' targets and factors
    # dividing by at least 1 makes an all-ignored batch give loss 0 and zero gradients, not 0/0 = NaN
    inv_count = 1.0 / valid.sum().clamp(min=1).to(acc_dtype)
    safe_targets = torch.where(valid, targets.unsqueeze(1), 0)  # (N, 1): vocabulary columns of the (rows, V) chunks
    row_factors = valid * inv_count  # 1 / n_valid, 0 on ignored rows
    row_losses = torch.empty(n_rows, 1, dtype=acc_dtype, device=hidden.device)  # in bits (log base 2), unmasked
    grad_hidden = torch.empty_like(hidden) if need_hidden_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_weight_grad else None
    softmax_chunk = _compiled_softmax_chunk() if fused else _softmax_chunk
    chunk_buffer = torch.empty(min(chunk_size, n_rows) * vocab_size, dtype=compute_dtype if fused else acc_dtype,
                               device=hidden.device)
    tanh_buffer = torch.empty_like(chunk_buffer) if softcap and need_grad and not fused else None
    # logits in base 2 (exp2 of them is exp of the logits), or z / softcap for the cap's tanh
    h_logits = _scaled(hidden, 1.0 / softcap if softcap else LOG2E, compute_dtype)
    # what each chunk reads or writes by rows (hidden for the weight gradient, valid for fp16's)
    rows_of = dict(h_logits=h_logits if fused else h_logits.t(), targets=safe_targets, factors=row_factors,
                   losses=row_losses, grad_hidden=grad_hidden, hidden=hidden if need_weight_grad else None,
                   valid=None if fold_scales else valid)
    chunks = {name: tensor.split(chunk_size, dim=1 if name == 'h_logits' and not fused else 0)
              for name, tensor in rows_of.items() if tensor is not None}
    block = weight_gradient_block(vocab_size, w.shape[1], compute_dtype, chunk_bytes)
    w_t = w.t() if fused else None
    weight_blocks = grad_weight.split(block) if grad_weight is not None and block < vocab_size else None
    views = {}  # rows -> (the (V, rows) or (rows, V) view of the buffer the matmul writes, logits (rows, V), tanh)

    def buffer_views(rows):
        if rows not in views:
            chunk = chunk_buffer[:vocab_size * rows]  # contiguous for any rows
            written = chunk.view(rows, vocab_size) if fused else chunk.view(vocab_size, rows)
            tanh = None if tanh_buffer is None else tanh_buffer[:chunk.numel()].view(vocab_size, rows).t()
            views[rows] = written, written if fused else written.t(), tanh
        return views[rows]

    for k, h_log in enumerate(chunks['h_logits']):
        written, logits, tanh = buffer_views(h_log.shape[0 if fused else 1])
        if fused:
            torch.mm(h_log, w_t, out=written)
        elif written.dtype == compute_dtype:
            torch.mm(w, h_log, out=written)
        else:
            written.copy_(torch.mm(w, h_log))  # in the buffer's dtype: softmax in fp32, as F.cross_entropy does
        rows = (logits, chunks['targets'][k], chunks['factors'][k])
        if fused:
            _dynamic_rows(*rows)
        chunk_losses, row_scales = softmax_chunk(*rows, need_grad, fold_scales, acc_dtype, softcap, tanh,
                                                 None if fused else chunks['losses'][k])
        if fused:
            chunks['losses'][k].copy_(chunk_losses)
        if not need_grad:
            continue
        g = logits.to(compute_dtype)  # (rows, V), in the buffer's layout
        if grad_hidden is not None:
            torch.mul(g @ w, row_scales, out=chunks['grad_hidden'][k])  # scaled in fp32, not in the product's dtype
        if grad_weight is not None:
            # ignored rows (scale 0) add nothing to the weight gradient
            h_scaled = _scaled(chunks['hidden'][k], row_scales if fold_scales else chunks['valid'][k], compute_dtype)
            if g.dtype == grad_weight.dtype:
                grad_weight.addmm_(g.t(), h_scaled)  # accumulates in place: no (V, d) temporary
            elif weight_blocks is None:  # the low-precision product whole, accumulated in fp32
                grad_weight.add_(g.t() @ h_scaled)
            else:  # in blocks of the vocabulary, where the whole product would not fit a quarter of the budget
                for rows, g_rows in zip(weight_blocks, g.t().split(block)):
                    rows.add_(g_rows @ h_scaled)
        del g
    if grad_weight is not None and not fold_scales:
        grad_weight.mul_(inv_count)
    row_losses = torch.where(valid, row_losses, 0.0)  # ignored rows' losses were computed against target 0
    loss = row_losses.view(-1).mul_(LN2) if per_row else row_losses.sum() * (inv_count * LN2)
    return loss, grad_hidden, grad_weight


def _graph_is_kept():
    """Whether the running backward keeps the graph (retain_graph=True), so saved tensors are needed again.
    Private in torch; where it is missing, assume kept, the safe answer."""
    keep_graph = getattr(torch._C._autograd, '_get_current_graph_task_keep_graph', None)
    return keep_graph is None or keep_graph()


class _LinearCrossEntropy(torch.autograd.Function):
    """Autograd wrapper: the gradients are computed in forward and only scaled by the upstream gradient here,
    which carries gradient-accumulation (1/k) and GradScaler factors."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused, softcap, chunk_bytes):
        loss, grad_hidden, grad_weight = _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size,
                                                                 compute_dtype, *ctx.needs_input_grad[:2], fused=fused,
                                                                 softcap=softcap, chunk_bytes=chunk_bytes)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        # Scaling the saved gradients in place spares a second copy of them (the weight gradient alone is V x d
        # fp32), but only when no later backward through a retained graph needs them unscaled.
        scale = torch.Tensor.mul if _graph_is_kept() else torch.Tensor.mul_
        if grad_hidden is not None:
            grad_hidden = scale(grad_hidden, grad_loss.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = scale(grad_weight, grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def _row_losses(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused, softcap, chunk_bytes):
    """The (N,) losses, 0 on ignored rows: only the other rows are projected onto the vocabulary."""
    keep = targets != ignore_index
    kept = _chunked_loss_and_grads(hidden[keep], weight, targets[keep], ignore_index, chunk_size, compute_dtype,
                                   False, False, per_row=True, fused=fused, softcap=softcap, chunk_bytes=chunk_bytes)[0]
    losses = kept.new_zeros(targets.shape)
    losses[keep] = kept
    return losses


def chunked_cross_entropy(hidden, weight, targets, *, ignore_index=-1, chunk_size=None, reduction='mean',
                          softcap=0.0, chunk_bytes=None):
    """Mean cross-entropy of the logits `hidden @ weight.T` against `targets`, ignoring `ignore_index`,
    without ever holding more than chunk_bytes of logits and softmax buffers (None: DEFAULT_CHUNK_BYTES; chunk_rows
    turns it into rows), or chunk_size rows of them if given. softcap > 0: of the logits
    softcap * tanh(logits / softcap) (Gemma 2's logit soft-capping), with their exact gradients.

    hidden (N, d), weight (V, d), targets (N,) -> scalar. Where nanoGPT's loss (naive_cross_entropy) of all N rows
    in one piece fits chunk_bytes and no chunk_size is given, that runs: fewer operators than even one chunk.
    Chunked, with gradients enabled the forward pass also computes both gradients (weight gradient accumulated in
    fp32); under no_grad it computes the loss only. If every target is ignored the loss is 0 (not NaN).
    reduction='none' returns the (N,) loss of each row instead, 0 on ignored rows, as F.cross_entropy does; it is
    for evaluation: ignored rows skip the vocabulary projection, and it has no gradients (an error if asked for).
    Called from code that torch.compile compiles (a compiled GPT), each chunk's softmax runs as compiled kernels
    (the chunk loop and its matmuls stay eager), and the one piece is compiled whole; called eagerly, all of it is
    eager."""
    chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if reduction not in ('mean', 'none'):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    compute_dtype = _compute_dtype(hidden, weight)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if reduction == 'none' and wants_grad:
        raise RuntimeError("chunked_cross_entropy(reduction='none') has no gradients: call it under torch.no_grad()")
    if chunk_size is None and one_piece_bytes(hidden.shape[0], weight.shape[0], compute_dtype,
                                              wants_grad) <= chunk_bytes:
        return _one_piece(hidden, weight, targets, ignore_index, reduction, softcap)
    return _chunked_cross_entropy(hidden, weight, targets, ignore_index, chunk_size, reduction,
                                  fused=torch.compiler.is_compiling(), softcap=float(softcap),
                                  chunk_bytes=chunk_bytes, compute_dtype=compute_dtype, wants_grad=wants_grad)


def _one_piece(hidden, weight, targets, ignore_index, reduction, softcap):
    """naive_cross_entropy, its mean 0 (not NaN) where every target is ignored, as the chunked path's."""
    if reduction == 'none':
        return naive_cross_entropy(hidden, weight, targets, ignore_index=ignore_index, reduction='none',
                                   softcap=softcap)
    total = naive_cross_entropy(hidden, weight, targets, ignore_index=ignore_index, reduction='sum', softcap=softcap)
    return total / (targets != ignore_index).sum().clamp(min=1)


@torch._disable_dynamo  # a graph break here is cheap; the chunk loop stays eager under torch.compile
def _chunked_cross_entropy(hidden, weight, targets, ignore_index, chunk_size, reduction, fused, softcap, chunk_bytes,
                           compute_dtype, wants_grad):
    """chunked_cross_entropy in chunks, run outside torch.compile's graphs; fused: each chunk's softmax compiled."""
    if chunk_size is None:
        chunk_size = chunk_rows(hidden.shape[0], weight.shape[0], weight.shape[1], compute_dtype, chunk_bytes,
                                wants_grad, fused, softcap)
    if reduction == 'none':
        with torch.no_grad():
            return _row_losses(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused, softcap,
                               chunk_bytes)
    if not wants_grad:
        with torch.no_grad():
            return _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size, compute_dtype,
                                           False, False, fused=fused, softcap=softcap, chunk_bytes=chunk_bytes)[0]
    return _LinearCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused,
                                     softcap, chunk_bytes)


def naive_cross_entropy(hidden, weight, targets, *, ignore_index=-1, chunk_size=None, reduction='mean', softcap=0.0,
                        chunk_bytes=None):
    """nanoGPT's loss, for comparison (GPT(config, loss_fn=naive_cross_entropy) in bench.py and estimate_memory.py
    --loss=naive): the full (N, vocab) logits, then cross-entropy; chunk_size and chunk_bytes are ignored. CUDA
    autocast runs cross-entropy's log_softmax in fp32 (CPU autocast keeps bf16), so the cast is explicit (fp64 stays
    fp64) and a trace on the CPU matches the GPU. softcap > 0: of the logits capped as logit_softcap caps them."""
    logits = F.linear(hidden, weight)
    logits = logits.to(_accumulation_dtype(logits.dtype))
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction=reduction)
