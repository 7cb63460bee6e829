# GPT-2 (124M) from scratch on one 8 GB card (e.g. RTX 4060 Ti 8GB, RTX 3070): modded-nanogpt's record of 24 Nov 2024
# (docs/record.md) ported key by key: its model, initialization, optimizer groups and hyperparameters, schedules and
# data order, 1,750 steps of 524,288 tokens (0.92B). Its seven runs ended at 3.2733-3.2833 FineWeb validation loss
# (mean 3.2770, two of seven above 3.28): 3.28 is its mean, not a guarantee. What one card changes, each with its
# reason in docs/recipe.md: the record's 8 x 65,536-token step accumulated as 128 x 4,096 in one process, masked
# attention or FlashAttention's variable-length kernel where the record used FlexAttention, autocast over fp32
# weights, validation on held-out FineWeb documents (with HellaSwag).
# $ python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb --name sample-10BT \
#       --max_tokens 1_500_000_000 --out_dir data/fineweb
# $ python estimate_memory.py config/speedrun_gpt2_8gb.py --gpu_memory_gb=8
# $ python train.py config/speedrun_gpt2_8gb.py
# How long it takes on your card: python bench.py --mode=card; docs/recipe.md's projection otherwise

dataset = 'fineweb'
out_dir = 'out-speedrun-gpt2'

# the record's model (training/recipe.py's RECIPES['record']): GPT-2 124M's width and depth with 6 heads of 128, no
# biases; rotary positions, RMSNorm without gains everywhere (the embedding too), QK-norm, ReLU², an untied head,
# logits soft-capped at 30; each block's input mixes in the normed embedding (x0 shortcut) and its values block 0's
# (value residual); U-net skips from blocks 0-5 into 11-6. PyTorch's default init, projections and head at zero.
n_layer = 12
n_head = 6
n_embd = 768
bias = False
dropout = 0.0
pos_emb = 'rope'
norm = 'rmsnorm'
norm_gain = False
embed_norm = True
qk_norm = True
mlp = 'relu2'
tie_weights = False
logit_softcap = 30.0
x0_shortcut = True
value_residual = True
unet_skips = True
value_embeds = 0 # a later record's value embeddings: not this one's
weight_init = 'pytorch'
zero_init_proj = True

# the record's layout: documents (each starting at <|endoftext|>, 50256) read in order, each token once; each position
# attends to at most the attn_window positions up to itself in its own document, a window that grows from 64 to 1,792
# in steps of 64 over the run. Rows of 4,096 tokens (the record's: 65,536, one per GPU; config/speedrun_gpt2_12gb.py's
# 8,192: the activations halve), 128 a step: 524,288 tokens.
block_size = 4096
batch_order = 'sequential'
doc_token = 50256
attn_window = 1792
attn_window_warmup_start = 64
attn_window_warmup_iters = 1750
batch_size = 1
gradient_accumulation_steps = 128
max_iters = 1750
lr_decay_iters = 1750

# the record's optimizer: Muon (its own momentum sum; q, k and v orthogonalized each on its own) at 0.05 for the
# blocks' matrices, momentum 0.85 -> 0.95 over 300 steps; Adam (betas 0.8, 0.95) at 0.6 for the embedding, 0.008 for
# the head, 0.04 for the scalars; no weight decay, no clipping; every lr flat, then linear to 0 over the last 640 steps
optim = 'muon'
muon_split_qkv = True
muon_momentum_form = 'sum'
muon_learning_rate = 0.05
muon_momentum = 0.95
muon_momentum_warmup_iters = 300
embedding_learning_rate = 0.6
head_learning_rate = 0.008
scalar_learning_rate = 0.04
learning_rate = 6e-4 # the peak of AdamW groups without their own: none here (no gains, no biases)
beta1 = 0.8
beta2 = 0.95
weight_decay = 0.0
grad_clip = 0.0
decay_lr = True
lr_schedule = 'wsd'
warmup_iters = 0
cooldown_frac = 640 / 1750
min_lr = 0.0

# every 125 steps, as the record: val loss on 200 * 4,096 held-out FineWeb tokens (about all of val.bin; the record:
# 10,485,760 of its own validation shard), and HellaSwag's 10,042 examples (downloaded once to data/hellaswag/;
# OpenAI's GPT-2 124M scores acc_norm 0.2955 there, README: HellaSwag)
eval_interval = 125
eval_iters = 200
eval_batch_size = 4
hellaswag = True
log_interval = 10

compile = True  # needs Triton (not on native Windows): compile = False there, it fits in eager mode too
