# finetune GPT-2 XL (1.5B) on Tiny Shakespeare (BPE) on one 24 GB card: config/finetune_shakespeare.py, which runs out
# of memory there, with two memory levers; same recipe (32 micro-batches of 1 x 1024 tokens, clipping at 1.0).
# Prepare the data first: python prepare/shakespeare.py; the 8-bit AdamW needs torchao: pip install torchao
# $ python estimate_memory.py config/finetune_shakespeare_24gb.py --gpu_memory_gb=24  # README: per card
# $ python train.py config/finetune_shakespeare_24gb.py
# fp32 weights, gradients and AdamW's two fp32 moments take 16 bytes a parameter: 23.2 GiB for gpt2-xl, more than the
# card before any activation. torchao's 8-bit AdamW keeps the moments in ~2 bytes a parameter (11.6 GiB -> 3.4 GiB;
# the (50257, 1600) embedding's moments stay fp32, as torchao quantizes only tensors divisible into blocks of 256).
# For more headroom: --optimizer_in_backward=True --grad_clip=0.0 --gradient_accumulation_steps=1 --compile=False
# frees each gradient as soon as its parameter is updated (5.8 GiB less; no accumulation or clipping).
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-xl'  # this is the largest GPT-2 model

# only save checkpoints if the validation loss improves (ckpt.pt holds the weights and the 8-bit AdamW state: ~10 GB)
always_save_checkpoint = False

# the number of examples per iter:
# 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter
# shakespeare has 301,966 tokens, so 1 epoch ~= 9.2 iters
batch_size = 1
block_size = 1024  # GPT-2's full context
gradient_accumulation_steps = 32
max_iters = 20

# the AdamW moments in 8 bits (torchao), block-wise scaled: 3.4 GiB instead of 11.6 GiB
optim = 'adamw_8bit'

# recompute each block in backward instead of keeping its activations: most of the activation memory, for one more
# forward of each block
activation_checkpointing = True

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
