# GPT-2 (124M) from scratch with the modern recipe (docs/recipe.md) on one 12 GB card (e.g. RTX 3060 12GB), to
# GPT-2 124M quality on FineWeb: the speedrun's 3.28 validation loss (llm.c's GPT-2 baseline needs 10B tokens).
# Packed documents as modded-nanogpt's window-warmup record (U-net skips, attention over long sequences in windows of
# each document that grow over the run), whose budget this is: 1,750 steps of 524,288 tokens, 0.92B tokens.
# The recipe differs from that record (docs/recipe.md): for a margin, --max_iters=2100 --lr_decay_iters=2100.
# Validation on held-out FineWeb documents, HellaSwag at each evaluation.
# $ python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb --name sample-10BT \
#       --max_tokens 1_500_000_000 --out_dir data/fineweb
# $ python estimate_memory.py config/speedrun_gpt2_12gb.py --gpu_memory_gb=12
# $ python train.py config/speedrun_gpt2_12gb.py
# How long it takes per card: docs/recipe.md's projection; on yours, measure it with
# $ python bench.py config/speedrun_gpt2_12gb.py --real_data=False

dataset = 'fineweb'
out_dir = 'out-speedrun-gpt2'

# GPT-2 124M's shape, without biases; the recipe's architecture (docs/modern_recipe.md, docs/recipe.md)
n_layer = 12
n_head = 12
n_embd = 768
bias = False
pos_emb = 'rope'
norm = 'rmsnorm'
qk_norm = True
mlp = 'relu2'
tie_weights = False
logit_softcap = 15.0
value_embeds = 1 # a later record's value embeddings, one table (blocks 0 and 11): 38.6M embedding parameters
unet_skips = True # U-net skips: blocks 0-5's outputs added to blocks 11-6's inputs, a learned weight each

# the records' layout: documents packed into 8,192-token sequences (modded-nanogpt's: 65,536), each position attending
# to at most the attn_window positions up to itself in its own document (<|endoftext|>, 50256, starts one); on CUDA
# FlashAttention's variable-length kernel computes only those. The window grows over the whole run from 64 positions
# to 1,024, in steps of 64, as modded-nanogpt's record of 24 Nov 2024 grew its (to 1,792: a longer end cost loss in
# bench_optim.py's runs, docs/recipe.md)
block_size = 8192
attn_window = 1024
attn_window_warmup_iters = 1750
attn_window_warmup_start = 64
doc_token = 50256
# ~0.5M tokens per optimizer step, as modded-nanogpt's record and llm.c: 8192 * 64 = 524,288 tokens
batch_size = 1
gradient_accumulation_steps = 64
max_iters = 1750
lr_decay_iters = 1750

# the recipe's optimizer and schedule (training/recipe.py): Muon for the blocks' matrices at 0.02, its momentum
# warmed up from 0.85 over 300 steps as nanochat; AdamW (learning_rate) for the rest; warmup-stable-decay
optim = 'muon'
muon_learning_rate = 0.02
muon_momentum = 0.95
muon_momentum_warmup_iters = 300
learning_rate = 6e-4  # nanoGPT's for GPT-2 124M: the AdamW groups' peak
embedding_learning_rate = 0.01
head_learning_rate = 0.004
lr_schedule = 'wsd'
cooldown_frac = 0.2
warmup_iters = 100
min_lr = 6e-5
weight_decay = 1e-1

# every 250 steps (~0.13B tokens): val loss on 50 * 16,384 tokens of held-out FineWeb, and HellaSwag's 10,042 examples
# (downloaded once to data/hellaswag/); OpenAI's GPT-2 124M scores acc_norm 0.2955 there (README: HellaSwag)
eval_interval = 250
eval_iters = 50
eval_batch_size = 2
hellaswag = True
log_interval = 10

compile = True  # needs Triton (not on native Windows): compile = False there
