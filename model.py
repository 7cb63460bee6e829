"""
Full definition of a GPT Language Model, all of it in this single file (it needs only torch: copy it anywhere).
Same modules, parameter names, init and API as nanoGPT's model.py, so nanoGPT checkpoints load as they are.

The one difference: the loss. nanoGPT computes `lm_head(x)` for every position, a (B*T, vocab) logits tensor
(batch 64 x block 1024 x 50304 in bf16 is 6.14 GiB, plus fp32 copies in cross-entropy), which is what runs
12 GB cards out of memory. Here the loss goes through `chunked_cross_entropy` (the second half of this file), which
fuses the vocabulary projection with cross-entropy over row chunks, so those logits never exist, in training or in
evaluation.

References:
1) the official GPT-2 TensorFlow implementation released by OpenAI:
https://github.com/openai/gpt-2/blob/master/src/model.py
2) huggingface/transformers PyTorch implementation:
https://github.com/huggingface/transformers/blob/main/src/transformers/models/gpt2/modeling_gpt2.py
"""

import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

class LayerNorm(nn.Module):
    """ LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False """

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)

class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        # key, query, value projections for all heads, but in a batch
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        # output projection
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # regularization
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size() # batch size, sequence length, embedding dimensionality (n_embd)
        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v  = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) # (B, nh, T, hs)
        # causal self-attention; flash attention where the hardware has it, never a (T, T) matrix in memory there
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C) # re-assemble all head outputs side by side
        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y

class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc    = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu    = nn.GELU()
        self.c_proj  = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = self.c_fc(x)
        x = self.gelu(x)
        x = self.c_proj(x)
        x = self.dropout(x)
        return x

class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304 # GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for efficiency
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True # True: bias in Linears and LayerNorms, like GPT-2. False: a bit better and faster

