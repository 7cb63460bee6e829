# finetune GPT-2 large (774M), every parameter, on Tiny Shakespeare (BPE) on one 8 GB card: the recipe of
# config/finetune_shakespeare.py (32 micro-batches of 1 x 1024 tokens, clipping at 1.0), with the levers that fit it.
# Prepare the data first: python prepare/shakespeare.py; the 8-bit AdamW needs torchao: pip install torchao
# $ python estimate_memory.py config/finetune_gpt2large_8gb.py --gpu_memory_gb=8
# $ python train.py config/finetune_gpt2large_8gb.py
# bf16 weights and gradients with no fp32 copy, each update rounded stochastically (2 + 2 bytes a parameter instead
# of 4 + 4), torchao's 8-bit moments (~2 bytes instead of 8), each block recomputed in backward. bf16 needs an Ampere
# or later GPU.
import time

out_dir = 'out-shakespeare-large'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-large-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-large'

# only save checkpoints if the validation loss improves (ckpt.pt holds bf16 weights and the 8-bit AdamW state)
always_save_checkpoint = False

# 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter; shakespeare has 301,966 tokens: an epoch ~9 iters
batch_size = 1
block_size = 1024
gradient_accumulation_steps = 32
max_iters = 20

dtype = 'bfloat16'
weight_dtype = 'bfloat16'
optim = 'adamw_8bit'
activation_checkpointing = True
loss_chunk_mib = 128  # a tight card: the loss in chunks of ~384 of GPT-2's rows, not 1 GiB's

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
