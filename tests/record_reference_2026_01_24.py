"""modded-nanogpt's single-GPU record of 24 Jan 2026 (records/track_1_short/2026-01-24_ImprovedLMHead/
single_gpu_improved_with_softcapping.txt, the code before the log's first line of '='), read again from that code as a
small functional reference: its GPT's forward and loss, its schedules and its optimizer (NorMuonAndAdam as its
TrainingManager steps it), for any sizes, in one dtype (float64 on a CPU), importing torch only. None of the project's
code: gpt2026.py and training/record2026.py are proven against this.

What the record runs as kernels is written here as the plain maths they compute: FP8 and bf16 matmuls as matmuls in
the weights' dtype, FlashAttention 3's varlen kernel as a loop over documents, the Triton MLP and softcapped loss as
their formulas (the loss from the full logits: the reference is small). Rotary tables, which the record keeps in
bf16, are computed in fp32 as the record computes them and kept in the weights' dtype.

Weights are a mapping name -> tensor with the record's own names and shapes (record_shapes):
  embed.weight (V, d)                 the input embedding; the optimizer keeps it lm_head.weight.T until the split
  lm_head.weight (d, V)               stored transposed (CastedLinearT): logits = x @ lm_head.weight
  bigram_embed.weight (BV, d)         rows picked by bigram_hash
  value_embeds.{j}.weight (V, d)      3 tables: layers 0, 1 take tables 1, 2; layers 8, 9, 10 tables 0, 1, 2
  smear_gate.weight, skip_gate.weight (1, 12)
  attn_gate_bank (10, H, 12)          the output gate of attention layers 0-5, 7-10 (none in layer 6)
  ve_gate_bank (5, H, 12)             the value-embedding gate of layers 0, 1, 8, 9, 10
  attn_bank (10, 4d, d)               per attention layer the rows of q, k, v, then o (F.linear's layout)
  mlp_bank (12, 2, 4d, d)             per layer c_fc (F.linear's layout) and c_proj (post @ c_proj); entry 11 pads
  x0_lambdas (L,)
  scalars (4L + 3,)                   resid lambdas (L), sa lambdas (2 per layer), bigram lambdas (L), smear,
                                      backout, skip (world size 1: no padding)"""
import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class RecordConfig:
    vocab_size: int = 50304  # GPT(vocab_size=50257) pads it to a multiple of 128
    bigram_vocab_size: int = 50304 * 5
    num_layers: int = 11
    num_heads: int = 6
    head_dim: int = 128
    model_dim: int = 768
    bos_id: int = 50256
    block_size: int = 128  # args.block_size: windows count blocks of this many positions
    # schedules
    num_scheduled_iterations: int = 1560
    num_extension_iterations: int = 40
    cooldown_frac: float = 0.55
    split_embed_frac: float = 2 / 3
    ws_schedule: tuple = (3, 7, 11)
    ws_final: int = 13
    ws_validate_post_yarn_ext: int = 20
    train_bs_schedule: tuple = (8 * 2048 * 8, 16 * 2048 * 8, 24 * 2048 * 8)
    train_bs_extension: int = 24 * 2048 * 8

    @property
    def num_iterations(self):
        return self.num_scheduled_iterations + self.num_extension_iterations


PAIRED_HEAD_LAYERS = [0, 2, 5, 9]
ATTN_LAYERS = [i for i in range(11) if i != 6]  # layer_to_attn_idx: layer -> its index in attn_bank and attn gates
VE_GATE_LAYERS = [0, 1, 8, 9, 10]  # ve_gates = [veg[0], veg[1]] + [None] * 6 + [veg[2], veg[3], veg[4]]


