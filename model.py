"""
Full definition of a GPT Language Model: nanoGPT's modules, parameter names, init and API, so nanoGPT checkpoints
load as they are. It needs only torch: copy it anywhere.
GPT-2's path comes first (LayerNorm, CausalSelfAttention, MLP, Block, GPTConfig, GPT); GPTConfig's other fields are
modded-nanogpt's options (defaults: GPT-2's). Then what they add: value embeddings and rotary embeddings; the kinds of
attention that windows, documents and generation's cache call for (SDPA, under a mask where they restrict it); and the
loss, linear_cross_entropy, in chunks of rows, so that the (B*T, vocab) logits never exist.
A run of train.py gives GPT what computes the same faster: training/attention.py's kernels on a GPU (FlashAttention's
for documents and windows by position, FlexAttention's for windows in blocks) and training/chunked_loss.py's tuned
loss.

References:
1) the official GPT-2 TensorFlow implementation released by OpenAI:
https://github.com/openai/gpt-2/blob/master/src/model.py
2) huggingface/transformers PyTorch implementation:
https://github.com/huggingface/transformers/blob/main/src/transformers/models/gpt2/modeling_gpt2.py
"""

import inspect
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint


class LayerNorm(nn.Module):
    """ LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False
    rms=True (norm='rmsnorm'): RMSNorm, no mean, no bias. gain=False (norm_gain): no weight nor bias, torch's eps """

    def __init__(self, ndim, bias, rms=False, gain=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim)) if gain else None
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias and gain and not rms else None
        self.rms = rms

    def forward(self, input):
        if self.rms:
            return F.rms_norm(input, input.shape[-1:], self.weight, None if self.weight is None else 1e-5)
        return F.layer_norm(input, input.shape[-1:], self.weight, self.bias, 1e-5)

class CausalSelfAttention(nn.Module):

    def __init__(self, config, value_embed=False):
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
        self.qk_norm = config.qk_norm
        # (values, table rows); value_scale: also without a table, where only the first acts (the record's count)
        self.value_lambdas = nn.Parameter(torch.tensor([0.5, 0.5])) if value_embed or config.value_scale else None
        self.v1_lambda = nn.Parameter(torch.tensor([0.5])) if config.value_residual else None # 1-D: fsdp shards it

    def forward(self, x, *, attention=None, rotary=None, value_embed=None, cache=None, v1=None):
        """attention: GPT.attention's (None: causal); rotary: GPT.forward's (cos, sin) with pos_emb='rope';
        value_embed: this layer's value_embeds rows (B, T, C); cache: its (keys, values) in a KVCache; v1: block 0's
        values. Returns (y, v1)."""
        B, T, C = x.size() # batch size, sequence length, embedding dimensionality (n_embd)
        # calculate query, key, values for all heads in batch and move head forward to be the batch dim
        q, k, v  = self.c_attn(x).split(self.n_embd, dim=2)
        if self.v1_lambda is not None: # value_residual: the values mix with block 0's (block 0 with its own)
            v1 = v if v1 is None else v1
            v = (1 - self.v1_lambda) * v + self.v1_lambda * v1
        if value_embed is not None: # value_embeds: the values mix with the token's own row of this layer's table
            v = self.value_lambdas[0] * v + self.value_lambdas[1] * value_embed.to(v.dtype) # autocast's v: bf16
        elif self.value_lambdas is not None: # value_scale: a layer without a table scales its values
            v = self.value_lambdas[0] * v
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v)) # (B, nh, T, hs)
        if self.qk_norm: # each head's queries and keys to unit RMS: attention logits stay bounded (no weights)
            q, k = F.rms_norm(q, (q.size(-1),)), F.rms_norm(k, (k.size(-1),))
        if rotary is not None: # pos_emb='rope': positions enter as rotations of q and k, GPT.forward's (cos, sin)
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        y = attend(q, k, v, attention, cache, self.attn_dropout.p if self.training else 0) # dropout inside SDPA
        y = y.transpose(1, 2).contiguous().view(B, T, C) # re-assemble all head outputs side by side
        # output projection
        y = self.resid_dropout(self.c_proj(y))
        return y, v1

