# GPT-2 (124M) from scratch on a 10B-token budget of FineWeb-Edu on one 12 GB card (e.g. RTX 3060 12GB), with
# HellaSwag at each evaluation: the budget with which llm.c reproduced GPT-2 124M (10B FineWeb tokens).
# Prepare the data first (streams the corpus; disk used: the output, ~20 GB):
# $ python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT \
#       --max_tokens 10_000_000_000 --out_dir data/fineweb_edu
# $ python estimate_memory.py config/train_fineweb_edu_12gb.py --gpu_memory_gb=12
# $ python train.py config/train_fineweb_edu_12gb.py
# How long 10B tokens take per card: docs/recipe.md's projection (the log prints the MFU measured on yours);
# config/speedrun_gpt2_12gb.py reaches the same quality in fewer tokens.

dataset = 'fineweb_edu'
out_dir = 'out-fineweb-edu'

# ~0.5M tokens per optimizer step, as GPT-2, nanoGPT and llm.c: 8 * 1024 * 64 = 524,288 tokens;
# 19,073 steps are 10.0B tokens, one pass over the budget
batch_size = 8
block_size = 1024
gradient_accumulation_steps = 64
max_iters = 19073
lr_decay_iters = 19073

# llm.c's GPT-2 124M recipe: peak 6e-4 after 700 warmup steps, weight decay 0.1; nanoGPT's floor of a tenth of the peak
learning_rate = 6e-4
warmup_iters = 700
min_lr = 6e-5
weight_decay = 1e-1

# every 1000 steps (~0.5B tokens): val loss on 50 * 16 windows, and HellaSwag's 10,042 examples (downloaded once to
# data/hellaswag/); OpenAI's GPT-2 124M scores acc_norm 0.2955 there (docs/hellaswag.md)
eval_interval = 1000
eval_iters = 50
eval_batch_size = 16
hellaswag = True
log_interval = 10

compile = True  # needs Triton (not on native Windows): compile = False there, batch 8 fits in eager mode too
