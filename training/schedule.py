"""The learning rate schedules: nanoGPT's (linear warmup, cosine decay, then a floor), and warmup-stable-decay; the
sliding window's warmup."""
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


def wsd_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters, cooldown_frac):
    """Warmup-stable-decay (lr_schedule='wsd'): cosine_lr's linear warmup, then learning_rate until the last
    cooldown_frac of lr_decay_iters, then a linear decay that reaches min_lr at lr_decay_iters, min_lr after.
    modded-nanogpt's and nanochat's schedule (they decay over the last 0.4 and 0.2 of training): the stable phase
    needs no length fixed in advance, and the short decay gives most of the loss a cosine's long one does."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    decay_start = max(warmup_iters, lr_decay_iters - cooldown_frac * lr_decay_iters)
    if it < decay_start:
        return learning_rate
    remaining = (lr_decay_iters - it) / (lr_decay_iters - decay_start)  # 1 at decay_start, to 0 at lr_decay_iters
    return min_lr + remaining * (learning_rate - min_lr)


def scheduled_lr(it, config):
    """The learning rate of iteration `it` under config's lr_schedule ('cosine' or 'wsd'), before decay_lr is asked."""
    if config['lr_schedule'] == 'wsd':
        return wsd_lr(it, config['learning_rate'], config['min_lr'], config['warmup_iters'], config['lr_decay_iters'],
                      config['cooldown_frac'])
    return cosine_lr(it, config['learning_rate'], config['min_lr'], config['warmup_iters'], config['lr_decay_iters'])


def scheduled_window(it, config):
    """attn_window_at of iteration `it` under train.py's keys in `config`."""
    return attn_window_at(it, config['attn_window'], config['attn_window_warmup_start'],
                          config['attn_window_warmup_iters'], config['attn_window_warmup_end'])


def attn_window_at(it, attn_window, start, warmup_iters, end=0):
    """The sliding window of iteration `it` under a window warmup (train.py's attn_window_warmup_iters > 0): `start`
    positions at the first iteration, growing linearly to `end` (0: attn_window) at warmup_iters, in whole multiples
    of `start`, at most attn_window; attn_window from then on. modded-nanogpt's record of 24 Nov 2024 grew its window
    from 64 to 1,792 over the whole run: early in training short context serves as well, and costs less; the one of
    4 Jan 2025 from 128 towards 1,856, which reaches 1,792 at 96% of the run."""
    if it >= warmup_iters:
        return attn_window
    grown = start + it / warmup_iters * ((end or attn_window) - start)
    return min(attn_window, start * int(grown // start))