class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc    = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu    = nn.GELU()
        self.c_proj  = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.relu2 = config.mlp == 'relu2'

    def forward(self, x):
        x = self.c_fc(x)
        x = F.relu(x).square() if self.relu2 else self.gelu(x) # relu2: ReLU squared, modded-nanogpt's activation
        x = self.c_proj(x)
        x = self.dropout(x)
        return x

class Block(nn.Module):

    def __init__(self, config, value_embed=False, attention=True):
        super().__init__()
        norm = dict(bias=config.bias, rms=config.norm == 'rmsnorm', gain=config.norm_gain)
        # attention=False (no_attn_layer): the MLP alone, no parameter left without a gradient
        self.ln_1 = LayerNorm(config.n_embd, **norm) if attention else None
        self.attn = CausalSelfAttention(config, value_embed) if attention else None
        self.ln_2 = LayerNorm(config.n_embd, **norm)
        self.mlp = MLP(config)
        self.x0_lambdas = nn.Parameter(torch.tensor([1.0, 0.0])) if config.x0_shortcut else None # of (input, x0)

    def forward(self, x, *, attention=None, rotary=None, x0=None, value_embed=None, cache=None, v1=None):
        """x0: GPT.forward's embedding, with x0_shortcut; the others: CausalSelfAttention.forward's. Returns (x, v1)."""
        if self.x0_lambdas is not None: # x0_shortcut: every block sees the embedding directly, not only block 0
            x = self.x0_lambdas[0] * x + self.x0_lambdas[1] * x0
        if self.attn is not None:
            y, v1 = self.attn(self.ln_1(x), attention=attention, rotary=rotary, value_embed=value_embed, cache=cache,
                              v1=v1)
            x = x + y
        x = x + self.mlp(self.ln_2(x))
        return x, v1

GPT2_VOCAB_SIZE = 50257 # OpenAI's GPT-2 BPE: the tokens of its checkpoints, tiktoken's 'gpt2' and HellaSwag's

# The weights that Hugging Face's GPT2LMHeadModel holds transposed: OpenAI's checkpoints use a "Conv1D" module, a
# Linear whose weight is (in, out). Every other parameter has the same name and shape in both.
HF_TRANSPOSED = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304 # GPT-2 vocab_size of 50257, padded up to nearest multiple of 64 for efficiency
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True # True: bias in Linears and LayerNorms, like GPT-2. False: a bit better and faster
    # Modern options (modded-nanogpt's speedrun architecture, which nanochat also trains); the defaults are GPT-2's.
    # Each acts where its comment says; train.py records in model_args only those that differ from these defaults.
    pos_emb: str = 'learned' # 'learned': GPT-2's table wpe; 'rope': rotary embeddings in attention, no wpe
    norm: str = 'layernorm' # 'layernorm', or 'rmsnorm': ln_1, ln_2 and ln_f as RMSNorm (no mean, no bias)
    qk_norm: bool = False # True: RMSNorm each head's queries and keys before attention
    mlp: str = 'gelu' # 'gelu', or 'relu2': relu(x)**2 in the MLP
    tie_weights: bool = True # False: lm_head has its own matrix rather than sharing wte's
    zero_init_proj: bool = False # True: c_proj weights (and an untied lm_head) start at zero: each block an identity
    logit_softcap: float = 0.0 # > 0: logits become logit_softcap * tanh(logits / logit_softcap); 0: off
    value_embeds: int = 0 # k > 0: k token tables whose rows mix into attention's values in the first and last k layers
    unet_skips: bool = False # True: the first n_layer // 2 blocks' outputs are added to the mirrored blocks' inputs
    x0_shortcut: bool = False # True: each block's input is a learned mix of the residual stream and the embedding
    embed_norm: bool = False # True: the embedding RMS-normed (no gain) after the lookup, before block 0 and as x0
    norm_gain: bool = True # False: ln_1, ln_2, ln_f without weights (nor biases), with torch's default eps
    value_residual: bool = False # True: each block's values a learned mix of its own and block 0's
    value_scale: bool = False # True: blocks without a value_embeds table scale their values by a learned weight
    no_attn_layer: int = -1 # >= 0: that block has no attention, only its MLP (the 4 Jan 2025 record's 7)
    rope_truncated: bool = False # True: half of each head's rotary pairs turn (1 to 1/1024 rad a position), half not
    weight_init: str = 'gpt2' # 'gpt2': N(0, 0.02), c_proj scaled down; 'pytorch': nn.Linear's and nn.Embedding's own
    # Attention over packed documents (the records' 64K-token sequences): where each position may look
    attn_window: int = 0 # w > 0: at most the w positions up to itself (a sliding window); 0: the whole block
    attn_window_block: int = 0 # b > 0: the window counts whole blocks of b positions: the w / b up to a query's own
    doc_token: int = -1 # >= 0: each such token starts a document (<|endoftext|>: 50256), attention stays within one

