"""modded-nanogpt's record of 4 Jan 2025 (SoftCap: 1,390 steps, val loss 3.2791 on average over 80 runs), written
from its description in docs/record.md, as a small functional reference: the forward, the loss and one optimizer step,
for any sizes, in one dtype (float32 or float64 on a CPU), imports torch only. What it shares with the record of
24 Nov 2024 (RMSNorm, ReLU², rotation of pairs, Newton-Schulz, Adam, the momentum warmup) is
tests/record_reference.py's.

Weights are a mapping name -> tensor with the record's own parameter names (record_shapes lists them):
  embed.weight (V, d)                       token embedding, RMS-normed after the lookup
  value_embeds.embed.{j}.weight (V, d)      3 value-embedding tables: table j serves blocks j and n_layer - 3 + j
  blocks.{i}.lambdas (2,)                   the block's input = lambdas[0] * x + lambdas[1] * x0 (x0: normed embedding)
  blocks.{i}.attn.c_q/c_k/c_v/c_proj.weight (d, d)   (none in block no_attn_layer)
  blocks.{i}.attn.lambdas (2,)              v = lambdas[0] * v + lambdas[1] * ve, or lambdas[0] * v without a table
  blocks.{i}.mlp.c_fc.weight (4d, d), blocks.{i}.mlp.c_proj.weight (d, 4d)
  lm_head.weight (V, d)                     untied
  skip_weights (n_layer / 2,)               decoder block n_layer / 2 + j adds skip_weights[j] times the output of
                                            encoder block n_layer / 2 - 1 - j
The record ran its embeddings in bf16 and activations in bf16; here everything runs in the weights' dtype, except
Newton-Schulz (ns_dtype)."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import record_reference as R


@dataclass
class RecordConfig(R.RecordConfig):
    logit_softcap: float = 15.0
    num_iterations: int = 1390
    cooldown_frac: float = 0.4
    # the window: a number of blocks of window_block positions, int(((1 - x) * window_block + x * window_aim)
    # // window_block) at progress x = step / num_iterations: 1 block at first, 14 (1,792) from step 1,339
    window_block: int = 128
    window_aim: int = 1856
    value_tables: int = 3
    no_attn_layer: int = 7


def record_shapes(cfg):
    """{name: shape} of every parameter, in the record's order of model.parameters()."""
    d, v = cfg.n_embd, cfg.vocab_size
    shapes = {'embed.weight': (v, d)}
    for i in range(cfg.n_layer):
        p = f'blocks.{i}.'
        if i != cfg.no_attn_layer:
            shapes.update({p + f'attn.c_{n}.weight': (d, d) for n in ('q', 'k', 'v')})
            shapes.update({p + 'attn.lambdas': (2,), p + 'attn.c_proj.weight': (d, d)})
        shapes.update({p + 'mlp.c_fc.weight': (4 * d, d), p + 'mlp.c_proj.weight': (d, 4 * d), p + 'lambdas': (2,)})
    shapes.update({f'value_embeds.embed.{j}.weight': (v, d) for j in range(cfg.value_tables)})
    shapes.update({'lm_head.weight': (v, d), 'skip_weights': (cfg.n_layer - cfg.n_layer // 2,)})
    return shapes


def init_weights(cfg, generator=None, dtype=torch.float32):
    """The record's initialization: PyTorch's defaults (embeddings N(0, 1), Linear U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
    output projections and the head at zero, block lambdas (1, 0), attention lambdas (0.5, 0.5), skip weights 1."""
    weights = {}
    for name, shape in record_shapes(cfg).items():
        if name.endswith(('c_proj.weight', 'lm_head.weight')):
            w = torch.zeros(shape, dtype=dtype)
        elif name.startswith(('embed.', 'value_embeds.')):
            w = torch.randn(shape, generator=generator, dtype=dtype)
        elif name.endswith('.weight'):
            bound = 1 / math.sqrt(shape[1])
            w = torch.empty(shape, dtype=dtype).uniform_(-bound, bound, generator=generator)
        elif name.endswith('attn.lambdas'):
            w = torch.tensor([0.5, 0.5], dtype=dtype)
        elif name.endswith('lambdas'):
            w = torch.tensor([1.0, 0.0], dtype=dtype)
        else:
            w = torch.ones(shape, dtype=dtype)
        weights[name] = w
    return weights


# schedules

def window_blocks_at(step, cfg):
    """The number of window_block-position blocks a query's keys may lie in at optimizer step `step`."""
    x = step / cfg.num_iterations
    return int(((1 - x) * cfg.window_block + x * cfg.window_aim) // cfg.window_block)


def lr_factor(step, cfg):
    """Every group's lr multiplier: 1 while the time left, 1 - step / num_iterations, is at least cooldown_frac, then
    that time left / cooldown_frac."""
    left = 1 - step / cfg.num_iterations
    return 1.0 if left >= cfg.cooldown_frac else left / cfg.cooldown_frac


# forward and loss

def attention_mask(idx, n_blocks, cfg):
    """(B, 1, T, T) bool, FlexAttention's block mask as the record builds it: query q sees key k if k <= q, both are
    in the same document (a document begins at each doc_token), and k's block of window_block positions is one of
    the n_blocks up to q's (q // block - k // block < n_blocks)."""
    pos = torch.arange(idx.size(-1))
    block = pos // cfg.window_block
    docs = (idx == cfg.doc_token).cumsum(-1)
    causal = pos[:, None] >= pos[None, :]
    near = block[:, None] - block[None, :] < n_blocks
    same_doc = docs[:, :, None] == docs[:, None, :]
    return (causal & near & same_doc)[:, None]


def rotary(t, head_dim, dtype):
    """(cos, sin) of shape (1, t, 1, head_dim / 2), in fp32 as the record: the first head_dim / 4 pairs turn at
    (1/1024)**linspace(0, 1, head_dim / 4) radians a position, the other head_dim / 4 not at all."""
    turning = (1 / 1024) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32)
    freqs = torch.outer(torch.arange(t).float(), torch.cat([turning, turning.new_zeros(head_dim // 4)]))
    return freqs.cos().to(dtype)[None, :, None], freqs.sin().to(dtype)[None, :, None]


def attention(w, p, x, ve, mask, cos, sin, n_head):
    """Block prefix p's attention of normed x (B, T, d); ve: the block's value-embedding rows, or None."""
    B, T, d = x.shape
    q, k, v = (F.linear(x, w[p + f'attn.c_{n}.weight']).view(B, T, n_head, d // n_head) for n in ('q', 'k', 'v'))
    lambdas = w[p + 'attn.lambdas']
    v = lambdas[0] * v + lambdas[1] * ve.view_as(v) if ve is not None else lambdas[0] * v
    q, k = R.apply_rotary(R.rms_norm(q), cos, sin), R.apply_rotary(R.rms_norm(k), cos, sin)
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask)
    return F.linear(y.transpose(1, 2).reshape(B, T, d), w[p + 'attn.c_proj.weight'])


def forward(w, idx, n_blocks, cfg):
    """Soft-capped logits (B, T, V) for token rows idx (B, T); each row is one of the record's per-GPU sequences."""
    dtype = w['lm_head.weight'].dtype
    mask = attention_mask(idx, n_blocks, cfg)
    cos, sin = rotary(idx.size(1), cfg.n_embd // cfg.n_head, dtype)
    x = x0 = R.rms_norm(w['embed.weight'][idx])
    tables = [w[f'value_embeds.embed.{j}.weight'][idx] for j in range(cfg.value_tables)]
    ve = tables + [None] * (cfg.n_layer - 2 * cfg.value_tables) + tables  # 012 ... 012
    skips, n_enc = [], cfg.n_layer // 2
    for i in range(cfg.n_layer):
        p = f'blocks.{i}.'
        if i >= n_enc:
            x = x + w['skip_weights'][i - n_enc] * skips.pop()
        x = w[p + 'lambdas'][0] * x + w[p + 'lambdas'][1] * x0
        if i != cfg.no_attn_layer:
            x = x + attention(w, p, R.rms_norm(x), ve[i], mask, cos, sin, cfg.n_head)
        x = x + R.mlp(w, p, R.rms_norm(x))
        if i < n_enc:
            skips.append(x)
    logits = F.linear(R.rms_norm(x), w['lm_head.weight'])
    return cfg.logit_softcap * torch.tanh(logits / cfg.logit_softcap)


def loss_and_grads(w, idx, targets, n_blocks, cfg):
    """(mean cross-entropy over all B * T positions, {name: gradient})."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in w.items()}
    logits = forward(leaves, idx, n_blocks, cfg)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return loss.detach(), dict(zip(leaves, grads))


# optimizer

def param_groups(w):
    """{group: [names]}: Adam's 'embed' (the embedding and the value-embedding tables), 'head' and 'scalar' (every
    tensor of fewer than 2 dimensions), and Muon's 'muon' (the blocks' matrices)."""
    return {'embed': [n for n in w if n.startswith(('embed.', 'value_embeds.'))], 'head': ['lm_head.weight'],
            'muon': [n for n in w if n.startswith('blocks.') and w[n].dim() == 2],
            'scalar': [n for n in w if w[n].dim() < 2]}


def optimizer_step(w, grads, state, step, cfg):
    """The record's update at 0-based optimizer step `step`: (new weights, new state), inputs left unchanged.
    Muon's momentum is an average: buf = lerp(buf, g, 1 - mu), Nesterov lerp(g, buf, mu), then Newton-Schulz."""
    factor, groups = lr_factor(step, cfg), param_groups(w)
    new_w, new_state = dict(w), {}
    momentum = R.muon_momentum_at(step, cfg)
    for name in groups['muon']:
        g = grads[name]
        buf = torch.lerp(state.get(name, {}).get('momentum_buffer', torch.zeros_like(g)), g, 1 - momentum)
        update = R.newton_schulz(torch.lerp(g, buf, momentum), cfg) * max(1, g.size(0) / g.size(1)) ** 0.5
        new_w[name] = w[name] - cfg.muon_lr * factor * update.to(w[name].dtype)
        new_state[name] = {'momentum_buffer': buf}
    for group, lr in (('embed', cfg.embed_lr), ('head', cfg.head_lr), ('scalar', cfg.scalar_lr)):
        for name in groups[group]:
            new_w[name], new_state[name] = R.adam(w[name], grads[name], state.get(name, {}), lr * factor, cfg)
    return new_w, new_state


def train_step(w, state, idx, targets, step, cfg):
    """One training step at optimizer step `step` with its window: (loss, grads, new weights, new state)."""
    loss, grads = loss_and_grads(w, idx, targets, window_blocks_at(step, cfg), cfg)
    return (loss, grads, *optimizer_step(w, grads, state, step, cfg))