class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        self.config = config
        # Run-time switches, not GPTConfig fields, so checkpoints' model_args stay nanoGPT's. Activation checkpointing
        # recomputes each block in backward instead of keeping its activations: about one extra forward pass for
        # the activation memory of all but one block. The loss function is swapped by tools that compare it with
        # nanoGPT's full-logits loss or count its memory (bench.py, estimate_memory.py).
        self.activation_checkpointing = False
        self.loss_fn = chunked_cross_entropy

        self.transformer = nn.ModuleDict(dict(
            wte = nn.Embedding(config.vocab_size, config.n_embd),
            wpe = nn.Embedding(config.block_size, config.n_embd),
            drop = nn.Dropout(config.dropout),
            h = nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f = LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight # https://paperswithcode.com/method/weight-tying

        # init all weights
        self.apply(self._init_weights)
        # apply special scaled init to the residual projections, per GPT-2 paper
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):
                torch.nn.init.normal_(p, mean=0.0, std=0.02/math.sqrt(2 * config.n_layer))

    def get_num_params(self, non_embedding=True):
        """
        Return the number of parameters in the model.
        For non-embedding count (default), the position embeddings get subtracted.
        The token embeddings would too, except due to the parameter sharing these
        params are actually used as weights in the final layer, so we include them.
        """
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n_params -= self.transformer.wpe.weight.numel()
        return n_params

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, reduction='mean'):
        """Returns (logits, loss).
        With targets: (None, loss). loss is the mean cross-entropy over targets != -1, computed by
        chunked_cross_entropy without building the (B, T, vocab) logits; nanoGPT returned those logits here,
        and no caller of the training or evaluation loss uses them. Call with targets=None for logits.
        reduction='none' (no gradients) gives the (B, T) losses of each position instead, 0 where targets are -1.
        Without targets: (logits of the last position, shape (B, 1, vocab), None), as nanoGPT does."""
        device = idx.device
        b, t = idx.size()
        assert t <= self.config.block_size, f"Cannot forward sequence of length {t}, block size is only {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=device) # shape (t)

        # forward the GPT model itself
        tok_emb = self.transformer.wte(idx) # token embeddings of shape (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos) # position embeddings of shape (t, n_embd)
        x = self.transformer.drop(tok_emb + pos_emb)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.transformer.h:
            # non-reentrant checkpointing: works with torch.compile and DDP, and restores the RNG for dropout
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        x = self.transformer.ln_f(x)

        if targets is not None:
            loss = self.loss_fn(x.view(b * t, -1), self.lm_head.weight, targets.view(-1), ignore_index=-1,
                                reduction=reduction)
            return None, (loss if reduction == 'mean' else loss.view(b, t))
        # inference-time mini-optimization: only forward the lm_head on the very last position
        logits = self.lm_head(x[:, [-1], :]) # note: using list [-1] to preserve the time dim
        return logits, None

    def crop_block_size(self, block_size):
        # model surgery to decrease the block size if necessary
        # e.g. we may load the GPT2 pretrained model checkpoint (block size 1024)
        # but want to use a smaller block size for some smaller, simpler model
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size])

    # GPT-2 sizes, as published by OpenAI
    PRETRAINED_ARGS = {
        'gpt2':         dict(n_layer=12, n_head=12, n_embd=768),  # 124M params
        'gpt2-medium':  dict(n_layer=24, n_head=16, n_embd=1024), # 350M params
        'gpt2-large':   dict(n_layer=36, n_head=20, n_embd=1280), # 774M params
        'gpt2-xl':      dict(n_layer=48, n_head=25, n_embd=1600), # 1558M params
    }

    @classmethod
    def pretrained_config(cls, model_type, override_args=None):
        """The GPTConfig of an OpenAI GPT-2 checkpoint (vocab 50257, block 1024, bias), without downloading it."""
        assert model_type in cls.PRETRAINED_ARGS, f"unknown model_type {model_type!r}: pick one of {list(cls.PRETRAINED_ARGS)}"
        override_args = override_args or {} # default to empty dict
        # only dropout can be overridden see more notes below
        assert all(k == 'dropout' for k in override_args)
        config_args = dict(cls.PRETRAINED_ARGS[model_type], vocab_size=50257, block_size=1024, bias=True)
        if 'dropout' in override_args:
            print(f"overriding dropout rate to {override_args['dropout']}")
            config_args['dropout'] = override_args['dropout']
        return GPTConfig(**config_args)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None):
        config = cls.pretrained_config(model_type, override_args)
        from transformers import GPT2LMHeadModel  # only needed here: imported lazily
        print("loading weights from pretrained gpt: %s" % model_type)
        return cls.from_hf_model(GPT2LMHeadModel.from_pretrained(model_type), config)

    @classmethod
    def from_hf_model(cls, model_hf, config):
        """A GPT with the weights of a Hugging Face GPT2LMHeadModel of the same shape."""
        model = GPT(config)
        sd = model.state_dict()
        sd_keys = [k for k in sd.keys() if not k.endswith('.attn.bias')] # discard this mask / buffer, not a param

        sd_hf = model_hf.state_dict()
        # copy while ensuring all of the parameters are aligned and match in names and shapes
        sd_keys_hf = [k for k in sd_hf.keys() if not k.endswith(('.attn.masked_bias', '.attn.bias'))] # buffers
        transposed = ['attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight']
        # basically the openai checkpoints use a "Conv1D" module, but we only want to use a vanilla Linear
        # this means that we have to transpose these weights when we import them
        assert len(sd_keys_hf) == len(sd_keys), f"mismatched keys: {len(sd_keys_hf)} != {len(sd_keys)}"
        for k in sd_keys_hf:
            with torch.no_grad():
                if any(k.endswith(w) for w in transposed):
                    assert sd_hf[k].shape[::-1] == sd[k].shape
                    sd[k].copy_(sd_hf[k].t())
                else:
                    assert sd_hf[k].shape == sd[k].shape
                    sd[k].copy_(sd_hf[k])
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type, optimizer_class=None):
        # start with all of the candidate parameters
        param_dict = {pn: p for pn, p in self.named_parameters()}
        # filter out those that do not require grad
        param_dict = {pn: p for pn, p in param_dict.items() if p.requires_grad}
        # create optim groups. Any parameters that is 2D will be weight decayed, otherwise no.
        # i.e. all weight tensors in matmuls + embeddings decay, all biases and layernorms don't.
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [
            {'params': decay_params, 'weight_decay': weight_decay},
            {'params': nodecay_params, 'weight_decay': 0.0}
        ]
        num_decay_params = sum(p.numel() for p in decay_params)
        num_nodecay_params = sum(p.numel() for p in nodecay_params)
        print(f"num decayed parameter tensors: {len(decay_params)}, with {num_decay_params:,} parameters")
        print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with {num_nodecay_params:,} parameters")
        if optimizer_class is not None: # an AdamW of the same arguments, e.g. one that keeps its moments in less memory
            return optimizer_class(optim_groups, lr=learning_rate, betas=betas)
        # Create AdamW optimizer and use the fused version if it is available
        fused_available = 'fused' in inspect.signature(torch.optim.AdamW).parameters
        use_fused = fused_available and device_type == 'cuda'
        extra_args = dict(fused=True) if use_fused else dict()
        optimizer = torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **extra_args)
        print(f"using fused AdamW: {use_fused}")

        return optimizer

    def estimate_mfu(self, fwdbwd_per_iter, dt, flops_promised=312e12):
        """ estimate model flops utilization (MFU) in units of the device's peak FLOPS (nanoGPT's: an A100's bf16) """
        # first estimate the number of flops we do per iteration.
        # see PaLM paper Appendix B as ref: https://arxiv.org/abs/2204.02311
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd//cfg.n_head, cfg.block_size
        flops_per_token = 6*N + 12*L*H*Q*T
        flops_per_fwdbwd = flops_per_token * T
        flops_per_iter = flops_per_fwdbwd * fwdbwd_per_iter
        # express our flops throughput as ratio of the peak flops
        flops_achieved = flops_per_iter * (1.0/dt) # per second
        mfu = flops_achieved / flops_promised
        return mfu

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """
        Take a conditioning sequence of indices idx (LongTensor of shape (b,t)) and complete
        the sequence max_new_tokens times, feeding the predictions back into the model each time.
        Most likely you'll want to make sure to be in model.eval() mode of operation for this.
        """
        for _ in range(max_new_tokens):
            # if the sequence context is growing too long we must crop it at block_size
            idx_cond = idx if idx.size(1) <= self.config.block_size else idx[:, -self.config.block_size:]
            # forward the model to get the logits for the index in the sequence
            logits, _ = self(idx_cond)
            # pluck the logits at the final step and scale by desired temperature
            logits = logits[:, -1, :] / temperature
            # optionally crop the logits to only the top k options
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('Inf')
            # apply softmax to convert logits to (normalized) probabilities
            probs = F.softmax(logits, dim=-1)
            # sample from the distribution
            idx_next = torch.multinomial(probs, num_samples=1)
            # append sampled index to the running sequence
            idx = torch.cat((idx, idx_next), dim=1)

        return idx

