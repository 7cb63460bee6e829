"""The learning rate schedule, nanoGPT's: linear warmup, cosine decay, then a floor."""
import math


def cosine_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """The learning rate of iteration `it`: linear warmup over warmup_iters, cosine decay to min_lr at lr_decay_iters,
    min_lr after. The same values as nanoGPT's get_lr, also where warmup_iters >= lr_decay_iters, which nanoGPT
    divides by zero at."""
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) from lr_decay_iters on, min learning rate
    if it >= lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio)) # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)