class GPT(nn.Module):

    def __init__(self, config, *, activation_checkpointing=False, loss_fn=None, kernels=None, loss_chunk_mib=None):
        """Run-time choices, not GPTConfig fields, so checkpoints' model_args stay nanoGPT's. activation_checkpointing:
        each block recomputed in backward, for the activation memory of all but one block. loss_fn(hidden, weight,
        targets, *, ignore_index, reduction[, softcap][, chunk_bytes]): None is linear_cross_entropy; loss_chunk_mib
        (None: its default) becomes its chunk_bytes, the memory one chunk may take. kernels(config, idx, window,
        dtype): the attention of a forward where windows or documents restrict it, as (function, *arguments), the
        layers' attention then function(q, k, v, *arguments), or None where this file's SDPA under a mask computes it
        (training/attention.py's Kernels: FlashAttention's and FlexAttention's kernels on a GPU), which have no
        dropout: never asked in training with dropout, nor with generation's cache or padded rows."""
        super().__init__()
        assert config.vocab_size is not None
        assert config.block_size is not None
        # a window in blocks counts whole ones: else a position would see more with a longer row than a shorter one
        assert not config.attn_window_block or config.attn_window % config.attn_window_block == 0, \
            f"attn_window={config.attn_window} must be a multiple of attn_window_block={config.attn_window_block}"
        self.config = config
        self.activation_checkpointing = activation_checkpointing
        self.loss_fn = linear_cross_entropy if loss_fn is None else loss_fn
        self.kernels = kernels
        self.loss_options = {} if loss_chunk_mib is None else {'chunk_bytes': int(loss_chunk_mib * 2 ** 20)}

        self.transformer = nn.ModuleDict(dict(
            wte = nn.Embedding(config.vocab_size, config.n_embd),
            wpe = nn.Embedding(config.block_size, config.n_embd) if config.pos_emb == 'learned' else None,
            drop = nn.Dropout(config.dropout),
            h = nn.ModuleList([Block(config, value_embed=value_embed_table(config, i) is not None,
                                     attention=i != config.no_attn_layer) for i in range(config.n_layer)]),
            ln_f = LayerNorm(config.n_embd, bias=config.bias, rms=config.norm == 'rmsnorm', gain=config.norm_gain),
        ))
        self.skip_weights = nn.Parameter(torch.ones(config.n_layer // 2)) if config.unet_skips else None # kept outputs'
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight # https://paperswithcode.com/method/weight-tying

        # init all weights
        self.apply(self._init_weights)
        # apply special scaled init to the residual projections, per GPT-2 paper
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight') and config.weight_init == 'gpt2':
                torch.nn.init.normal_(p, mean=0.0, std=0.02/math.sqrt(2 * config.n_layer))
        if config.zero_init_proj: # modded-nanogpt's: blocks add nothing at first, and an untied head predicts uniform
            for pn, p in self.named_parameters():
                if pn.endswith('c_proj.weight') or (pn == 'lm_head.weight' and not config.tie_weights):
                    torch.nn.init.zeros_(p)
        # value_embeds' tables, built last: the weights above are the ones the same seed gives without them
        self.transformer.value_embeds = None
        if config.value_embeds:
            self.transformer.value_embeds = nn.ModuleList([nn.Embedding(config.vocab_size, config.n_embd)
                                                           for _ in range(config.value_embeds)])
            self.transformer.value_embeds.apply(self._init_weights)

    def get_num_params(self, non_embedding=True):
        """
        Return the number of parameters in the model.
        For non-embedding count (default), the position embeddings get subtracted. The token embeddings would too,
        except due to the parameter sharing these params are actually used as weights in the final layer, so we
        include them. (Untied, lm_head is that final layer and wte is subtracted, as are the value_embeds tables.)
        """
        n_params = sum(p.numel() for p in self.parameters())
        if non_embedding:
            if self.transformer.wpe is not None:
                n_params -= self.transformer.wpe.weight.numel()
            if not self.config.tie_weights:
                n_params -= self.transformer.wte.weight.numel()
            if self.transformer.value_embeds is not None:
                n_params -= sum(p.numel() for p in self.transformer.value_embeds.parameters())
        return n_params

    def _init_weights(self, module):
        if self.config.weight_init == 'pytorch': # modded-nanogpt's: what each module drew when built, kept
            return
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, reduction='mean', cache=None, attn_window=None, positions=None):
        """With targets: (None, the mean cross-entropy over targets != -1), from loss_fn without the (B, T, vocab)
        logits, which nanoGPT returned here unused; reduction='none' (no gradients): the (B, T) losses, 0 where
        targets are -1. Without targets: (logits of the last position (B, 1, vocab), None), as nanoGPT does.
        cache (a KVCache, for inference): idx are the tokens that follow the cache.length ones already in it.
        attn_window: this call's sliding window (train.py's attn_window_warmup_iters); None: config.attn_window.
        positions (b, t): each token's in its own row, -1 at padding, which no token attends to; None: 0, 1, ..."""
        device = idx.device
        b, t = idx.size()
        offset = 0 if cache is None else cache.length
        assert offset + t <= self.config.block_size, f"Cannot forward sequence of length {offset + t}, block size is only {self.config.block_size}"
        assert positions is None or cache is None, "padded rows (positions) run without a cache"
        pos = torch.arange(offset, offset + t, dtype=torch.long, device=device) if positions is None else positions

        # forward the GPT model itself
        tok_emb = self.transformer.wte(idx) # token embeddings of shape (b, t, n_embd)
        rotary = None
        if self.transformer.wpe is not None:
            pos_emb = self.transformer.wpe(pos.clamp(min=0)) # position embeddings of shape (t or (b, t), n_embd)
            x = self.transformer.drop(tok_emb + pos_emb)
        else: # pos_emb='rope': the positions are rotations of each attention's queries and keys
            rotary = rotary_cos_sin(pos if pos.dim() == 1 else pos[:, None], self.config.n_embd // self.config.n_head,
                                    self.config.rope_truncated)
            x = self.transformer.drop(tok_emb)
        attention = self.attention(idx, pos, cache, self.config.attn_window if attn_window is None else attn_window)
        x = F.rms_norm(x, x.shape[-1:]) if self.config.embed_norm else x # embed_norm: RMS 1 (GPT-2's init: 0.02)
        x0 = x if self.config.x0_shortcut else None # the embedding, which x0_shortcut mixes into every block's input
        # value_embeds: each table's rows for the tokens, looked up once for its two blocks
        tables = [table(idx) for table in self.transformer.value_embeds or ()]
        n_skips = 0 if self.skip_weights is None else len(self.skip_weights)
        kept, v1 = [], None # unet_skips: the outputs of the first n_skips blocks; value_residual: block 0's values
        # non-reentrant checkpointing: works with torch.compile and DDP, and restores the RNG for dropout
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for i, block in enumerate(self.transformer.h):
            mirror = self.config.n_layer - 1 - i
            if mirror < n_skips: # unet_skips: the last n_skips blocks take in their mirror's output, innermost first
                x = x + self.skip_weights[mirror] * kept[mirror]
            table = value_embed_table(self.config, i)
            inputs = dict(attention=attention, rotary=rotary, x0=x0, cache=None if cache is None else cache.layers[i],
                          value_embed=None if table is None else tables[table], v1=v1)
            x, v1 = checkpoint(block, x, **inputs, use_reentrant=False) if recompute else block(x, **inputs)
            if i < n_skips:
                kept.append(x)
        x = self.transformer.ln_f(x)
        if cache is not None:
            cache.length += t

        softcap = self.config.logit_softcap
        if targets is not None:
            loss = self.loss_fn(x.view(b * t, -1), self.lm_head.weight, targets.view(-1), ignore_index=-1,
                                reduction=reduction, **({'softcap': softcap} if softcap else {}), **self.loss_options)
            return None, (loss if reduction == 'mean' else loss.view(b, t))
        # inference-time mini-optimization: only forward the lm_head on the very last position
        logits = self.lm_head(x[:, [-1], :]) # note: using list [-1] to preserve the time dim
        if softcap:
            logits = softcap * torch.tanh(logits / softcap)
        return logits, None

    def attention(self, idx, pos, cache, window):
        """choose_attention's Attention for this forward, with `kernels` where no dropout is asked (they have none)."""
        kernels = None if self.training and self.config.dropout > 0 else self.kernels
        return choose_attention(self.config, idx, pos, cache, window, self.compute_dtype(idx.device.type), kernels)

    def compute_dtype(self, device_type):
        """The dtype the matrix products of a forward on `device_type` run in: autocast's, else the weights'."""
        autocast = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if autocast else self.lm_head.weight.dtype

    def crop_block_size(self, block_size):
        # model surgery to decrease the block size if necessary
        # e.g. we may load the GPT2 pretrained model checkpoint (block size 1024)
        # but want to use a smaller block size for some smaller, simpler model
        assert block_size <= self.config.block_size
        self.config.block_size = block_size
        if self.transformer.wpe is not None: # rotary embeddings have no table to crop
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
        config_args = dict(cls.PRETRAINED_ARGS[model_type], vocab_size=GPT2_VOCAB_SIZE, block_size=1024, bias=True)
        if 'dropout' in override_args:
            config_args['dropout'] = override_args['dropout']
        return GPTConfig(**config_args)

    @classmethod
    def from_pretrained(cls, model_type, override_args=None, **options): # options: the constructor's keywords
        config = cls.pretrained_config(model_type, override_args)
        if override_args and 'dropout' in override_args: # said once, as the weights load (not by shape queries)
            print(f"overriding dropout rate to {override_args['dropout']}")
        from transformers import GPT2LMHeadModel  # only needed here: imported lazily
        print("loading weights from pretrained gpt: %s" % model_type)
        return cls.from_hf_model(GPT2LMHeadModel.from_pretrained(model_type), config, **options)

    @classmethod
    def from_hf_model(cls, model_hf, config, **options):
        """A GPT with the weights of a Hugging Face GPT2LMHeadModel of the same shape; options: the constructor's."""
        model = cls(config, **options)
        sd = model.state_dict()
        sd_keys = [k for k in sd.keys() if not k.endswith('.attn.bias')] # discard this mask / buffer, not a param

        sd_hf = model_hf.state_dict()
        # copy while ensuring all of the parameters are aligned and match in names and shapes
        sd_keys_hf = [k for k in sd_hf.keys() if not k.endswith(('.attn.masked_bias', '.attn.bias'))] # buffers
        assert len(sd_keys_hf) == len(sd_keys), f"mismatched keys: {len(sd_keys_hf)} != {len(sd_keys)}"
        for k in sd_keys_hf:
            with torch.no_grad():
                if k.endswith(HF_TRANSPOSED):
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

    def estimate_mfu(self, fwdbwd_per_iter, dt, flops_promised=312e12, attn_window=None):
        """ estimate model flops utilization (MFU) in units of the device's peak FLOPS (nanoGPT's: an A100's bf16);
        attn_window: the window the iteration ran with, as forward's (None: config.attn_window) """
        # first estimate the number of flops we do per iteration.
        # see PaLM paper Appendix B as ref: https://arxiv.org/abs/2204.02311
        N = self.get_num_params()
        cfg = self.config
        L, H, Q, T = cfg.n_layer, cfg.n_head, cfg.n_embd//cfg.n_head, cfg.block_size
        window = cfg.attn_window if attn_window is None else attn_window
        span = min(window or T, T) # the positions each one attends to (a sliding window: its window)
        flops_per_token = 6*N + 12*L*H*Q*span
        flops_per_fwdbwd = flops_per_token * T
        flops_per_iter = flops_per_fwdbwd * fwdbwd_per_iter
        # express our flops throughput as ratio of the peak flops
        flops_achieved = flops_per_iter * (1.0/dt) # per second
        mfu = flops_achieved / flops_promised
        return mfu

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """
        Take a conditioning sequence of indices idx (LongTensor of shape (b,t)) and complete
        the sequence max_new_tokens times, feeding the predictions back into the model each time.
        Most likely you'll want to make sure to be in model.eval() mode of operation for this.
        use_cache: a KVCache keeps the earlier positions' keys and values, so each step runs only the new token,
        up to block_size; past it, the cropped context moves every token, so each step runs the whole window as
        use_cache=False (nanoGPT's generate) does. The tokens are the same either way, up to rounding.
        """
        cache = None
        if use_cache and idx.size(1) <= self.config.block_size: # a longer prompt is cropped from the first step on
            # the last token sampled is never fed back: the sequence runs to t + max_new_tokens - 1 positions
            max_len = min(idx.size(1) + max_new_tokens - 1, self.config.block_size)
            cache = KVCache(self.config, idx.size(0), max_len, idx.device, self.compute_dtype(idx.device.type))
        for _ in range(max_new_tokens):
            if cache is not None and idx.size(1) <= cache.max_len:
                logits, _ = self(idx[:, cache.length:], cache=cache) # the prompt, then each new token
            else:
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
# What the options add: value-embedding tables, rotary embeddings

def value_embed_table(config, layer):
    """The value_embeds table that block `layer` uses, or None: in the U-net pattern, table i serves block i and its
    mirror in the last k, block n_layer - k + i (modded-nanogpt's value embeddings)."""
    k = config.value_embeds
    if layer < k or layer >= config.n_layer - k:
        return layer if layer < k else layer - (config.n_layer - k)
    return None

def rotary_cos_sin(pos, head_size, truncated=False, base=10000.0):
    """The rotary embedding's (cos, sin) for positions `pos` (..., t): each (..., t, head_size / 2), a head's pair i
    turning at base**(-2i / head_size) radians a position (RoFormer; modded-nanogpt's frequencies to the bit).
    truncated (rope_truncated): the first quarter of the head's dimensions paired with the third turn at
    1024**(-j / (n - 1)), j < n = head_size / 4, the other pairs not at all (modded-nanogpt's from Dec 2024). In fp32
    from `pos` on every forward: cheap, no buffer for weight_dtype to cast, and any positions (a cache's) work."""
    if truncated:
        turning = (1 / 1024) ** torch.linspace(0, 1, steps=head_size // 4, dtype=torch.float32, device=pos.device)
        inv_freq = torch.cat((turning, turning.new_zeros(head_size // 2 - head_size // 4)))
    else:
        inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float32, device=pos.device) / head_size)
    angles = pos.to(torch.float32)[..., None] * inv_freq
    return angles.cos(), angles.sin()

def apply_rotary(x, cos, sin):
    """x (B, nh, T, hs) with the pairs (x[..., i], x[..., i + hs/2]) rotated by the angles of cos, sin (T, hs/2), or
    (B, 1, T, hs/2) for each row's own positions."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * cos + x2 * sin, x2 * cos - x1 * sin), dim=-1)

# -----------------------------------------------------------------------------
# Attention: GPT-2's causal attention, or what a sliding window (attn_window, in blocks with attn_window_block),
# documents (doc_token), padded rows and generation's KV cache restrict it to, chosen once a forward for all layers.
# Each kind computes the same attention where another could run; they differ in the kernel and the memory it takes:
# causal: SDPA's is_causal (FlashAttention on a GPU); window: SDPA under a mask, a block of queries at a time;
# masked: SDPA under a (T, T) mask; cache: SDPA under a mask of the new positions against all cached ones;
# kernel: GPT's `kernels`, which skip what the mask would empty (training/attention.py's, on a GPU).

class Attention(NamedTuple):
    """The attention every layer runs in one forward, chosen by choose_attention, and what that kind needs."""
    kind: str # 'causal', 'window', 'masked', 'cache' or 'kernel' (above)
    mask: torch.Tensor = None # additive: masked (B, 1, T, T); window (B, n, 1, w, 2w); cache (B or 1, 1, T, keys)
    offset: int = 0 # cache: the position of the first new token
    kernel: tuple = () # kernel: (function, *arguments), the attention function(q, k, v, *arguments)

CAUSAL = Attention('causal')

def attend(q, k, v, attention, cache, dropout_p):
    """The attention of q, k, v (B, nh, T, hs) of the kind `attention` names; cache: this layer's (keys, values) of a
    KVCache; dropout_p: the attention dropout."""
    kind = 'causal' if attention is None else attention.kind
    if kind == 'causal': # flash attention where the hardware has it, never a (T, T) matrix there
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if kind == 'kernel':
        function, *arguments = attention.kernel
        return function(q, k, v, *arguments)
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

def choose_attention(config, idx, pos, cache, window, dtype, kernels=None):
    """The Attention every layer of a forward on idx (B, T) runs, chosen once from what causality, the sliding
    `window`, config.doc_token, the cache and padding (pos: GPT.forward's positions, 2-D with padding) let each
    position see. dtype: the one the attention's matrix products run in (GPT.compute_dtype's). kernels: GPT's, asked
    first where neither the cache nor padding is there."""
    b, t = idx.size()
    padded = pos.dim() == 2
    if cache is None and config.doc_token < 0 and not (window and t > window) and not padded:
        return CAUSAL # nothing but causality restricts attention here
    if kernels is not None and cache is None and not padded:
        kernel = kernels(config, idx, window, dtype)
        if kernel is not None:
            return Attention('kernel', kernel=kernel)
    block = config.attn_window_block # a window in blocks of positions (0: by position)
    doc = None if config.doc_token < 0 else document_ids(idx, config.doc_token, pos)
    if doc is not None and cache is not None:
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

def document_ids(idx, doc_token, pos=None):
    """Each position's document (B, T): how many doc_tokens up to and including it; padding (pos < 0) counts none."""
    starts = idx == doc_token
    return (starts if pos is None else starts & (pos >= 0)).cumsum(1)

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

# -----------------------------------------------------------------------------
# The loss: a linear layer and cross-entropy fused, in chunks of rows, so that the (B*T, vocab) logits never exist.
# nanoGPT's lm_head(x) over every position is a (B*T, vocab) tensor (batch 64 x block 1024 x 50304 in bf16: 6.14 GiB,
# before cross-entropy's fp32 copies), what runs 12 GB cards out of memory at the first evaluation.

@torch._disable_dynamo # the chunk loop runs eagerly, also in a compiled model (torch.compiler.disable, imported lazily)
def linear_cross_entropy(hidden, weight, targets, *, ignore_index=-1, reduction='mean', softcap=0.0,
                         chunk_bytes=2 ** 30):
    """F.cross_entropy of the logits hidden @ weight.T (capped to softcap * tanh(logits / softcap) with softcap > 0)
    against targets, ignoring ignore_index, holding at most chunk_bytes of logits at once (three fp32 buffers of
    vocab_size a row, fp64 for fp64 inputs). hidden (N, d), weight (V, d), targets (N,). reduction 'mean': the mean
    over the targets not ignored (0 if all are), its gradients computed with it, chunk by chunk, as the logits of each
    chunk are at hand; 'none' (no gradients): the (N,) losses, 0 on ignored rows."""
    if reduction not in ('mean', 'none'):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if reduction == 'none' and wants_grad:
        raise RuntimeError("linear_cross_entropy(reduction='none') has no gradients: call it under torch.no_grad()")
    if wants_grad:
        return LinearCrossEntropy.apply(hidden, weight, targets, ignore_index, softcap, chunk_bytes)
    losses, count = loss_in_chunks(hidden, weight, targets, ignore_index, softcap, chunk_bytes)[:2]
    return losses if reduction == 'none' else losses.sum() / count

class LinearCrossEntropy(torch.autograd.Function):
    """linear_cross_entropy's mean, its gradients computed in forward (no logits kept for backward) and scaled there by
    the upstream gradient, which carries gradient accumulation's 1 / k."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, softcap, chunk_bytes):
        losses, count, grad_hidden, grad_weight = loss_in_chunks(hidden, weight, targets, ignore_index, softcap,
                                                                 chunk_bytes, need_grad=True)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = hidden.dtype, weight.dtype
        return losses.sum() / count

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden.mul(grad_loss).to(ctx.dtypes[0]), grad_weight.mul(grad_loss).to(ctx.dtypes[1]),
                None, None, None, None)

def loss_in_chunks(hidden, weight, targets, ignore_index, softcap, chunk_bytes, need_grad=False):
    """(losses (N,), 0 on ignored rows; the count of rows not ignored, at least 1; with need_grad the gradients of
    their mean, d / d hidden and d / d weight, else None, None), as many rows of logits at a time as three buffers of
    them fit in chunk_bytes. The matrix products run in autocast's dtype (else the inputs'), the softmax and the
    weight's gradient in fp32 (fp64 for fp64): d mean / d logits = (softmax - onehot) / count, times 1 - tanh**2 under
    the cap."""
    device_type = hidden.device.type
    autocast = torch.is_autocast_enabled(device_type)
    dtype = torch.get_autocast_dtype(device_type) if autocast else torch.promote_types(hidden.dtype, weight.dtype)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    rows = max(1, chunk_bytes // (3 * wide.itemsize * weight.size(0)))
    w = weight.to(dtype)
    valid = targets != ignore_index
    count = valid.sum().clamp(min=1).to(wide)
    safe_targets = torch.where(valid, targets, 0)[:, None]
    losses = torch.empty(targets.shape, dtype=wide, device=hidden.device)
    grad_hidden = torch.empty(hidden.shape, dtype=wide, device=hidden.device) if need_grad else None
    grad_weight = torch.zeros(weight.shape, dtype=wide, device=weight.device) if need_grad else None
    for start in range(0, hidden.size(0), rows): # each chunk's buffers die with its call
        chunk = slice(start, start + rows)
        factors = valid[chunk, None] / count
        losses[chunk] = chunk_loss(hidden[chunk].to(dtype), w, safe_targets[chunk], factors, softcap, wide,
                                   None if grad_hidden is None else grad_hidden[chunk], grad_weight)
    return losses, count, grad_hidden, grad_weight

def chunk_loss(h, w, targets, factors, softcap, wide, grad_hidden=None, grad_weight=None):
    """The losses of a chunk of rows h (rows, d) against targets (rows, 1), 0 where factors (rows, 1: 1 / count, or 0
    on ignored rows) are; with grad_hidden, its rows of the mean's gradient written there and its part of the
    weight's added to grad_weight. The logits in `wide`, in place: one buffer, two with the cap (its tanh kept)."""
    logits = torch.mm(h, w.t()).to(wide)
    if softcap: # the tanh in the logits' buffer, kept for the gradient; the capped logits in a second one
        tanh = logits.div_(softcap).tanh_()
        logits = tanh * softcap
    target_logits = logits.gather(1, targets)
    row_max = logits.amax(1, keepdim=True)
    exp = logits.sub_(row_max).exp_() # in place: no temporary of the chunk's size
    sum_exp = exp.sum(1, keepdim=True)
    losses = (sum_exp.log() + row_max - target_logits).squeeze(1) * (factors.squeeze(1) != 0)
    if grad_hidden is not None:
        grad = exp.div_(sum_exp) # the softmax
        grad.scatter_add_(1, targets, grad.new_full(targets.shape, -1.0))
        grad.mul_(factors)
        if softcap: # d capped / d logits = 1 - tanh**2
            grad.mul_(tanh.square_().neg_().add_(1))
        grad = grad.to(h.dtype)
        grad_hidden.copy_(torch.mm(grad, w))
        grad_weight += torch.mm(grad.t(), h)
    return losses
