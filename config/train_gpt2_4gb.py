# GPT-2 (124M) from scratch on OpenWebText on one 4 GB card (e.g. GTX 1650, RTX 3050 4GB): the 12 GB preset's recipe,
# 524,288 tokens a step, in micro-batches of 4 with each block recomputed in backward.
# Prepare the data first: python prepare/openwebtext.py
# $ python estimate_memory.py config/train_gpt2_4gb.py --gpu_memory_gb=4
# $ python train.py config/train_gpt2_4gb.py
# The weights, gradients and AdamW state (16 bytes a parameter, 1.9 GiB) take half the card; activation checkpointing
# keeps one block's activations instead of twelve, for one more forward of each block. Cards before Ampere (GTX 16
# and RTX 20 series) have no bf16: dtype defaults to float16 there, with a GradScaler, in the same memory.

dataset = 'openwebtext'

# 4 batch size * 1024 block size * 128 gradaccum = 524,288 tokens, as GPT-2 and nanoGPT
batch_size = 4
block_size = 1024
gradient_accumulation_steps = 128
activation_checkpointing = True
loss_chunk_mib = 128  # a tight card: the loss in chunks of ~384 of GPT-2's rows, not 1 GiB's
eval_batch_size = 4
eval_iters = 100  # 100 * 4 windows, as the 12 GB preset's 50 * 8, in micro-batches of eval_batch_size

compile = True  # needs Triton (not on native Windows): compile = False there, batch 4 fits in eager mode too

max_iters = 600000
lr_decay_iters = 600000
eval_interval = 1000
log_interval = 10
weight_decay = 1e-1
