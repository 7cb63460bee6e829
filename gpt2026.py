"""
The GPT of modded-nanogpt's single-GPU run of 24 Jan 2026 (records/track_1_short/2026-01-24_ImprovedLMHead/
single_gpu_improved_with_softcapping.txt: validation loss 3.2787 after 1,600 steps, about 0.42B tokens, on one
H100), in plain torch: a file of its own beside model.py, which it does not import. It needs only torch: copy it
anywhere. docs/record_2026.md says what the model is, what differs from the record and how
tests/unit/test_record_2026_model.py proves it equal to the record in float64.

The record runs FP8 matmuls, FlashAttention 3 and Triton kernels; here they are torch's matmuls in the weights' (or
autocast's) dtype, `attend` (SDPA under a mask, on any device; GPT2026 takes another function of its arguments, such as
training/attention.py's FlashAttention variable-length kernel with a window by position, which a CUDA run passes) and a
loss computed in chunks of rows, so that the (B*T, vocab) logits never exist.

What changes during the record's run is not in the weights; the training loop gives it:
- forward's `windows` (short, long) and `mtp_weights`, those of the step;
- fit_rotary(long window) at every step: YaRN rescales the rotary when the long window grows;
- untie_embedding() once, at two thirds of the run: the input embedding stops being the head's weight.
The last two are the model's state, kept in its state dict (extra state) so that a checkpoint carries them.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

# The record's 11 layers, one row each: its attention ('short' or 'long' window, 'paired' heads with the short one, or
# None) and the value-embedding table added to its values (or None).
RECORD_LAYERS = (('paired', 1), ('short', 2), ('paired', None), ('long', None), ('short', None), ('paired', None),
                 (None, None), ('short', None), ('short', 0), ('paired', 1), ('long', 2))

# The logit cap, 23 * sigmoid((logits + 5) / 7.5): logits in (0, 23), as the record's loss and sampling see them.
SOFTCAP_SCALE, SOFTCAP_SHIFT, SOFTCAP_WIDTH = 23.0, 5.0, 7.5
BIGRAM_MULTIPLIERS = (36313, 27191)  # the bigram hash's: (this token's, the previous token's)


@dataclass
class GPT2026Config:
    vocab_size: int = 50304  # GPT-2's 50,257 tokens padded to a multiple of 128
    bigram_vocab_size: int = 5 * 50304  # rows of the bigram hash embedding, the last one position 0's
    n_head: int = 6
    n_embd: int = 768  # n_head heads of 128
    doc_token: int = 50256  # <|endoftext|>: each starts a document, which no attention crosses (-1: no documents)
    layers: tuple = RECORD_LAYERS
    skip: tuple = (3, 6)  # layer 3's output joins layer 6's input (gated), past the layers between
    backout_layer: int = 7  # layer 7's output, scaled, is taken back out of the last hidden state
    gate_inputs: int = 12  # every gate reads the first 12 channels of its input
    short_window: int = 768  # forward's windows without `windows`: the record's at its final validation (tokens)
    long_window: int = 2560


def rms_norm(x):
    """RMSNorm without weights, eps the dtype's (the record's F.rms_norm)."""
    return F.rms_norm(x, (x.size(-1),))


def bigram_hash(idx, table_size):
    """The bigram embedding's row for each position of idx (B, T): a hash of the token and the one before it, in
    int32 as the record (its products overflow and wrap); position 0 of a row takes the last row, and position 1 hashes
    with that row's index as the token before it (the record overwrites position 0 before reading it)."""
    reserved = table_size - 1
    x = idx.to(torch.int32)
    before = x[:, :-1].clone()  # the token before each position from 1 on
    before[:, :1] = reserved
    hashed = torch.bitwise_xor(BIGRAM_MULTIPLIERS[0] * x[:, 1:], BIGRAM_MULTIPLIERS[1] * before) % reserved
    return F.pad(hashed, (1, 0), value=reserved)