# -----------------------------------------------------------------------------
# chunked, fused linear + cross-entropy: the loss of GPT.forward, without the (rows, vocab) logits

# Elements of the one buffer that holds a chunk's logits (chunk rows x vocab): 19 * 2**20 elements, 76 MiB in fp32,
# 384 rows of GPT-2's 50304-token vocabulary, whatever the batch. Smaller chunks run the matmuls less efficiently,
# larger ones cost memory without speed (docs/loss.md). Small vocabularies get one chunk.
CHUNK_ELEMENTS = 19 * 2 ** 20
LOG2E, LN2 = 1 / math.log(2), math.log(2)  # exp(x) = exp2(x * LOG2E), log(x) = log2(x) * LN2
VOCAB_BLOCK = 8192  # rows of the weight gradient a low-precision product covers at once (12 MiB in bf16 at d=768)

def default_chunk_size(vocab_size):
    rows = max(1, CHUNK_ELEMENTS // vocab_size)
    return rows if rows < 16 else rows - rows % 16  # multiples of 16 suit matmul kernels

def _compute_dtype(hidden, weight):
    """The dtype F.linear would compute in here: autocast's if autocast is on, else the inputs' common dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)

def _scaled(x, factor, dtype):
    """x * factor, rounded once into `dtype`: no temporary of x's size in x's (fp32) dtype."""
    return torch.mul(x, factor, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def _softmax_chunk(logits, targets, valid, row_factors, need_grad, fold_scales):
    """One chunk's cross-entropy, eagerly. logits: (rows, V) fp32 (fp64) logits in base 2, overwritten; targets (0 on
    ignored rows), valid and row_factors: (rows, 1). Returns the (rows, 1) losses in bits (0 on ignored rows) and,
    with need_grad, the rows' gradient factors (rows, 1), logits then holding sum * (softmax - onehot) (fold_scales)
    or softmax - onehot. Each op is a pass over the chunk, so each runs in place: no temporary of the chunk's size."""
    row_max = logits.amax(1, keepdim=True)
    target_logits = logits.gather(1, targets)
    logits.sub_(row_max).exp2_()
    sum_exp = logits.sum(1, keepdim=True)  # >= 1: the max term is 2**0
    losses = torch.where(valid, row_max + sum_exp.log2() - target_logits, 0.0)
    if not need_grad:
        return losses, None
    if fold_scales:
        target_terms, row_scales = sum_exp.neg(), row_factors / sum_exp
    else:
        logits.div_(sum_exp)
        target_terms, row_scales = torch.full_like(sum_exp, -1.0), row_factors
    logits.scatter_add_(1, targets, target_terms)
    return losses, row_scales


