# finetune GPT-2 XL (1.5B), every parameter, on Tiny Shakespeare (BPE) on one 8 GB card: config/finetune_gpt2xl_12gb.py
# with each gradient freed as soon as its parameter is updated, which rules out accumulation and clipping, so a step
# is one micro-batch of 1 x 1024 tokens (32 times fewer tokens a step than the 12 GB preset: a lower learning rate).
# Prepare the data first: python prepare/shakespeare.py; the 8-bit AdamW needs torchao: pip install torchao
# $ python estimate_memory.py config/finetune_gpt2xl_8gb.py --gpu_memory_gb=8
# $ python train.py config/finetune_gpt2xl_8gb.py
# bf16 weights (no fp32 copy, updates rounded stochastically), torchao's 8-bit moments, no gradients of the whole model
# at once, each block recomputed in backward: close to the card's memory (docs/memory.md: the largest GPT-2 per
# card), so close the desktop's other GPU users first. bf16 needs an Ampere or later GPU.
import time

out_dir = 'out-shakespeare-xl'
eval_interval = 100
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-xl-8gb-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-xl'

always_save_checkpoint = False

# one micro-batch a step: 1,024 tokens; shakespeare has 301,966 tokens: an epoch ~295 iters
batch_size = 1
block_size = 1024
gradient_accumulation_steps = 1
max_iters = 600

dtype = 'bfloat16'
weight_dtype = 'bfloat16'
optim = 'adamw_8bit'
optimizer_in_backward = True  # each parameter updated, and its gradient freed, as backward produces it
grad_clip = 0.0  # no global norm exists until every gradient does: clipping is off with the step in backward
compile = False  # a compiled backward returns its gradients together, which would take back the saving
activation_checkpointing = True
loss_chunk_mib = 128  # a tight card: the loss in chunks of ~384 of GPT-2's rows, not 1 GiB's
# so close to the card's memory that the estimate leaves 0.1 GiB to other programs, not the default 0.5: run it with
# nothing else on the GPU (the desktop on the integrated graphics, or none)
gpu_headroom_gb = 0.1

# finetune at constant LR, lower than the 12 GB preset's for steps of 1/32 the tokens
learning_rate = 1e-5
decay_lr = False