def yarn(head_dim, windows, device=None):
    """(frequencies (head_dim / 2,) in fp32 on `device`, softmax scale): the rotary of one head after the long window
    grew through `windows` (tokens, the first the run's starting one). Pair i of channels (2i, 2i + 1) turns at
    frequencies[i] radians a position: the first head_dim / 4 pairs at (1/1024)**linspace(0, 1), the others not at
    all. Each growth old -> new slows a pair that turns fewer than 32 times over the old window, by old / new at most
    (YaRN: positions past the old window turn no further than the model has seen) and scales the softmax, 0.1 at
    first, by 0.2 ln(new / old) + 1. In fp32 as the record, in the same order of operations."""
    turning = (1 / 1024) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32, device=device)
    frequencies = torch.cat((turning, turning.new_zeros(head_dim // 4)))
    scale = 0.1
    for old, new in zip(windows, windows[1:]):
        turns = old * frequencies / (2 * torch.pi)
        kept = torch.clamp((turns - 1) / (32 - 1), 0, 1)  # 1: the pair keeps its frequency
        frequencies = frequencies * (old / new + kept * (1 - old / new))
        scale *= 0.2 * math.log(new / old) + 1
    return frequencies, scale


def rotary_cos_sin(frequencies, positions, dtype):
    """(cos, sin) of the angles positions * frequencies (on one device: no copy from the CPU, which a GPU would wait
    for), computed in fp32 and given in `dtype`."""
    angles = positions.to(torch.float32)[..., None] * frequencies
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin):
    """x (B, T, H, D) with each pair of neighbouring channels (x[2i], x[2i + 1]) turned by its angle."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos + odd * sin, odd * cos - even * sin), dim=-1).flatten(-2)


def shift_stationary_keys(k):
    """Keys (B, T, H, D) whose second half, the channels the rotary leaves still, comes from the position before (the
    first position keeps its own): a query can match a token by the one before it, induction in one layer."""
    half = k.size(-1) // 2
    shifted = torch.cat((k[:, :1, :, half:], k[:, :-1, :, half:]), dim=1)
    return torch.cat((k[..., :half], shifted), dim=-1)


def attend(q, k, v, docs, window, scale):
    """Causal attention of q, k, v (B, T, H, D) within documents (docs (B, T): each position's) over a window by
    position: query t sees the keys from t - window to t of its document, as FlashAttention's variable-length kernel
    with window_size=(window, 0) and the documents as cu_seqlens. Here SDPA under a (B, 1, T, T) mask, on any device.
    The queries may be the last positions of the keys' (generation's KVCache): k, v and docs then cover them all."""
    pos = torch.arange(k.size(1), device=q.device)
    back = pos[-q.size(1):, None] - pos[None, :]
    mask = (back >= 0) & (back <= window) & (docs[:, -q.size(1):, None] == docs[:, None, :])
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=mask[:, None], scale=scale)
    return y.transpose(1, 2)


class CausalSelfAttention(nn.Module):

    def __init__(self, config, kind, value_embed, attend):
        super().__init__()
        self.attend = attend
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.lambdas = nn.Parameter(torch.tensor([0.5, 1.0]))  # multiply c_attn's weight and c_proj's
        # per head and token, from the input's first channels: how much of the head's output passes (sigmoid) and
        # how much of the value-embedding row joins its values (2 sigmoid)
        self.gate = nn.Linear(config.gate_inputs, config.n_head, bias=False)
        self.value_gate = nn.Linear(config.gate_inputs, config.n_head, bias=False) if value_embed else None
        self.paired = kind == 'paired'
        self.shift_keys = kind == 'long'

    def forward(self, x, value_rows, rotary, docs, window, scale, cache=None):
        """x: the block's normed input (B, T, C); value_rows: this layer's value-embedding rows or None; rotary and
        docs: those of the layer's layout (GPT2026.rotary, GPT2026.documents); the softmax `scale` and `window`
        (tokens) of this step; cache: this layer's entry in a KVCache, whose positions x follows (docs: of them all)."""
        B, T, C = x.size()
        q, k, v = F.linear(x, self.lambdas[0] * self.c_attn.weight).view(B, T, 3 * self.n_head, -1).chunk(3, dim=2)
        q, k = rotate(rms_norm(q), *rotary), rotate(rms_norm(k), *rotary)
        gate_input = x[..., :self.gate.in_features]
        if value_rows is not None:
            v = v + 2 * torch.sigmoid(self.value_gate(gate_input))[..., None] * value_rows.view_as(v)
        if self.paired:
            # token t's first H/2 heads at position 2t, its last H/2 at 2t + 1 (the record's layout): each query
            # attends to the keys of its head and of its pair, head h +- H/2, over twice the positions (docs: theirs)
            q, k, v = (t.reshape(B, 2 * T, self.n_head // 2, -1) for t in (q, k, v))
        if cache is not None:  # generation: the new positions' keys and values join the earlier positions' kept
            if cache:
                if window > cache['window']:
                    raise ValueError(f"a KVCache kept the keys of a window of {cache['window']} positions, not "
                                     f"{window}: generate with the windows it was filled with, or a new cache")
                k, v = torch.cat((cache['keys'], k), dim=1), torch.cat((cache['values'], v), dim=1)
            # the positions a later query can reach: the last `window`, and the one before for the key shift
            cache.update(keys=k[:, -(window + 1):], values=v[:, -(window + 1):], window=window)
            docs = docs[:, -k.size(1):]  # the documents of the positions kept
        if self.shift_keys:
            k = shift_stationary_keys(k)
        y = (self.attend if cache is None else attend)(q, k, v, docs, window, scale)
        y = y.reshape(B, T, self.n_head, -1) * torch.sigmoid(self.gate(gate_input))[..., None]
        return F.linear(y.reshape(B, T, C), self.lambdas[1] * self.c_proj.weight)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):

    def __init__(self, config, attention, value_table, attend):
        super().__init__()
        self.attn = None if attention is None else CausalSelfAttention(config, attention, value_table is not None,
                                                                         attend)
        self.mlp = MLP(config)
        self.long_window = attention == 'long'

    def forward(self, x, value_rows, rotary, docs, windows, scale, cache=None):
        if self.attn is not None:
            kind = 'paired' if self.attn.paired else 'single'
            window = windows[1] if self.long_window else windows[0]
            x = x + self.attn(rms_norm(x), value_rows, rotary[kind], docs[kind], window, scale, cache)
        return x + self.mlp(rms_norm(x))


class GPT2026(nn.Module):

    def __init__(self, config, *, loss_chunk_rows=1024, attend=attend, segments=None):
        """loss_chunk_rows: the rows of logits the loss holds at once (fp32: 4 * vocab_size bytes each, 3 buffers).
        attend: every attention layer's, a function of attend's arguments computing what it does, its `docs` what
        segments (None: the ids themselves) makes of a layout's document ids (B, T), once a forward: FlashAttention's
        cu_seqlens, say, whose count of documents a GPU must wait for, once and not in every layer."""
        super().__init__()
        self.config = config
        self.loss_chunk_rows = loss_chunk_rows
        self.segments = segments
        d, n_layer = config.n_embd, len(config.layers)
        tables = {table for _, table in config.layers if table is not None}
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, d),  # the input embedding once untied, lm_head's weight before
            bigram_embed=Table(config.bigram_vocab_size, d),
            value_embeds=nn.ModuleList([Table(config.vocab_size, d) for _ in range(len(tables))]),
            h=nn.ModuleList([Block(config, attention, table, attend) for attention, table in config.layers]),
        ))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        # the embedding's previous token added to each position's, gated by the position's own (smear); the skip's
        # gate, read from the embedding
        self.smear_gate = nn.Linear(config.gate_inputs, 1, bias=False)
        self.skip_gate = nn.Linear(config.gate_inputs, 1, bias=False)
        # layer i's input: resid_lambdas[i] * x + x0_lambdas[i] * embedding + bigram_lambdas[i] * bigram rows; at 1.1
        # each layer scales the stream up, so that an early layer's output counts more the more layers follow it
        self.resid_lambdas = nn.Parameter(torch.full((n_layer,), 1.1))
        self.x0_lambdas = nn.Parameter(torch.zeros(n_layer))
        self.bigram_lambdas = nn.Parameter(torch.full((n_layer,), 0.1))
        self.smear_lambda = nn.Parameter(torch.zeros(1))
        self.backout_lambda = nn.Parameter(torch.full((1,), 0.5))
        self.skip_lambda = nn.Parameter(torch.full((1,), -1.5))  # the skip's scale, sigmoid(-1.5) = 0.18 at first
        self.init_weights()
        self.embedding_tied = True  # the input embedding is lm_head's weight until untie_embedding()
        self.rotary_windows = []  # the long windows fit_rotary has seen, one per change: YaRN's history

    @torch.no_grad()
    def init_weights(self):
        """The record's: attention's c_attn uniform of std n_embd**-0.5, MLP's c_fc half that, both c_proj zero; the
        head N(0, 0.005) and the embedding its copy; the bigram and value tables and every gate zero."""
        d = self.config.n_embd
        for block in self.transformer.h:
            if block.attn is not None:
                block.attn.c_attn.weight.uniform_(-math.sqrt(3 / d), math.sqrt(3 / d))
                for weight in (block.attn.c_proj.weight, block.attn.gate.weight):
                    weight.zero_()
                if block.attn.value_gate is not None:
                    block.attn.value_gate.weight.zero_()
            block.mlp.c_fc.weight.uniform_(-0.5 * math.sqrt(3 / d), 0.5 * math.sqrt(3 / d))
            block.mlp.c_proj.weight.zero_()
        self.lm_head.weight.normal_(0, 0.005)
        self.transformer.wte.weight.copy_(self.lm_head.weight)
        for table in (self.transformer.bigram_embed, *self.transformer.value_embeds):
            table.weight.zero_()
        self.smear_gate.weight.zero_()
        self.skip_gate.weight.zero_()

    @torch.no_grad()
    def untie_embedding(self):
        """The split: from here on the input embedding is wte, a copy of lm_head's weight that trains on its own."""
        self.transformer.wte.weight.copy_(self.lm_head.weight)
        self.embedding_tied = False

    def fit_rotary(self, long_window):
        """YaRN: the rotary rescaled if the long window (tokens) is not the last one it was fitted to; the first call
        sets the run's starting window. The record's on every change of the long window in training, not for the
        longer window of its final validation."""
        if not self.rotary_windows or self.rotary_windows[-1] != long_window:
            self.rotary_windows.append(long_window)

    def get_extra_state(self):
        return {'embedding_tied': self.embedding_tied, 'rotary_windows': list(self.rotary_windows)}

    def set_extra_state(self, state):
        self.embedding_tied, self.rotary_windows = state['embedding_tied'], list(state['rotary_windows'])

    @staticmethod
    def documents(docs, segments=None):
        """{'single': docs, 'paired': docs} of docs (B, T), each position's document id (document_ids'), as attend
        takes them: for paired heads at each of positions 2t and 2t + 1 (GPT2026.rotary); what `segments` makes of
        them if it is given."""
        layouts = {'single': docs, 'paired': docs.repeat_interleave(2, dim=1)}
        return layouts if segments is None else {kind: segments(ids) for kind, ids in layouts.items()}

    def rotary(self, T, device, dtype, start=0):
        """({'single': (cos, sin), 'paired': (cos, sin)}, softmax scale) for T tokens at positions start, start + 1,
        ... Paired heads rotate head h of token t at position 2t + h % 2 (the record's: its tables pair heads 2j and
        2j + 1, though its layout makes pairs of h and h + H/2)."""
        head_dim = self.config.n_embd // self.config.n_head
        frequencies, scale = yarn(head_dim, self.rotary_windows, device)
        t = torch.arange(start, start + T, device=device)
        single = rotary_cos_sin(frequencies, t[:, None], dtype)  # (T, 1, D/2): every head alike
        heads = torch.arange(self.config.n_head, device=device)
        paired = rotary_cos_sin(frequencies, 2 * t[:, None] + heads % 2, dtype)  # (T, H, D/2)
        return {'single': single, 'paired': paired}, scale

    def forward(self, idx, targets=None, *, windows=None, mtp_weights=(1.0,), reduction='mean', cache=None):
        """idx (B, T): each row one of the record's micro-batches, documents packed, one starting at each doc_token.
        windows: (short, long) in tokens (None: the config's). With targets: (None, loss), the loss of each position
        t being sum_k mtp_weights[k] * cross-entropy of its prediction of targets[:, t + k] (within the row), summed
        over positions (reduction 'sum', the record's training loss) or divided by B * T ('mean'; the record's
        validation: mtp_weights (1,)); reduction 'none': (B, T), each position's loss of the next token, 0 where the
        target is -1 (HellaSwag's scores), without gradients. Without targets: (capped logits of the last position
        (B, 1, vocab), None). cache (a KVCache, generation's): idx are the tokens that follow the cache.length ones
        it holds, which it then holds too."""
        if reduction not in ('sum', 'mean', 'none'):
            raise ValueError(f"reduction must be 'sum', 'mean' or 'none', got {reduction!r}")
        B, T = idx.size()
        x = self.hidden_states(idx, windows, cache)
        if targets is None:
            return self.logits(x[:, [-1]]), None
        if reduction == 'none':
            if x.requires_grad:
                raise RuntimeError("reduction='none' has no gradients: call the model under torch.no_grad()")
            scored = (targets != -1).view(-1, 1)
            losses = loss_and_gradients(x.view(B * T, -1), self.lm_head.weight, targets.clamp(min=0).view(-1, 1),
                                        scored, self.loss_chunk_rows, need_grad=False, per_row=True)[0]
            return None, losses.view(B, T)
        loss = softcapped_mtp_loss(x.view(B * T, -1), self.lm_head.weight, *multi_token_targets(targets, mtp_weights),
                                   self.loss_chunk_rows)
        return None, loss if reduction == 'sum' else loss / (B * T)

    def hidden_states(self, idx, windows=None, cache=None):
        """The last hidden states (B, T, n_embd) of idx (B, T), normed: what the head reads. windows and cache:
        forward's."""
        config = self.config
        T = idx.size(1)
        start = 0 if cache is None else cache.length  # the first new position
        windows = (config.short_window, config.long_window) if windows is None else windows
        if cache is None:
            context, docs = idx, self.documents(document_ids(idx, config.doc_token), self.segments)
        else:  # the tokens before the new ones that the smear and bigrams read; the documents of those a window sees
            context, kept_docs = cache.extend(idx, config.doc_token, max(windows) + 1)
            docs = self.documents(kept_docs)
        x, bigram, tables = self.lookups(context, T)
        # smear: each position's embedding takes in the previous token's, as much as its own gate lets it
        gate = torch.sigmoid(self.smear_gate(x[:, 1:, :config.gate_inputs]))
        x = torch.cat((x[:, :1], x[:, 1:] + self.smear_lambda * gate * x[:, :-1]), dim=1)
        x = x0 = rms_norm(x[:, -T:])
        rotary, scale = self.rotary(T, idx.device, x.dtype, start)
        skip_from, skip_to = config.skip
        for i, (block, (_, table)) in enumerate(zip(self.transformer.h, config.layers)):
            if i == skip_to:
                gate = 2 * torch.sigmoid(self.skip_gate(x0[..., :config.gate_inputs]))
                x = x + torch.sigmoid(self.skip_lambda) * gate * skipped
            x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0 + self.bigram_lambdas[i] * bigram
            x = block(x, None if table is None else tables[table], rotary, docs, windows, scale,
                      None if cache is None else cache.layers[i])
            if i == skip_from:
                skipped = x
            if i == config.backout_layer:
                backout = x
        # what the first layers wrote for the context of later positions, not for this one's prediction, backed out
        return rms_norm(x - self.backout_lambda * backout)

    @torch._disable_dynamo  # eager, before a compiled model's graph: TableRows' backward writes .grad
    def lookups(self, context, T):
        """The tables' rows for the last T tokens of context (B, before + T), which holds the tokens before them from
        the row's start or the last 2 (the first two positions hash their bigrams apart): the embedding's with the
        token before them (for the smear), the bigram table's, and each value table's."""
        before = context.size(1) - T
        wte = self.lm_head.weight if self.embedding_tied else self.transformer.wte.weight
        x = table_rows(context[:, max(before - 1, 0):], wte)
        bigram = self.transformer.bigram_embed(bigram_hash(context, self.config.bigram_vocab_size)[:, before:])
        return x, bigram, [table(context[:, before:]) for table in self.transformer.value_embeds]

    def logits(self, hidden):
        """The capped logits of hidden states (..., n_embd), in fp32 (fp64 for fp64 weights): sampling's, and those
        of every position that a Hugging Face export gives."""
        logits = self.lm_head(hidden)
        return softcap(logits.to(torch.promote_types(logits.dtype, torch.float32)))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """nanoGPT's sampling: max_new_tokens tokens appended to idx (B, T), each drawn from the capped logits of the
        last position divided by temperature, the top_k most likely kept (None: all). use_cache: a KVCache keeps the
        earlier positions' keys and values, so each step runs only the new token; without it the model runs on the
        whole sequence for each token, as nanoGPT's generate. No block size to crop to: its windows bound what a
        position sees."""
        cache = KVCache(len(self.config.layers)) if use_cache else None
        for _ in range(max_new_tokens):
            logits, _ = self(idx if cache is None else idx[:, cache.length:], cache=cache)
            logits = logits[:, -1, :] / temperature
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('inf')
            idx = torch.cat((idx, torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)), dim=1)
        return idx