def record_shapes(cfg):
    """{name: shape} of every parameter of the record's GPT."""
    V, d, L, H = cfg.vocab_size, cfg.model_dim, cfg.num_layers, cfg.num_heads
    shapes = {'smear_gate.weight': (1, 12), 'skip_gate.weight': (1, 12)}
    shapes.update({f'value_embeds.{j}.weight': (V, d) for j in range(3)})
    shapes.update({'attn_gate_bank': (10, H, 12), 've_gate_bank': (5, H, 12), 'attn_bank': (10, 4 * d, d),
                   'mlp_bank': (12, 2, 4 * d, d), 'lm_head.weight': (d, V), 'embed.weight': (V, d),
                   'bigram_embed.weight': (cfg.bigram_vocab_size, d), 'x0_lambdas': (L,), 'scalars': (4 * L + 3,)})
    return shapes


def init_weights(cfg, generator=None, dtype=torch.float64):
    """GPT.__init__'s weights: the gates, the value and bigram tables zero; attn_bank's q, k, v rows uniform of std
    model_dim**-0.5 and its o rows zero; mlp_bank's c_fc uniform of half that std and c_proj zero; lm_head
    N(0, 0.005) and embed its transpose; the scalars their starting values."""
    d, L = cfg.model_dim, cfg.num_layers
    w = {name: torch.zeros(shape, dtype=dtype) for name, shape in record_shapes(cfg).items()}
    attn_bound, mlp_bound = 3 ** 0.5 * d ** -0.5, 3 ** 0.5 * 0.5 * d ** -0.5
    w['attn_bank'][:, :d * 3].uniform_(-attn_bound, attn_bound, generator=generator)
    w['mlp_bank'][:, 0].uniform_(-mlp_bound, mlp_bound, generator=generator)
    w['lm_head.weight'].normal_(0, 0.005, generator=generator)
    w['embed.weight'] = w['lm_head.weight'].T.clone()
    w['scalars'] = torch.cat([1.1 * torch.ones(L), *[torch.tensor([0.5, 1.0]) for _ in range(L)],
                              0.1 * torch.ones(L), torch.zeros(1), 0.5 * torch.ones(1), -1.5 * torch.ones(1)]).to(dtype)
    return w


# schedules: get_bs, get_ws, get_lr, get_muon_momentum, the MTP weights and the split step, as the record's

def get_bs(step, cfg):
    if step >= cfg.num_scheduled_iterations:
        return cfg.train_bs_extension
    x = step / cfg.num_scheduled_iterations
    return cfg.train_bs_schedule[int(len(cfg.train_bs_schedule) * x)]


def get_ws(step, cfg):
    """(short, long) window in blocks at a training step."""
    if step >= cfg.num_scheduled_iterations:
        return cfg.ws_final // 2, cfg.ws_final
    x = step / cfg.num_scheduled_iterations
    ws = cfg.ws_schedule[int(len(cfg.ws_schedule) * x)]
    return ws // 2, ws


def get_lr(step, cfg):
    if step > cfg.num_scheduled_iterations:
        return 0.1
    lr_max = 1.0
    x = step / cfg.num_scheduled_iterations
    if x > 1 / 3:
        lr_max = 1.52
    if x > 2 / 3:
        lr_max = 1.73
    if x >= 1 - cfg.cooldown_frac:
        w = (1 - x) / cfg.cooldown_frac
        return lr_max * w + (1 - w) * 0.1
    return lr_max


def get_muon_momentum(step, cfg, muon_warmup_steps=300, muon_cooldown_steps=50, momentum_min=0.85,
                      momentum_max=0.95):
    momentum_cd_start = cfg.num_iterations - muon_cooldown_steps
    if step < muon_warmup_steps:
        return momentum_min + step / muon_warmup_steps * (momentum_max - momentum_min)
    if step > momentum_cd_start:
        return momentum_max - (step - momentum_cd_start) / muon_cooldown_steps * (momentum_max - momentum_min)
    return momentum_max


def mtp_weights_at(step, cfg):
    """The multi-token prediction weights of a step, an fp32 tensor as the record's schedule holds them."""
    x = step / cfg.num_scheduled_iterations
    if x < 1 / 3:
        w = [1.0, 0.5, 0.25 * (1 - 3 * x)]
    elif x < 2 / 3:
        w = [1.0, 0.5 * (1 - (3 * x - 1))]
    else:
        w = [1.0]
    return torch.tensor(w)


