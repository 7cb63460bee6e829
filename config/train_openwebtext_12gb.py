# GPT-2 (124M) on OpenWebText on one 12 GB card (e.g. RTX 3060 12GB, RTX 4070): nanoGPT's config/train_gpt2.py
# with the batch reshaped so it fits. Prepare the data first: python prepare/openwebtext.py
# $ python train.py config/train_openwebtext_12gb.py
# What it needs: python estimate_memory.py config/train_openwebtext_12gb.py --gpu_memory_gb=12 (docs/memory.md).

dataset = 'openwebtext'

# ~0.5M tokens per optimizer step, as GPT-2 and nanoGPT:
# 8 batch size * 1024 block size * 64 gradaccum = 524,288 tokens
# (train.py divides gradient_accumulation_steps by the number of DDP processes, so the tokens per step stay the
# same on more GPUs; 64 divides evenly by 1, 2, 4 and 8)
batch_size = 8  # leaves room on a 12 GB card for the desktop, allocator fragmentation and compile's workspace
block_size = 1024  # GPT-2's context; activation memory grows linearly with it (flash attention, no T x T scores)
gradient_accumulation_steps = 64
# The loss is chunked: the (B*T, vocab) logits, which push 12 GB cards out of memory in nanoGPT, never exist.
activation_checkpointing = False  # not needed for 124M at batch 8; True frees most activations for one more forward

# Evaluation runs under no_grad, so it keeps no activations for backward and a larger batch fits.
eval_batch_size = 16  # 0 would mean the same as batch_size
eval_iters = 50  # 50 * 16 * 1024 = 819,200 tokens per estimate: steady enough, and quick

# torch.compile fuses elementwise ops: faster, and usually a little less activation memory than eager, at the cost
# of a minute or two of compiling and several GB of host RAM. It needs Triton (not on native Windows): set
# compile = False there; batch 8 still fits in eager mode.
compile = True

# nanoGPT's schedule: 600k steps = 300B tokens, far beyond one consumer card (each step is ~6 * 124M * 524,288
# = 4e17 FLOPs). For a shorter run pass e.g. --max_iters=20000 --lr_decay_iters=20000 (~10B tokens, about one
# epoch of OpenWebText).
max_iters = 600000
lr_decay_iters = 600000

eval_interval = 1000
log_interval = 10
weight_decay = 1e-1

# Muon (docs/optimizers.md): --optim=muon steps the blocks' matrices (85M of the 124M parameters) with torch's Muon, one
# fp32 buffer each instead of AdamW's two (estimate_memory.py --optim=muon shows the saving), at
# muon_learning_rate=0.02, and the rest with AdamW as above. The speedrun reports reaching a given loss in markedly
# fewer tokens with it, so a shorter --max_iters may do.
optim = 'adamw'  # or 'muon'