class KVCache:
    """Generation's memory between forwards: each attention layer's keys and values of the positions its window still
    reaches (in its layout: two positions a token for paired heads; long layers' keys before their shift), the
    document ids of the last tokens a window reaches, the last two tokens (the smear's and the bigram hash's context)
    and their count, so that GPT2026.forward(idx, cache=cache) runs only the new tokens idx, at a cost and in memory
    that stop growing once a sample is longer than the windows."""

    def __init__(self, n_layer):
        self.length = 0  # the tokens run so far
        self.tokens = None  # (B, 2) the last two
        self.docs = None  # (B, kept) the document ids of the last ones
        # each layer's 'keys' and 'values' (B, positions, heads, D), the last window + 1 positions, and its 'window'
        self.layers = [{} for _ in range(n_layer)]

    def extend(self, idx, doc_token, keep):
        """(the tokens kept, then idx (B, T); the document ids of the positions kept, then idx's). Then it holds idx
        as well: the last two tokens, and the document ids of the last `keep` positions (no window reaches further)."""
        self.length += idx.size(1)
        docs = document_ids(idx, doc_token)
        if self.docs is not None:
            docs = torch.cat((self.docs, docs + self.docs[:, -1:]), dim=1)
            idx = torch.cat((self.tokens, idx), dim=1)
        self.tokens, self.docs = idx[:, -2:], docs[:, -keep:]
        return idx, docs