def split_step(cfg):
    """The step after whose optimizer step the embedding is untied from the head (an odd one: Adam steps there)."""
    return math.ceil(cfg.split_embed_frac * cfg.num_scheduled_iterations) | 1


def long_windows_fitted(step, cfg):
    """The long windows (blocks) YaRN went through by `step`: advance_schedule applies YaRN on each change."""
    windows = [get_ws(0, cfg)[1]]
    for s in range(1, step + 1):
        if get_ws(s, cfg)[1] != windows[-1]:
            windows.append(get_ws(s, cfg)[1])
    return windows


# the model

def norm(x):
    return F.rms_norm(x, (x.size(-1),))


def bigram_hash(x, cfg):
    """get_bigram_hash of the record, on one micro-batch's flat inputs (T,)."""
    rand_int_1, rand_int_2 = 36313, 27191
    mod = cfg.bigram_vocab_size - 1
    x = x.to(torch.int32).clone()
    x[0] = mod
    x[1:] = torch.bitwise_xor(rand_int_1 * x[1:], rand_int_2 * x[:-1]) % mod
    return x


def yarn(head_dim, windows, cfg, paired, max_seq_len):
    """(factor1, factor2, attn_scale): Yarn's (or YarnPairedHead's) buffers after reset() and apply(old, new) for
    each change of the long window in `windows` (blocks), tables of 2 * max_seq_len rows."""
    angular_freq = (1 / 1024) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32)
    angular_freq = angular_freq.repeat_interleave(2)
    angular_freq = torch.cat([angular_freq, angular_freq.new_zeros(head_dim // 2)])
    attn_scale = 0.1
    alpha, beta = 1, 32
    for old_window, new_window in zip(windows, windows[1:]):
        rotations = cfg.block_size * old_window * angular_freq / (2 * torch.pi)
        scaling_factor = old_window / new_window
        interpolation_weight = torch.clamp((rotations - alpha) / (beta - alpha), 0, 1)
        angular_freq = angular_freq * (scaling_factor + interpolation_weight * (1 - scaling_factor))
        attn_scale *= 0.2 * math.log(new_window / old_window) + 1
    t = torch.arange(2 * max_seq_len, dtype=torch.float32)
    if paired:
        theta1, theta2 = torch.outer(2 * t, angular_freq), torch.outer(2 * t + 1, angular_freq)
        factor1 = torch.cat((theta1.cos(), theta2.cos()), dim=-1)
        factor2 = torch.cat((theta1.sin(), theta2.sin()), dim=-1)
    else:
        theta = torch.outer(t, angular_freq)
        factor1, factor2 = theta.cos(), theta.sin()
    factor2[..., 1::2] *= -1
    return factor1, factor2, attn_scale


def rotary(x_BTHD, factor1, factor2):
    factor1 = factor1[None, :x_BTHD.size(-3), None, :].to(x_BTHD.dtype)
    factor2 = factor2[None, :x_BTHD.size(-3), None, :].to(x_BTHD.dtype)
    x_flip = x_BTHD.view(*x_BTHD.shape[:-1], x_BTHD.shape[-1] // 2, 2).flip(-1).view(x_BTHD.shape)
    return factor1 * x_BTHD + factor2 * x_flip


def flash_attn_varlen(q, k, v, cu_seqlens, scale, window):
    """flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, causal=True, softmax_scale=scale,
    window_size=(window, 0)) of (T, H, D) inputs: in each sequence, query i attends to its keys i - window .. i."""
    y = torch.zeros_like(q)
    for start, end in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
        if end == start:
            continue
        n = end - start
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        visible = (j <= i) & (j >= i - window)
        scores = torch.einsum('ihd,jhd->hij', q[start:end], k[start:end]) * scale
        probs = scores.masked_fill(~visible, float('-inf')).softmax(dim=-1)
        y[start:end] = torch.einsum('hij,jhd->ihd', probs, v[start:end])
    return y


def attention(x, cfg, qkvo_w, sa_lambdas, ve, ve_gate_w, attn_gate_w, seqlens, bm_size, yarn_tables, key_offset):
    """CausalSelfAttention.forward of the record (B = 1)."""
    B, T = x.size(0), x.size(1)
    H, hd, dim = cfg.num_heads, cfg.head_dim, cfg.model_dim
    factor1, factor2, attn_scale = yarn_tables
    q, k, v = F.linear(x, sa_lambdas[0] * qkvo_w[:dim * 3]).view(B, T, 3 * H, hd).chunk(3, dim=-2)
    q, k = norm(q), norm(k)
    q, k = rotary(q, factor1, factor2), rotary(k, factor1, factor2)
    if key_offset:  # k[:, 1:, :, hd // 2:] = k[:, :-1, :, hd // 2:], as torch.compile runs it: the old values move
        k = k.clone()
        k[:, 1:, :, hd // 2:] = k[:, :-1, :, hd // 2:].clone()
    if ve is not None:
        ve_gate_out = 2 * torch.sigmoid(F.linear(x[..., :12], ve_gate_w)).view(B, T, H, 1)
        v = v + ve_gate_out * ve.view_as(v)
    y = flash_attn_varlen(q[0], k[0], v[0], seqlens, attn_scale, bm_size)
    y = y.view(B, T, H, hd)
    y = y * torch.sigmoid(F.linear(x[..., :12], attn_gate_w)).view(B, T, H, 1)
    y = y.contiguous().view(B, T, H * hd)
    return F.linear(y, sa_lambdas[1] * qkvo_w[dim * 3:])


def paired_head_attention(x, cfg, qkvo_w, sa_lambdas, ve, ve_gate_w, attn_gate_w, seqlens, bm_size, yarn_tables):
    """PairedHeadCausalSelfAttention.forward of the record (B = 1)."""
    B, T = x.size(0), x.size(1)
    H, hd, dim = cfg.num_heads, cfg.head_dim, cfg.model_dim
    factor1, factor2, attn_scale = yarn_tables
    q, k, v = F.linear(x, sa_lambdas[0] * qkvo_w[:dim * 3]).view(B, T, 3 * H, hd).chunk(3, dim=-2)
    q, k = norm(q), norm(k)
    q = q.view(B, T, H // 2, hd * 2)
    k = k.view(B, T, H // 2, hd * 2)
    v = v.reshape(B, T * 2, H // 2, hd)
    q, k = rotary(q, factor1, factor2), rotary(k, factor1, factor2)
    q = q.view(B, T * 2, H // 2, hd)
    k = k.view(B, T * 2, H // 2, hd)
    if ve is not None:
        ve_gate_out = 2 * torch.sigmoid(F.linear(x[..., :12], ve_gate_w)).view(B, T * 2, H // 2, 1)
        v = v + ve_gate_out * ve.view_as(v)
    y = flash_attn_varlen(q[0], k[0], v[0], 2 * seqlens, attn_scale, bm_size)
    y = y.view(B, T, H, hd)
    y = y * torch.sigmoid(F.linear(x[..., :12], attn_gate_w)).view(B, T, H, 1)
    y = y.contiguous().view(B, T, H * hd)
    return F.linear(y, sa_lambdas[1] * qkvo_w[dim * 3:])


def cu_seqlens_of(inputs, cfg):
    """The documents' offsets in a micro-batch, as the record's loader gives them: a document starts at position 0
    and at each BOS token (training's batches start each sequence at one; validation's cum_lengths are theirs)."""
    starts = torch.nonzero(inputs == cfg.bos_id)[:, 0]
    return torch.cat([torch.zeros(1, dtype=torch.long), starts, torch.tensor([inputs.numel()])])


def hidden_states(w, input_seq, cfg, ws_short, ws_long, fitted_windows):
    """GPT.forward of the record up to the normed last hidden state (T, d), for one micro-batch input_seq (T,)."""
    L = cfg.num_layers
    seqlens = cu_seqlens_of(input_seq, cfg)
    tables = {paired: yarn(cfg.head_dim, fitted_windows, cfg, paired, input_seq.numel()) for paired in (False, True)}
    skip_connections, skip_in, skip_out, backout_layer = [], [3], [6], 7
    scalars = w['scalars']
    resid_lambdas, x0_lambdas = scalars[:L], w['x0_lambdas']
    sa_lambdas = scalars[L:3 * L].view(-1, 2)
    bigram_lambdas = scalars[3 * L:4 * L]
    smear_lambda, backout_lambda, skip_lambda = scalars[4 * L], scalars[4 * L + 1], scalars[4 * L + 2]
    short_bm, long_bm = ws_short * cfg.block_size, ws_long * cfg.block_size
    bm_sizes = [short_bm, short_bm, short_bm, long_bm, short_bm, short_bm, None, short_bm, short_bm, short_bm, long_bm]
    key_offset = [b == long_bm for b in bm_sizes]

    x = w['embed.weight'][input_seq]
    x0_bigram = w['bigram_embed.weight'][bigram_hash(input_seq, cfg)][None]
    ve = [w[f'value_embeds.{j}.weight'][input_seq] for j in range(3)]
    ve = [ve[1], ve[2]] + [None] * (L - 5) + [ve[0], ve[1], ve[2]]
    smear_gate_out = smear_lambda * torch.sigmoid(F.linear(x[1:, :12], w['smear_gate.weight']))
    x = torch.cat([x[:1], x[1:] + smear_gate_out * x[:-1]])
    x = x0 = norm(x[None])
    ag, veg = w['attn_gate_bank'].unbind(0), w['ve_gate_bank'].unbind(0)
    attn_gates = list(ag[:6]) + [None] + list(ag[6:])
    ve_gates = [veg[0], veg[1]] + [None] * (L - 5) + [veg[2], veg[3], veg[4]]
    for i in range(L):
        if i in skip_out:
            skip_gate = torch.sigmoid(F.linear(x0[..., :12], w['skip_gate.weight']))
            skip_gate_out = torch.sigmoid(skip_lambda) * 2 * skip_gate
            x = x + skip_gate_out * skip_connections.pop()
        if i == 0:
            x = (resid_lambdas[0] + x0_lambdas[0]) * x + bigram_lambdas[0] * x0_bigram
        else:
            x = resid_lambdas[i] * x + x0_lambdas[i] * x0 + bigram_lambdas[i] * x0_bigram
        if i in ATTN_LAYERS:
            qkvo_w = w['attn_bank'][ATTN_LAYERS.index(i)]
            args = (norm(x), cfg, qkvo_w, sa_lambdas[i], ve[i], ve_gates[i], attn_gates[i], seqlens, bm_sizes[i])
            if i in PAIRED_HEAD_LAYERS:
                x = x + paired_head_attention(*args, tables[True])
            else:
                x = x + attention(*args, tables[False], key_offset[i])
        c_fc, c_proj = w['mlp_bank'][i, 0], w['mlp_bank'][i, 1]
        x = x + F.relu(norm(x) @ c_fc.T).square() @ c_proj
        if i in skip_in:
            skip_connections.append(x)
        if i == backout_layer:
            x_backout = x
    x = x - backout_lambda * x_backout
    return norm(x)[0]


def softcap(logits):
    return 23 * torch.sigmoid((logits + 5) / 7.5)


def training_loss(w, input_seq, target_seq, mtp_weights, cfg, ws_short, ws_long, fitted_windows):
    """The record's training loss of one micro-batch: FusedSoftcappedCrossEntropy's losses, summed. Row i's loss is
    sum over k of mtp_weights[k] * (logsumexp(z_i) - z_i[target_seq[i + k]]) for i + k < T and weights > 0."""
    x = hidden_states(w, input_seq, cfg, ws_short, ws_long, fitted_windows)
    z = softcap(x @ w['lm_head.weight'])
    lse = torch.logsumexp(z, dim=-1)
    n_rows = z.size(0)
    losses = torch.zeros(n_rows, dtype=z.dtype)
    for k, weight in enumerate(mtp_weights.tolist()):
        if weight > 0:
            rows = torch.arange(n_rows - k)
            losses[rows] = losses[rows] + weight * (lse[rows] - z[rows, target_seq[rows + k]])
    return losses.sum()


def validation_loss(w, input_seq, target_seq, cfg, ws_short, ws_long, fitted_windows):
    """The record's validation loss of one micro-batch (model.eval()): the mean cross-entropy of the capped logits."""
    x = hidden_states(w, input_seq, cfg, ws_short, ws_long, fitted_windows)
    return F.cross_entropy(softcap(x @ w['lm_head.weight']), target_seq)


def tie_gradients(grads):
    """The optimizer's use of the gradients while the embedding is tied: lm_head's takes embed's (transposed) in,
    embed's own is not used (its weight is copied from lm_head's after each step)."""
    tied = {n: g for n, g in grads.items() if n != 'embed.weight'}
    tied['lm_head.weight'] = grads['lm_head.weight'] + grads['embed.weight'].T
    return tied


def loss_and_grads(w, inputs, targets, cfg, ws_short, ws_long, fitted_windows, mtp_weights=None):
    """(loss, {name: gradient}) over micro-batches inputs, targets (n, T), one row each: with mtp_weights, the sum of
    their training losses; without, the mean of their validation losses. Gradients as the model's backward gives
    them, before the optimizer ties any."""
    leaves = {n: t.detach().clone().requires_grad_() for n, t in w.items()}
    if mtp_weights is None:
        loss = sum(validation_loss(leaves, x, y, cfg, ws_short, ws_long, fitted_windows)
                   for x, y in zip(inputs, targets)) / len(inputs)
    else:
        loss = sum(training_loss(leaves, x, y, mtp_weights, cfg, ws_short, ws_long, fitted_windows)
                   for x, y in zip(inputs, targets))
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    return loss.detach(), {n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(leaves.items(), grads)}


# the optimizer: NorMuonAndAdam as TrainingManager steps it (world size 1: no communication), its state and moments
# in the weights' dtype (the record's fp32 state for bf16 weights; its mantissa buffer makes NorMuon's weights fp32)

PARAM_TABLE = {  # label: (optim, adam_betas, lr_mul, wd_mul)
    'attn': ('normuon', None, 1.0, 1.0),
    'mlp': ('normuon', None, 1.0, 1.0),
    'scalars': ('adam', (0.9, 0.99), 5.0, 0.0),
    've0': ('adam', (0.75, 0.95), 75., 5.0),
    've1': ('adam', (0.75, 0.95), 75., 5.0),
    've2': ('adam', (0.75, 0.95), 75., 5.0),
    'bigram_embed': ('adam', (0.75, 0.95), 75., 5.0),
    'smear_gate': ('adam', (0.9, 0.99), 0.01, 0.0),
    'skip_gate': ('adam', (0.9, 0.99), 0.05, 0.0),
    'attn_gate_bank': ('adam', (0.9, 0.99), 1.0, 1.0),
    've_gate_bank': ('adam', (0.9, 0.99), 1.0, 1.0),
    'x0_lambdas': ('adam', (0.65, 0.95), 5.0, 0.0),
    'lm_head': ('adam', (0.5, 0.95), 1.0, 150.),
    'embed': ('adam', (0.5, 0.95), 1.0, 150.),
}
LABEL_OF = {'attn_bank': 'attn', 'mlp_bank': 'mlp', 'scalars': 'scalars', 'value_embeds.0.weight': 've0',
            'value_embeds.1.weight': 've1', 'value_embeds.2.weight': 've2', 'bigram_embed.weight': 'bigram_embed',
            'smear_gate.weight': 'smear_gate', 'skip_gate.weight': 'skip_gate', 'attn_gate_bank': 'attn_gate_bank',
            've_gate_bank': 've_gate_bank', 'x0_lambdas': 'x0_lambdas', 'lm_head.weight': 'lm_head',
            'embed.weight': 'embed'}
NAME_OF = {label: name for name, label in LABEL_OF.items()}
WORK_ORDER = ['scalars', 'smear_gate', 'skip_gate', 'attn_gate_bank', 've_gate_bank', 'x0_lambdas', 've0', 've1',
              've2', 'bigram_embed', 'lm_head', 'embed', 'attn', 'mlp']
ADAM_DEFAULTS = dict(lr=0.008, eps=1e-10, weight_decay=0.005)
NORMUON_DEFAULTS = dict(lr=0.023, momentum=0.95, beta2=0.95, weight_decay=1.2)
POLAR_EXPRESS_COEFFS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323)]


def bank_reshape(name, cfg):
    """The .reshape of attn_bank (its q, k, v, o of each layer) and mlp_bank (c_fc, c_proj of each layer, padding
    included) that NorMuon orthogonalizes matrix by matrix."""
    d = cfg.model_dim
    return (10 * 4, d, d) if name == 'attn_bank' else (12 * 2, 4 * d, d)


def init_optimizer_state(w, cfg):
    """_init_state's zero moments, and the training loop's: no gradient left over, the embedding tied."""
    state = {'grads': {}, 'split_embed': False}
    for name, t in w.items():
        if PARAM_TABLE[LABEL_OF[name]][0] == 'adam':
            state[name] = dict(step=0, exp_avg=torch.zeros_like(t), exp_avg_sq=torch.zeros_like(t))
        else:
            shape = bank_reshape(name, cfg)
            second = (*shape[:-1], 1) if shape[-2] >= shape[-1] else (*shape[:-2], 1, shape[-1])
            state[name] = dict(momentum_buffer=torch.zeros(shape, dtype=t.dtype),
                               second_momentum_buffer=torch.zeros(second, dtype=t.dtype))
    return state


def polar_express(G):
    X = G.clone()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) * (1 + 2e-2) + 1e-6)
    for a, b, c in POLAR_EXPRESS_COEFFS:
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


def apply_normuon_variance_reduction(v_chunk, second_momentum_buffer, beta2, red_dim):
    v_mean = v_chunk.square().mean(dim=red_dim, keepdim=True)
    red_dim_size = v_chunk.size(red_dim)
    v_norm_sq = v_mean.sum(dim=(-2, -1), keepdim=True).mul_(red_dim_size)
    v_norm = v_norm_sq.sqrt_()
    second_momentum_buffer.lerp_(v_mean, 1 - beta2)
    step_size = second_momentum_buffer.clamp_min(1e-10).rsqrt_()
    scaled_sq_sum = (v_mean * red_dim_size) * step_size.square()
    v_norm_new = scaled_sq_sum.sum(dim=(-2, -1), keepdim=True).sqrt_()
    final_scale = step_size * (v_norm / v_norm_new.clamp_min_(1e-10))
    return v_chunk.mul_(final_scale)


def normuon_update(param, grad, p_state, label, lr, momentum, cfg):
    """_normuon_update of a bank, in place: param (its bank), grad (its .grad)."""
    reshape = bank_reshape(NAME_OF[label], cfg)
    shape_mult = max(1.0, reshape[-2] / reshape[-1]) ** 0.5
    lr_mul = shape_mult * PARAM_TABLE[label][2]
    per_matrix_lr_mul = [2.0 if i % 2 == 1 else 1.0 for i in range(reshape[0])] if label == 'mlp' else None
    grad_chunk = grad.reshape(reshape).clone()
    momentum_buffer = p_state['momentum_buffer']
    momentum_buffer.lerp_(grad_chunk, 1 - momentum)
    updated_grads = grad_chunk.lerp_(momentum_buffer, momentum)
    v_chunk = polar_express(updated_grads)
    red_dim = -1 if reshape[-2] >= reshape[-1] else -2
    v_chunk = apply_normuon_variance_reduction(v_chunk, p_state['second_momentum_buffer'], NORMUON_DEFAULTS['beta2'],
                                               red_dim)
    p_slice = param.view(reshape)
    eff_wd = PARAM_TABLE[label][3] * NORMUON_DEFAULTS['weight_decay'] * lr
    for mat_idx in range(reshape[0]):
        eff_lr = lr_mul * (per_matrix_lr_mul[mat_idx] if per_matrix_lr_mul else 1.0) * lr
        p_precise, update = p_slice[mat_idx], v_chunk[mat_idx]
        mask = (update * p_precise) >= 0
        p_precise.copy_(p_precise - (p_precise * mask * eff_wd * eff_lr) - (update * eff_lr))


def adam_update(p_slice, g_slice, p_state, label, lr):
    """_adam_update of a parameter, in place; lr: its p_cfg.lr (lr_mul not yet applied)."""
    beta1, beta2 = PARAM_TABLE[label][1]
    lr = lr * PARAM_TABLE[label][2]
    p_state['step'] += 1
    t = p_state['step']
    bias1, bias2 = 1 - beta1 ** t, 1 - beta2 ** t
    step_size = lr * (bias2 ** 0.5 / bias1)
    eff_wd = lr * lr * ADAM_DEFAULTS['weight_decay'] * PARAM_TABLE[label][3]
    exp_avg, exp_avg_sq = p_state['exp_avg'], p_state['exp_avg_sq']
    exp_avg.mul_(beta1).add_(g_slice, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g_slice, g_slice, value=1 - beta2)
    update = exp_avg.div(exp_avg_sq.sqrt().add_(ADAM_DEFAULTS['eps'])).mul_(step_size)
    mask = (update * p_slice) > 0
    update.addcmul_(p_slice, mask, value=eff_wd)
    p_slice.add_(other=update, alpha=-1.0)


def optimizer_step(w, grads, state, step, cfg):
    """TrainingManager.step_optimizers(step) after a backward that added `grads` to the .grad the last step left
    (Adam's after a step without Adam): (new weights, new state), inputs left unchanged."""
    w = {n: t.clone() for n, t in w.items()}
    state = copy.deepcopy(state)
    grads = {n: state['grads'][n] + g if n in state['grads'] else g.clone() for n, g in grads.items()}
    step_lr, muon_momentum, do_adam = get_lr(step, cfg), get_muon_momentum(step, cfg), step % 2 == 1
    split = state['split_embed']
    if do_adam and not split:
        grads['lm_head.weight'] = grads['lm_head.weight'] + grads['embed.weight'].T
    for label in WORK_ORDER:
        name, (optim, *_) = NAME_OF[label], PARAM_TABLE[label]
        if (optim == 'adam' and not do_adam) or (label == 'embed' and not split):
            continue
        if optim == 'adam':
            adam_update(w[name], grads[name], state[name], label, ADAM_DEFAULTS['lr'] * step_lr)
        else:
            normuon_update(w[name], grads[name], state[name], label, NORMUON_DEFAULTS['lr'] * step_lr,
                           muon_momentum, cfg)
    if do_adam and not split:
        w['embed.weight'] = w['lm_head.weight'].T.clone()
    state['grads'] = {} if do_adam else {n: g for n, g in grads.items() if PARAM_TABLE[LABEL_OF[n]][0] == 'adam'}
    if step == split_step(cfg):  # copy_lm_state_to_embed
        state['embed.weight']['step'] = state['lm_head.weight']['step']
        for key in ('exp_avg', 'exp_avg_sq'):
            state['embed.weight'][key] = state['lm_head.weight'][key].T.clone()
        state['split_embed'] = True
    return w, state
