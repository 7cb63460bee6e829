# the miniature character-level shakespeare model (nanoGPT's baby GPT, config/train_shakespeare_char.py) on a
# 12 GB card. Prepare the data first: python prepare/shakespeare_char.py
# $ python train.py config/train_shakespeare_char_12gb.py
# Memory, roughly: 10.7M params * 16 bytes (weights, grads, AdamW state) ~0.2 GB, activations at 64 x 256 ~1.5 GB,
# so ~2 GB in all: it fits easily. A bigger model would fit too, but on 1M characters it mostly overfits sooner.

out_dir = 'out-shakespeare-char'
eval_interval = 250  # keep frequent because we'll overfit
eval_iters = 200
log_interval = 10

# we expect to overfit on this small dataset, so only save when val improves
always_save_checkpoint = False

wandb_log = False
wandb_project = 'shakespeare-char'
wandb_run_name = 'mini-gpt'

dataset = 'shakespeare_char'
gradient_accumulation_steps = 1
batch_size = 64
block_size = 256  # context of up to 256 previous characters

# baby GPT model :)
n_layer = 6
n_head = 6
n_embd = 384
dropout = 0.2

learning_rate = 1e-3  # with baby networks can afford to go a bit higher
max_iters = 5000
lr_decay_iters = 5000  # make equal to max_iters usually
min_lr = 1e-4  # learning_rate / 10 usually
beta2 = 0.99  # make a bit bigger because number of tokens per iter is small
warmup_iters = 100

# torch.compile: faster steps and a little less activation memory, for a minute of compiling and some host RAM;
# needs Triton (not on native Windows): set False there, memory is no concern at this size either way.
compile = True
