"""
Sample from a trained model, as nanoGPT's sample.py:
$ python sample.py --out_dir=out-shakespeare-char
$ python sample.py --init_from=gpt2-xl --start="What is the answer to life?" --num_samples=5

A checkpoint's tokens are decoded with the meta.pkl of the dataset it was trained on (data_dir/dataset from its
config), and with GPT-2's BPE (tiktoken) when there is none. `--start=FILE:prompt.txt` reads the prompt from a file.
"""
import sys
import time
from contextlib import nullcontext

import torch

from training import configurator
from training.checkpoint import LOAD_CHOICES, load_model
from training.data import get_encoding
from training.device import DTYPES, TORCH_DTYPES, check_device, default_device, default_dtype
from training.memory.floor import check_floor
from training.errors import fail, first_line, install_handler
from training.meta import characters, trained_meta_path

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)

# -----------------------------------------------------------------------------
defaults = dict(
    init_from='resume', # the model: resume loads out_dir's checkpoint; or OpenAI's GPT-2, or a Hugging Face folder
    out_dir='out', # ignored if init_from is not 'resume'
    start="\n", # or "<|endoftext|>" or etc. Can also specify a file, use as: "FILE:prompt.txt"
    num_samples=10, # number of samples to draw
    max_new_tokens=500, # number of tokens generated in each sample
    temperature=0.8, # 1.0 = no change, < 1.0 = less random, > 1.0 = more random, in predictions
    top_k=200, # retain only the top_k most likely tokens, clamp others to have 0 probability
    seed=1337, # seeds torch's sampler: the same seed and prompt give the same samples
    device=default_device(), # examples: 'cpu', 'cuda', 'cuda:0', 'cuda:1', etc. (the GPU if there is one)
    dtype=default_dtype(default_device()), # autocast's, as train.py's default (float32 off CUDA)
    compile=False, # use PyTorch 2.0 to compile the model to be faster
)
config = configurator.load_config(configurator.read_keys(__file__, 'defaults'), sys.argv[1:],
                                  {'init_from': LOAD_CHOICES, 'dtype': DTYPES})
device_type = check_device(config['device'], config['dtype'])
globals().update(config)
if temperature <= 0:
    fail(f'temperature must be positive, got {temperature}: lower values sample more greedily')
if top_k < 1:
    fail(f'top_k must be at least 1, got {top_k}')
if num_samples < 1 or max_new_tokens < 1:
    key, value = ('num_samples', num_samples) if num_samples < 1 else ('max_new_tokens', max_new_tokens)
    fail(f'{key} must be at least 1, got {value}: e.g. --{key}={defaults[key]}')
# each sample's tokens, int64 on the device, before anything is loaded: ten billion of them cannot fit
check_floor({"a sample's tokens": 8 * max_new_tokens}, device, f'lower max_new_tokens ({max_new_tokens})')
# -----------------------------------------------------------------------------

torch.manual_seed(seed)
torch.cuda.manual_seed(seed)
ptdtype = TORCH_DTYPES[dtype]
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# model: from a checkpoint in out_dir, or OpenAI's GPT-2 weights
model, train_config = load_model(init_from, out_dir, device)
if compile:
    model = torch.compile(model) # requires PyTorch 2.0 (optional)

# the dataset's characters (its meta.pkl), or GPT-2's tokens
meta_path = trained_meta_path(train_config)
vocabulary = characters(meta_path, model.config.vocab_size)
if vocabulary is not None:
    print(f"Loading meta from {meta_path}...")
    stoi, itos = vocabulary

    def encode(s):
        unknown = sorted(set(s) - set(stoi))
        if unknown:
            fail(f"start has characters that {meta_path} does not know: {''.join(unknown)!r}")
        return [stoi[c] for c in s]

    def decode(ids):
        return ''.join([itos[i] for i in ids])
else:
    # ok let's assume gpt-2 encodings by default
    print("No meta.pkl found, assuming GPT-2 encodings...")
    enc = get_encoding('gpt2')
    encode = lambda s: enc.encode(s, allowed_special={"<|endoftext|>"})
    decode = lambda l: enc.decode(l)

# encode the beginning of the prompt
if start.startswith('FILE:'):
    try:
        with open(start[5:], 'r', encoding='utf-8') as f:
            start = f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f'cannot read the start file {start[5:]} ({first_line(e)})')
start_ids = encode(start)
if not start_ids:
    fail('start is empty: give at least one character (the default is a newline)')
x = (torch.tensor(start_ids, dtype=torch.long, device=device)[None, ...])

# run generation
generation_s = 0.0
with torch.no_grad():
    with ctx:
        for k in range(num_samples):
            t0 = time.perf_counter()
            y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k)
            y = y[0].tolist() # waits for the GPU to finish the sample
            generation_s += time.perf_counter() - t0
            print(decode(y))
            print('---------------')
new_tokens = num_samples * max_new_tokens
print(f'{new_tokens} tokens in {generation_s:.2f}s: {new_tokens / generation_s:.1f} tokens/s')