def _softmax_chunk_fused(logits, targets, valid, row_factors, need_grad, fold_scales):
    """_softmax_chunk written for torch.compile: the same arguments and results, but logits may be in the matmul's
    dtype (bf16 logits are upcast inside the kernel: an fp32 softmax without an fp32 buffer). Inductor fuses it: the
    chunk is read for its max and sum, then read again and the gradient written over it, where _softmax_chunk makes
    four to six passes. Comparing column indices with the targets replaces scatter_add_, which would stop the fusion."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))
    row_max = x.amax(1, keepdim=True)
    target_logits = x.gather(1, targets)
    exp = torch.exp2(x - row_max)
    sum_exp = exp.sum(1, keepdim=True)
    losses = torch.where(valid, row_max + sum_exp.log2() - target_logits, 0.0)
    if not need_grad:
        return losses, None
    if fold_scales:
        target_terms, row_scales = sum_exp.neg(), row_factors / sum_exp
    else:
        exp = exp / sum_exp
        target_terms, row_scales = -1.0, row_factors
    is_target = torch.arange(x.shape[1], device=x.device) == targets
    logits.copy_(torch.where(is_target, exp + target_terms, exp))
    return losses, row_scales


# Compiled on first use, one graph for all chunk sizes (the last chunk is shorter; reduction='none' keeps any number
# of rows). fullgraph: a graph break would split the fused kernel, so it is an error instead.
_compiled_softmax_chunk = torch.compile(_softmax_chunk_fused, dynamic=True, fullgraph=True)


def _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size, compute_dtype,
                            need_hidden_grad, need_weight_grad, per_row=False, fused=False):
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
    fused=True runs each chunk's softmax as compiled kernels (_softmax_chunk_fused) instead of _softmax_chunk's
    passes; its buffer is row-major, what a kernel reducing along rows reads best, in the compute dtype.
    per_row=True returns the (N,) losses of the rows (0 on ignored rows) instead of their mean."""
    w = weight.to(compute_dtype)  # the matmuls run in the compute dtype; casts are explicit: autocast changes nothing
    acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
    fold_scales = compute_dtype != torch.float16
    need_grad = need_hidden_grad or need_weight_grad
    n_rows, vocab_size = hidden.shape[0], weight.shape[0]
    valid = (targets != ignore_index).unsqueeze(1)  # (N, 1), as the rows' targets and factors
    # dividing by at least 1 makes an all-ignored batch give loss 0 and zero gradients, not 0/0 = NaN
    inv_count = 1.0 / valid.sum().clamp(min=1).to(acc_dtype)
    safe_targets = torch.where(valid, targets.unsqueeze(1), 0)  # (N, 1): vocabulary columns of the (rows, V) chunks
    row_factors = valid * inv_count  # 1 / n_valid, 0 on ignored rows
    loss_sum = torch.zeros((), dtype=acc_dtype, device=hidden.device)  # in bits (log base 2) until the end
    row_losses = torch.empty(n_rows, dtype=acc_dtype, device=hidden.device) if per_row else None
    grad_hidden = torch.empty_like(hidden) if need_hidden_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_weight_grad else None
    softmax_chunk = _compiled_softmax_chunk if fused else _softmax_chunk
    chunk_buffer = torch.empty(min(chunk_size, n_rows) * vocab_size, dtype=compute_dtype if fused else acc_dtype,
                               device=hidden.device)
    for start in range(0, n_rows, chunk_size):
        rows = slice(start, start + chunk_size)
        h = hidden[rows]
        h_log2e = _scaled(h, LOG2E, compute_dtype)  # logits in base 2: exp2 of them is exp of the logits
        chunk = chunk_buffer[:vocab_size * h.shape[0]]  # contiguous for any rows
        logits = chunk.view(h.shape[0], vocab_size) if fused else chunk.view(vocab_size, h.shape[0]).t()
        if logits.dtype == compute_dtype:
            torch.mm(h_log2e, w.t(), out=logits)
        else:
            logits.copy_((w @ h_log2e.t()).t())  # in the buffer's layout; softmax in fp32, as F.cross_entropy does
        chunk_losses, row_scales = softmax_chunk(logits, safe_targets[rows], valid[rows], row_factors[rows],
                                                 need_grad, fold_scales)
        loss_sum += chunk_losses.sum()
        if row_losses is not None:
            row_losses[rows] = chunk_losses.squeeze(1)
        if not need_grad:
            continue
        g = logits.to(compute_dtype)  # (rows, V), in the buffer's layout
        if grad_hidden is not None:
            torch.mul(g @ w, row_scales, out=grad_hidden[rows])  # scaled in fp32, not in the product's dtype
        if grad_weight is not None:
            # ignored rows (scale 0) add nothing to the weight gradient
            h_scaled = _scaled(h, row_scales if fold_scales else valid[rows], compute_dtype)
            if g.dtype == grad_weight.dtype:
                grad_weight.addmm_(g.t(), h_scaled)  # accumulates in place: no (V, d) temporary
            else:  # low-precision matmuls, fp32 accumulation, in vocabulary blocks: a whole (V, d) product would be
                for block in range(0, vocab_size, VOCAB_BLOCK):  # another copy of the weight's size
                    vocab = slice(block, block + VOCAB_BLOCK)
                    grad_weight[vocab].add_(g[:, vocab].t() @ h_scaled)
        del g
    if grad_weight is not None and not fold_scales:
        grad_weight.mul_(inv_count)
    loss = row_losses.mul_(LN2) if per_row else loss_sum * (inv_count * LN2)
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
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused):
        loss, grad_hidden, grad_weight = _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size,
                                                                 compute_dtype, *ctx.needs_input_grad[:2], fused=fused)
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
        return grad_hidden, grad_weight, None, None, None, None, None


