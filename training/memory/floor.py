"""The least memory a run can take, from its sizes alone, against what the machine has: train.py and sample.py check it
before they allocate anything, so a size that cannot fit (a typo'd batch_size, a 100,000-layer model, ten billion new
tokens) stops with one line instead of growing into the out-of-memory killer. A floor, not an estimate: it counts only
what certainly exists, so it refuses nothing that could run (estimate_memory.py gives the estimate)."""
import os

import torch

from training.device import TORCH_DTYPES
from training.errors import ConfigError

GIB = 2 ** 30


def machine_bytes(device):
    """(bytes, what they are) of the memory a run on `device` has: the GPU's, or the machine's RAM off CUDA."""
    if torch.device(device).type == 'cuda':
        return torch.cuda.get_device_properties(device).total_memory, f'the {torch.cuda.get_device_name(device)}'
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'), "this machine's RAM"


def training_floor(config, model_args):
    """{part: bytes} that training config's model certainly holds: its weights and their gradients (the token
    embedding, and each block's 12 * n_embd**2 matrix weights, whatever the options), and each block's input kept for
    backward (activation checkpointing keeps those too), in autocast's dtype. gpt2026.py's model_args have neither
    n_layer nor block_size: its layers are config's n_layer, its rows config's block_size."""
    d = model_args['n_embd']
    layers = model_args['n_layer'] if 'n_layer' in model_args else config['n_layer']
    weight_bytes = TORCH_DTYPES[config['weight_dtype']].itemsize
    activation_bytes = 4 if config['dtype'] == 'float32' else 2
    params = model_args['vocab_size'] * d + layers * 12 * d * d
    tokens = config['batch_size'] * (model_args['block_size'] if 'block_size' in model_args else config['block_size'])
    return {'weights and gradients': 2 * weight_bytes * params, 'block inputs': layers * tokens * d * activation_bytes}


def check_floor(parts, device, fixes):
    """ConfigError, one line naming the floor, its parts and `fixes`, where parts ({what: bytes}) exceed the
    memory of `device`."""
    available, what = machine_bytes(device)
    needed = sum(parts.values())
    if needed > available:
        named = ', '.join(f'{name} {size / GIB:,.1f}' for name, size in parts.items())
        raise ConfigError(f'this run needs at least {needed / GIB:,.1f} GiB ({named}), more than {what} '
                          f'({available / GIB:,.1f} GiB): {fixes}')
