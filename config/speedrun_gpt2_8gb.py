# GPT-2 (124M) from scratch on one 8 GB card (e.g. RTX 4060 Ti 8GB, RTX 3070): modded-nanogpt's record of 4 Jan 2025
# (docs/record.md) ported key by key: its model, initialization, optimizer groups and hyperparameters, schedules and
# data order, 1,390 steps of 524,288 tokens (0.73B). Its 80 runs ended at FineWeb validation loss 3.2791 on average
# (standard deviation 0.0019, 3.2753-3.2837): 3.28 is about its mean, not a guarantee. What one card changes, each
# with its reason in docs/record.md: the record's 8 x 65,536-token step accumulated as 64 x 8,192 in one process, each
# block recomputed in backward (its activations do not fit 8 GB otherwise), autocast over fp32 weights (its embeddings
# were bf16), validation on held-out FineWeb documents (with HellaSwag). Its block-wise window runs in FlexAttention,
# the record's kernel, on CUDA, and masked attention elsewhere.
# $ python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb --name sample-10BT \
#       --max_tokens 1_500_000_000 --out_dir data/fineweb
# $ python estimate_memory.py config/speedrun_gpt2_8gb.py --gpu_memory_gb=8
# $ python train.py config/speedrun_gpt2_8gb.py
# How long it takes on your card: python bench.py --mode=card; docs/recipe.md's projection otherwise

dataset = 'fineweb'
out_dir = 'out-speedrun-gpt2'

# the record's model (training/recipe.py's RECIPES['record']): GPT-2 124M's width and depth with 6 heads of 128, no
# biases; rotary positions (half of each head's pairs turning), RMSNorm without gains everywhere (the embedding too),
# QK-norm, ReLU², an untied head, logits soft-capped at 15; each block's input mixes in the normed embedding (x0
# shortcut); three value-embedding tables whose rows mix into the values of blocks 0-2 and again 9-11, the other
# blocks' values scaled by a learned weight; no attention in block 7; U-net skips from blocks 0-5 into 11-6.
# PyTorch's default init, projections and head at zero.
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
logit_softcap = 15.0
x0_shortcut = True
unet_skips = True
value_embeds = 3
value_scale = True
no_attn_layer = 7
rope_truncated = True
weight_init = 'pytorch'
zero_init_proj = True

# the record's layout: documents (each starting at <|endoftext|>, 50256) read in order, each token once; each position
# attends to the positions up to itself in its own document within the attn_window // 128 blocks of 128 up to its own,
# as FlexAttention's block masks: from 1 block at first to 14 (1,792) from step 1,339, on a line towards 1,856. Rows
# of 8,192 tokens (the record's: 65,536, one per GPU), 64 a step: 524,288 tokens; as config/speedrun_gpt2_12gb.py,
# with each block recomputed in backward: 6.45 GiB by the estimate, where rows of 4,096 without it take 8.19
block_size = 8192
batch_order = 'sequential'
doc_token = 50256
attn_window = 1792
attn_window_block = 128
attn_window_warmup_start = 128
attn_window_warmup_end = 1856
attn_window_warmup_iters = 1390
batch_size = 1
gradient_accumulation_steps = 64
activation_checkpointing = True
max_iters = 1390
lr_decay_iters = 1390

# the record's optimizer: Muon (its momentum an average, divided by norm + 1e-7; q, k and v orthogonalized each on
# its own) at 0.05 for the blocks' matrices, momentum 0.85 -> 0.95 over 300 steps; Adam (betas 0.8, 0.95) at 0.6 for
# the embedding and the value-embedding tables, 0.008 for the head, 0.04 for the scalars; no weight decay, no
# clipping; every lr flat, then linear to 0 over the last 40% of the steps (556)
optim = 'muon'
muon_split_qkv = True
muon_momentum_form = 'ema_eps'
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
cooldown_frac = 0.4
min_lr = 0.0

# every 139 steps, the last at step 1,390 as the record's (which evaluates every 125 steps and at the end; train.py
# evaluates at multiples of eval_interval only): val loss on 100 * 8,192 held-out FineWeb tokens (about all of val.bin;
# the record: 10,485,760 of its own validation shard), and HellaSwag's 10,042 examples (downloaded once to
# data/hellaswag/; OpenAI's GPT-2 124M scores acc_norm 0.2955 there, README: HellaSwag)
eval_interval = 139
eval_iters = 100
eval_batch_size = 2
hellaswag = True
log_interval = 10

compile = True  # needs Triton (not on native Windows): compile = False there, it fits in eager mode too