def _row_losses(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused):
    """The (N,) losses, 0 on ignored rows: only the other rows are projected onto the vocabulary."""
    keep = targets != ignore_index
    kept = _chunked_loss_and_grads(hidden[keep], weight, targets[keep], ignore_index, chunk_size, compute_dtype,
                                   False, False, per_row=True, fused=fused)[0]
    losses = kept.new_zeros(targets.shape)
    losses[keep] = kept
    return losses


def chunked_cross_entropy(hidden, weight, targets, *, ignore_index=-1, chunk_size=None, reduction='mean'):
    """Mean cross-entropy of the logits `hidden @ weight.T` against `targets`, ignoring `ignore_index`,
    without ever holding more than about chunk_size x V logits.

    hidden (N, d), weight (V, d), targets (N,) -> scalar. chunk_size=None uses default_chunk_size(V).
    With gradients enabled the forward pass also computes both gradients (weight gradient accumulated in fp32);
    under no_grad it computes the loss only. If every target is ignored the loss is 0 (not NaN).
    reduction='none' returns the (N,) loss of each row instead, 0 on ignored rows, as F.cross_entropy does; it is
    for evaluation: ignored rows skip the vocabulary projection, and it has no gradients (an error if asked for).
    Called from code that torch.compile compiles (a compiled GPT), each chunk's softmax runs as compiled kernels
    (the chunk loop and its matmuls stay eager); called eagerly, all of it is eager."""
    return _chunked_cross_entropy(hidden, weight, targets, ignore_index, chunk_size, reduction,
                                  fused=torch.compiler.is_compiling())


@torch.compiler.disable  # a graph break here is cheap; the chunk loop stays eager under torch.compile
def _chunked_cross_entropy(hidden, weight, targets, ignore_index, chunk_size, reduction, fused):
    """chunked_cross_entropy, run outside torch.compile's graphs; fused: each chunk's softmax compiled."""
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0])
    compute_dtype = _compute_dtype(hidden, weight)
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if reduction == 'none':
        if wants_grad:
            raise RuntimeError("chunked_cross_entropy(reduction='none') has no gradients: call it under "
                               "torch.no_grad()")
        with torch.no_grad():
            return _row_losses(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused)
    if reduction != 'mean':
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if not wants_grad:
        with torch.no_grad():
            return _chunked_loss_and_grads(hidden, weight, targets, ignore_index, chunk_size, compute_dtype,
                                           False, False, fused=fused)[0]
    return _LinearCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk_size, compute_dtype, fused)
