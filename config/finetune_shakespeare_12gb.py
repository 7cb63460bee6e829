# finetune GPT-2 on Tiny Shakespeare (BPE) on one 12 GB card: config/finetune_shakespeare.py with gpt2-medium.
# Prepare the data first: python prepare/shakespeare.py
# $ python train.py config/finetune_shakespeare_12gb.py
# gpt2-medium (~355M params) is the largest GPT-2 that fits 12 GB with standard AdamW: fp32 weights, grads and the
# two AdamW moments take 16 bytes per parameter, ~5.7 GB here, while gpt2-large (774M) would need ~12.4 GB for them
# alone. A later change may move this preset to gpt2-large with low-memory optimizer levers.
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-medium'

# only save checkpoints if the validation loss improves (ckpt.pt holds the AdamW state too: ~4 GB on disk)
always_save_checkpoint = False

# the number of examples per iter:
# 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter
# shakespeare has 301,966 tokens, so 1 epoch ~= 9.2 iters
batch_size = 1
block_size = 1024  # GPT-2's full context
gradient_accumulation_steps = 32
max_iters = 20

# recompute each block in backward instead of keeping its activations: at batch 1 this saves most of the ~1 GB of
# activations for ~30% more compute, keeping the peak around 6-7 GB, well clear of 12 GB
activation_checkpointing = True

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