def document_ids(idx, doc_token):
    """Each position's document in idx (B, T): the doc_tokens up to and including it (a document starts at each)."""
    return (idx == doc_token).cumsum(1)


def table_rows(idx, weight):
    """F.embedding(idx, weight), its gradient added into weight.grad in place (TableRows) where autograd records one."""
    if torch.is_grad_enabled() and weight.requires_grad:
        return TableRows.apply(idx, weight)
    return F.embedding(idx, weight)


class Table(nn.Embedding):
    """An embedding table whose gradient table_rows adds into its weight's .grad in place."""

    def forward(self, idx):
        return table_rows(idx, self.weight)


class TableRows(torch.autograd.Function):
    """F.embedding(idx, weight) whose backward adds the gradient of the rows it read into weight.grad in place, made
    (zeros) at the first, and gives autograd none for the weight. Autograd's own would be the whole table's, written
    and then added to .grad, at every micro-batch of a step: the record's tables hold 347M values, several GB of
    memory traffic a micro-batch, where its rows are a few MB. Megatron-LM's gradient-accumulation fusion, for
    tables. The weight's accumulation node still runs after this backward, with nothing to add: its hooks (a DDP
    wrapper's, a post-accumulate hook) see the whole gradient."""

    @staticmethod
    def forward(ctx, idx, weight):
        ctx.save_for_backward(idx)
        ctx.weight = weight
        return F.embedding(idx, weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        idx, = ctx.saved_tensors
        weight = ctx.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        # accumulate=True: in a deterministic order on CUDA, where index_add_'s atomic adds are not
        weight.grad.index_put_((idx.reshape(-1),), grad.reshape(-1, weight.size(1)).to(weight.grad.dtype),
                               accumulate=True)
        return None, None


def softcap(logits):
    return SOFTCAP_SCALE * torch.sigmoid((logits + SOFTCAP_SHIFT) / SOFTCAP_WIDTH)


def multi_token_targets(targets, mtp_weights):
    """(targets, weights), each (B*T, K) for K = len(mtp_weights): position t predicts targets[:, t + k] with weight
    mtp_weights[k] (in fp32, as the record's schedule holds them), k = 0 the next token; weight 0 past the row's end,
    as the record's past its micro-batch's."""
    B, T = targets.shape
    K = len(mtp_weights)
    ahead = F.pad(targets, (0, K - 1)).unfold(1, K, 1)  # (B, T, K)
    inside = torch.arange(T, device=targets.device)[:, None] + torch.arange(K, device=targets.device) < T
    weights = torch.as_tensor(mtp_weights, dtype=torch.float32, device=targets.device) * inside
    return ahead.reshape(B * T, K), weights.expand(B, T, K).reshape(B * T, K)


def softcapped_mtp_loss(hidden, weight, targets, weights, chunk_rows):
    """sum over rows i and predictions k of weights[i, k] * the cross-entropy of softcap(hidden[i] @ weight.T)
    against targets[i, k]; hidden (N, d), weight (V, d), targets and weights (N, K). Chunk by chunk of rows, the
    logits of one chunk at a time: with gradients, they are computed in the same pass (MultiTokenLoss)."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return MultiTokenLoss.apply(hidden, weight, targets, weights, chunk_rows)
    return loss_and_gradients(hidden, weight, targets, weights, chunk_rows, need_grad=False)[0]


class MultiTokenLoss(torch.autograd.Function):
    """softcapped_mtp_loss's gradients, computed in forward and scaled by the upstream gradient in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, weights, chunk_rows):
        loss, grad_hidden, grad_weight = loss_and_gradients(hidden, weight, targets, weights, chunk_rows, True)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return loss

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        hidden_dtype, weight_dtype = ctx.dtypes
        return (grad_hidden.mul(grad_loss).to(hidden_dtype), grad_weight.mul(grad_loss).to(weight_dtype),
                None, None, None)


def loss_and_gradients(hidden, weight, targets, weights, chunk_rows, need_grad, per_row=False):
    """(loss, d loss / d hidden, d loss / d weight) of softcapped_mtp_loss; the gradients None without need_grad;
    per_row: the (N,) loss of each row in place of their sum.
    Each chunk's logits come from the matmul in its dtype (autocast's, or the inputs'), the softcap and softmax run in
    fp32 (fp64 for fp64 inputs), and the weight's gradient accumulates there. Per row, with z the capped logits and
    S the sum of its weights: d loss / d z = S softmax(z) - sum_k weights[k] onehot(targets[k])."""
    accumulate = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    loss = torch.zeros((), dtype=accumulate, device=hidden.device)
    row_losses = torch.empty(hidden.size(0), dtype=accumulate, device=hidden.device) if per_row else None
    grad_hidden = torch.empty_like(hidden, dtype=accumulate) if need_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=accumulate, device=weight.device) if need_grad else None
    weights = weights.to(accumulate)
    for start in range(0, hidden.size(0), chunk_rows):
        rows = slice(start, start + chunk_rows)
        h, t, w = hidden[rows], targets[rows], weights[rows]
        logits = F.linear(h, weight)
        matmul_dtype = logits.dtype
        sigmoid = logits.to(accumulate).add_(SOFTCAP_SHIFT).div_(SOFTCAP_WIDTH).sigmoid_()
        capped = sigmoid * SOFTCAP_SCALE
        lse = capped.logsumexp(dim=1, keepdim=True)
        terms = w * (lse - capped.gather(1, t))
        if per_row:
            row_losses[rows] = terms.sum(1)
        else:
            loss += terms.sum()
        if need_grad:
            grad = capped.sub_(lse).exp_().mul_(w.sum(1, keepdim=True)).scatter_add_(1, t, -w)
            grad.mul_(sigmoid.addcmul_(sigmoid, sigmoid, value=-1)).mul_(SOFTCAP_SCALE / SOFTCAP_WIDTH)
            grad = grad.to(matmul_dtype)
            grad_hidden[rows] = grad @ weight.to(matmul_dtype)
            grad_weight += (grad.T @ h.to(matmul_dtype)).to(accumulate)
    return row_losses if per_row else loss, grad_hidden, grad_weight
