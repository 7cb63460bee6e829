"""modded-nanogpt's record of 24 Nov 2024 (WindowWarmup: 1,750 steps, val loss 3.2733-3.2833 over seven runs), written
from its description in docs/record.md, as a small functional reference: the forward, the loss and one optimizer step,
for any sizes, in one dtype (float32 or float64 on a CPU), imports torch only.

Weights are a mapping name -> tensor with the record's own parameter names (record_shapes lists them):
  transformer.wte.weight (V, d)             token embedding, RMS-normed after the lookup
  transformer.h.{i}.lambdas (2,)            the block's input = lambdas[0] * x + lambdas[1] * x0 (x0: normed embedding)
  transformer.h.{i}.attn.c_q/c_k/c_v/c_proj.weight (d, d)
  transformer.h.{i}.attn.lamb ()            value residual: v = (1 - lamb) * v + lamb * v1 (v1: block 0's values)
  transformer.h.{i}.mlp.c_fc.weight (4d, d), transformer.h.{i}.mlp.c_proj.weight (d, 4d)
  skip_weights (n_layer / 2,)               n_layer even: decoder block n_layer / 2 + j adds skip_weights[j] times
                                            the output of encoder block n_layer / 2 - 1 - j (the last kept, first)
  lm_head.weight (V, d)                     untied
The record ran activations in bf16; here everything runs in the weights' dtype, except Newton-Schulz (ns_dtype)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RecordConfig:
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 6
    n_embd: int = 768
    doc_token: int = 50256  # <|endoftext|>: each one starts a document
    logit_softcap: float = 30.0
    rotary_base: float = 10000.0
    # schedules, by the 0-based index of the optimizer step
    num_iterations: int = 1750
    cooldown_iters: int = 640
    window_block: int = 64  # the window's first size and its granularity
    window_final: int = 1792
    muon_momentum_warmup: int = 300
    # optimizer: Adam (torch.optim.Adam, no weight decay) for the embedding, the head and the scalars; Muon for the
    # blocks' matrices
    embed_lr: float = 0.6
    head_lr: float = 0.008
    scalar_lr: float = 0.04
    betas: tuple = (0.8, 0.95)
    adam_eps: float = 1e-8
    muon_lr: float = 0.05
    muon_momentum_start: float = 0.85
    muon_momentum: float = 0.95
    ns_steps: int = 5
    ns_coefficients: tuple = (3.4445, -4.7750, 2.0315)
    ns_eps: float = 1e-7
    ns_dtype: torch.dtype = torch.bfloat16  # the record's; None: the gradient's own dtype (float64 in a test)


def record_shapes(cfg):
    """{name: shape} of every parameter, in the record's order of model.parameters()."""
    d, v = cfg.n_embd, cfg.vocab_size
    shapes = {'skip_weights': (cfg.n_layer - cfg.n_layer // 2,), 'transformer.wte.weight': (v, d)}
    for i in range(cfg.n_layer):
        p = f'transformer.h.{i}.'
        shapes.update({p + 'lambdas': (2,), **{p + f'attn.c_{n}.weight': (d, d) for n in ('q', 'k', 'v', 'proj')},
                       p + 'attn.lamb': (), p + 'mlp.c_fc.weight': (4 * d, d), p + 'mlp.c_proj.weight': (d, 4 * d)})
    shapes['lm_head.weight'] = (v, d)
    return shapes


def init_weights(cfg, generator=None, dtype=torch.float32):
    """The record's initialization: PyTorch's defaults (embedding N(0, 1), Linear U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
    output projections and the head at zero, lambdas (1, 0), lamb 0.5, skip weights 1."""
    weights = {}
    for name, shape in record_shapes(cfg).items():
        if name.endswith(('c_proj.weight', 'lm_head.weight')):
            w = torch.zeros(shape, dtype=dtype)
        elif name.endswith('wte.weight'):
            w = torch.randn(shape, generator=generator, dtype=dtype)
        elif name.endswith('.weight'):
            bound = 1 / math.sqrt(shape[1])
            w = torch.empty(shape, dtype=dtype).uniform_(-bound, bound, generator=generator)
        elif name.endswith('lambdas'):
            w = torch.tensor([1.0, 0.0], dtype=dtype)
        elif name.endswith('lamb'):
            w = torch.tensor(0.5, dtype=dtype)
        else:
            w = torch.ones(shape, dtype=dtype)
        weights[name] = w
    return weights


# schedules

def window_at(step, cfg):
    """Attention window (keys a query sees, itself included) at optimizer step `step`: grows linearly from
    window_block to window_final over the run, rounded down to a multiple of window_block."""
    b = cfg.window_block
    return int(b * ((step / cfg.num_iterations * (cfg.window_final - b) + b) // b))


def lr_factor(step, cfg):
    """Every group's lr multiplier: 1, then linear to 0 at num_iterations over the last cooldown_iters steps."""
    if step < cfg.num_iterations - cfg.cooldown_iters:
        return 1.0
    return (cfg.num_iterations - step) / cfg.cooldown_iters


def muon_momentum_at(step, cfg):
    """Muon's momentum: linear from muon_momentum_start to muon_momentum over the first muon_momentum_warmup steps."""
    frac = min(step / cfg.muon_momentum_warmup, 1)
    return (1 - frac) * cfg.muon_momentum_start + frac * cfg.muon_momentum


# forward and loss

def rms_norm(x):
    """Without a gain; eps: F.rms_norm's default for x's dtype, as the record calls it."""
    return F.rms_norm(x, (x.size(-1),))


def attention_mask(idx, window, doc_token):
    """(B, 1, T, T) bool: query q sees key k if k <= q, q - k < window, and both are in the same document (a document
    begins at each doc_token, which is its first token)."""
    pos = torch.arange(idx.size(-1))
    docs = (idx == doc_token).cumsum(-1)
    causal = pos[:, None] >= pos[None, :]
    near = pos[:, None] - pos[None, :] < window
    same_doc = docs[:, :, None] == docs[:, None, :]
    return (causal & near & same_doc)[:, None]


def rotary(t, head_dim, base, dtype):
    """(cos, sin) of shape (1, t, 1, head_dim / 2): computed in fp32 as the record (which then stored them in bf16)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(t).float(), inv_freq)
    return freqs.cos().to(dtype)[None, :, None], freqs.sin().to(dtype)[None, :, None]


def apply_rotary(x, cos, sin):
    """Pairs (x[i], x[i + hd/2]) turned: (x1 cos + x2 sin, -x1 sin + x2 cos)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)


def attention(w, p, x, v1, mask, cos, sin, n_head):
    """Block prefix p's attention of normed x (B, T, d); v1: block 0's values (None in block 0). Returns (y, v1)."""
    B, T, d = x.shape
    q, k, v = (F.linear(x, w[p + f'attn.c_{n}.weight']).view(B, T, n_head, d // n_head) for n in ('q', 'k', 'v'))
    if v1 is None:
        v1 = v
    v = (1 - w[p + 'attn.lamb']) * v + w[p + 'attn.lamb'] * v1
    q, k = apply_rotary(rms_norm(q), cos, sin), apply_rotary(rms_norm(k), cos, sin)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return F.linear(y.transpose(1, 2).reshape(B, T, d), w[p + 'attn.c_proj.weight']), v1


def mlp(w, p, x):
    """Block prefix p's MLP of normed x: ReLU squared between its two matrices."""
    return F.linear(F.relu(F.linear(x, w[p + 'mlp.c_fc.weight'])).square(), w[p + 'mlp.c_proj.weight'])


def block(w, p, x, x0, v1, mask, cos, sin, cfg):
    """Block prefix p on the stream x (B, T, d): its input a mix of x and the normed embedding x0, then attention and
    MLP on normed inputs, each added to the stream. Returns (x, v1)."""
    x = w[p + 'lambdas'][0] * x + w[p + 'lambdas'][1] * x0
    y, v1 = attention(w, p, rms_norm(x), v1, mask, cos, sin, cfg.n_head)
    x = x + y
    return x + mlp(w, p, rms_norm(x)), v1


def forward(w, idx, window, cfg):
    """Soft-capped logits (B, T, V) for token rows idx (B, T); each row is one of the record's per-GPU sequences."""
    dtype = w['lm_head.weight'].dtype
    mask = attention_mask(idx, window, cfg.doc_token)
    cos, sin = rotary(idx.size(1), cfg.n_embd // cfg.n_head, cfg.rotary_base, dtype)
    x = x0 = rms_norm(w['transformer.wte.weight'][idx])
    v1, skips, n_enc = None, [], cfg.n_layer // 2
    for i in range(cfg.n_layer):
        p = f'transformer.h.{i}.'
        if i >= n_enc:
            x = x + w['skip_weights'][i - n_enc] * skips.pop()
        x, v1 = block(w, p, x, x0, v1, mask, cos, sin, cfg)
        if i < n_enc:
            skips.append(x)
    logits = F.linear(rms_norm(x), w['lm_head.weight'])
    return cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)


def loss_fn(w, idx, targets, window, cfg):
    """Mean cross-entropy over all B * T positions: the record's gradient, averaged over its 8 GPUs' sequences."""
    logits = forward(w, idx, window, cfg)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def loss_and_grads(w, idx, targets, window, cfg):
    """(loss, {name: gradient})."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in w.items()}
    loss = loss_fn(leaves, idx, targets, window, cfg)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return loss.detach(), dict(zip(leaves, grads))


# optimizer

def param_groups(w):
    """{group: [names]}: 'embed' and 'head' (Adam), 'muon' (the blocks' matrices), 'scalar' (Adam: lambdas, lamb,
    skip_weights)."""
    blocks = [n for n in w if n.startswith('transformer.h.')]
    return {'embed': ['transformer.wte.weight'], 'head': ['lm_head.weight'],
            'muon': [n for n in blocks if w[n].dim() == 2],
            'scalar': [n for n in blocks if w[n].dim() < 2] + ['skip_weights']}


def newton_schulz(g, cfg):
    """Muon's quintic Newton-Schulz orthogonalization of g = U S V^T in cfg.ns_dtype (None: g's), returned in that
    dtype: U S' V^T, where S' is from about 0.7 to 1.2 for the singular values not far below the largest (the
    coefficients trade convergence to 1 for speed)."""
    a, b, c = cfg.ns_coefficients
    x = g.to(cfg.ns_dtype or g.dtype)
    x = x / (x.norm() + cfg.ns_eps)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    for _ in range(cfg.ns_steps):
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x.T if tall else x


def optimizer_step(w, grads, state, step, cfg):
    """The record's update at 0-based optimizer step `step`: (new weights, new state), inputs left unchanged.
    state: {name: {'momentum_buffer'}} for Muon, {name: {'step', 'exp_avg', 'exp_avg_sq'}} for Adam; {} at first."""
    factor, groups = lr_factor(step, cfg), param_groups(w)
    new_w, new_state = dict(w), {}
    momentum = muon_momentum_at(step, cfg)
    for name in groups['muon']:
        g = grads[name]
        buf = momentum * state.get(name, {}).get('momentum_buffer', torch.zeros_like(g)) + g
        update = newton_schulz(g + momentum * buf, cfg) * max(1, g.size(0) / g.size(1)) ** 0.5
        new_w[name] = w[name] - cfg.muon_lr * factor * update.to(w[name].dtype)
        new_state[name] = {'momentum_buffer': buf}
    for group, lr in (('embed', cfg.embed_lr), ('head', cfg.head_lr), ('scalar', cfg.scalar_lr)):
        for name in groups[group]:
            new_w[name], new_state[name] = adam(w[name], grads[name], state.get(name, {}), lr * factor, cfg)
    return new_w, new_state


def adam(weight, g, s, lr, cfg):
    """torch.optim.Adam's step (no weight decay) on `weight` with gradient g and state s ({} at first): (new weight,
    new state)."""
    beta1, beta2 = cfg.betas
    t = s.get('step', 0) + 1
    m = beta1 * s.get('exp_avg', torch.zeros_like(g)) + (1 - beta1) * g
    v = beta2 * s.get('exp_avg_sq', torch.zeros_like(g)) + (1 - beta2) * g * g
    denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)) + cfg.adam_eps
    return weight - lr / (1 - beta1 ** t) * m / denom, {'step': t, 'exp_avg': m, 'exp_avg_sq': v}


def train_step(w, state, idx, targets, step, cfg):
    """One training step at optimizer step `step` with its window: (loss, grads, new weights, new state)."""
    loss, grads = loss_and_grads(w, idx, targets, window_at(step, cfg), cfg)
    return (loss, grads, *optimizer_step(w, grads, state, step, cfg))
