"""
Score a model on HellaSwag's validation set (10,042 examples): acc and acc_norm, defined in training/hellaswag.py.
$ python hellaswag.py --out_dir=out                      # the checkpoint in out/ckpt.pt
$ python hellaswag.py --init_from=gpt2 --dtype=float32    # OpenAI's GPT-2 124M
$ python hellaswag.py --init_from=gpt2 --max_examples=500 # a quick look

The data is downloaded once to data/hellaswag/hellaswag_val.jsonl; offline, --data_path=PATH reads a copy of it.
The text is tokenized with GPT-2's BPE (tiktoken), so the model must have been trained on it.
"""
import sys
from contextlib import nullcontext

import torch

import configurator
from configurator import ConfigError, fail
from checkpoint import CheckpointError, first_line, load_checkpoint, load_model_state
from model import GPTConfig, GPT
from prepare.common import PrepareError, get_encoding
from training.hellaswag import HellaSwagError, cached_val_file, evaluate, read_examples

GPT2_VOCAB_SIZE = 50257

# -----------------------------------------------------------------------------
system = configurator.train_defaults() # device and dtype default as in train.py: the GPU if there is one
defaults = dict(
    init_from='resume', # either 'resume' (from an out_dir) or a gpt2 variant (e.g. 'gpt2-xl')
    out_dir='out', # ignored if init_from is not 'resume'
    data_path='', # a HellaSwag jsonl file; '' = data/hellaswag/hellaswag_val.jsonl, downloaded the first time
    max_examples=0, # score only the first max_examples examples; 0 = all
    batch_size=16, # examples a forward pass, 4 rows each
    device=system['device'], # examples: 'cpu', 'cuda', 'cuda:0', 'cuda:1', etc.
    dtype=system['dtype'], # 'float32' or 'bfloat16' or 'float16'
    compile=False, # use PyTorch 2.0 to compile the model to be faster
)
try:
    config = configurator.load_config(defaults, sys.argv[1:])
    device_type = configurator.check_device(config['device'], config['dtype'])
except ConfigError as e:
    fail(e)
globals().update(config)
if max_examples < 0:
    fail(f'max_examples must be 0 (all) or positive, got {max_examples}')
if batch_size < 1:
    fail(f'batch_size must be at least 1, got {batch_size}')
if init_from != 'resume' and init_from not in GPT.PRETRAINED_ARGS:
    fail(f"unknown init_from {init_from!r}: use 'resume' or one of {', '.join(GPT.PRETRAINED_ARGS)}")
# -----------------------------------------------------------------------------

# the data first: its errors show before any weights are loaded
try:
    examples = read_examples(data_path or cached_val_file(), max_examples)
except HellaSwagError as e:
    fail(e)

ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# model, loaded as sample.py does
if init_from == 'resume':
    try:
        checkpoint = load_checkpoint(out_dir, device)
        model = GPT(GPTConfig(**checkpoint['model_args']))
        load_model_state(model, checkpoint, out_dir)
    except CheckpointError as e:
        fail(e)
    checkpoint = None # free up memory
else:
    try:
        model = GPT.from_pretrained(init_from, dict(dropout=0.0))
    except Exception as e: # no transformers, no network, no cached weights: the fixes are the same
        fail(f'could not load the {init_from} weights ({first_line(e)}): pip install transformers, and download '
             f'them once with network access (Hugging Face cache)')
if model.config.vocab_size < GPT2_VOCAB_SIZE:
    fail(f"the model's vocab_size is {model.config.vocab_size}: HellaSwag is scored with GPT-2's BPE "
         f"({GPT2_VOCAB_SIZE} tokens), so it needs a model trained on GPT-2 tokens, not on characters")
model.to(device)
if compile:
    model = torch.compile(model) # requires PyTorch 2.0 (optional)

try:
    enc = get_encoding('gpt2')
except PrepareError as e:
    fail(e)

try:
    result = evaluate(model, examples, enc, device, ctx, batch_size, progress=True)
except HellaSwagError as e:
    fail(e)
n = result['n']
print(f"hellaswag: {n} examples, acc {result['acc']:.4f} ({result['correct']}/{n}), "
      f"acc_norm {result['acc_norm']:.4f} ({result['correct_norm']}/{n})")
