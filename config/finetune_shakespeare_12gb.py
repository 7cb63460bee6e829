# finetune GPT-2 large (774M) on Tiny Shakespeare (BPE) on one 12 GB card: config/finetune_shakespeare.py's recipe
# (32 micro-batches of 1 x 1024 tokens, clipping at 1.0) with gpt2-large and two memory levers.
# Prepare the data first: python prepare/shakespeare.py; the 8-bit AdamW needs torchao: pip install torchao
# $ python estimate_memory.py config/finetune_shakespeare_12gb.py --gpu_memory_gb=12  # README: per card
# $ python train.py config/finetune_shakespeare_12gb.py
# Finetuning memory is the weights' training state: fp32 weights, gradients and AdamW's two fp32 moments take 16 bytes
# a parameter, 11.5 GiB for gpt2-large before any activation. torchao's 8-bit AdamW keeps the moments in ~2 bytes a
# parameter (5.8 GiB -> 1.5 GiB), which is what makes it fit.
# Without torchao, or for more headroom: --optim=adamw_bf16 --optimizer_in_backward=True --grad_clip=0.0
# --gradient_accumulation_steps=1 --compile=False (bf16 moments, each gradient freed as soon as its parameter is
# updated; no accumulation or clipping, 1,024 tokens per step).
import time

out_dir = 'out-shakespeare'
eval_interval = 5
eval_iters = 40
wandb_log = False  # feel free to turn on
wandb_project = 'shakespeare'
wandb_run_name = 'ft-' + str(time.time())

dataset = 'shakespeare'
init_from = 'gpt2-large'

# only save checkpoints if the validation loss improves (ckpt.pt holds the weights and the 8-bit AdamW state: ~4.7 GB)
always_save_checkpoint = False

# the number of examples per iter:
# 1 batch_size * 32 grad_accum * 1024 tokens = 32,768 tokens/iter
# shakespeare has 301,966 tokens, so 1 epoch ~= 9.2 iters
batch_size = 1
block_size = 1024  # GPT-2's full context
gradient_accumulation_steps = 32
max_iters = 20

# the AdamW moments in 8 bits (torchao), block-wise scaled: 1.5 GiB instead of 5.8 GiB
optim = 'adamw_8bit'

# recompute each block in backward instead of keeping its activations: at batch 1 this saves most of the activation
# memory for one more forward of each block
activation_checkpointing = True

# finetune at constant LR
learning_rate = 3e-5
decay_lr = False
