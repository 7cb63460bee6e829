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

from training import configurator
from model import GPT2_VOCAB_SIZE
from training.checkpoint import LOAD_CHOICES, load_model
from training.data import get_encoding
from training.device import DTYPES, TORCH_DTYPES, check_device, default_device, default_dtype
from training.errors import fail, install_handler
from training.hf import pretrained_config
from training.hellaswag import cached_val_file, context_limit, evaluate, read_examples, report_cut_contexts

install_handler() # bad input ends the script with one line and exit status 2 (training/errors.py)

# -----------------------------------------------------------------------------
defaults = dict(
    init_from='resume', # the model: resume loads out_dir's checkpoint; or OpenAI's GPT-2, or a Hugging Face folder
    out_dir='out', # ignored if init_from is not 'resume'
    data_path='', # a HellaSwag jsonl file; '' = data/hellaswag/hellaswag_val.jsonl, downloaded the first time
    max_examples=0, # score only the first max_examples examples; 0 = all
    batch_size=16, # examples a forward pass, 4 rows each
    device=default_device(), # examples: 'cpu', 'cuda', 'cuda:0', 'cuda:1', etc. (the GPU if there is one)
    dtype=default_dtype(default_device()), # autocast's, as train.py's default (float32 off CUDA)
    compile=False, # use PyTorch 2.0 to compile the model to be faster
)
config = configurator.load_config(configurator.read_keys(__file__, 'defaults'), sys.argv[1:],
                                  {'init_from': LOAD_CHOICES, 'dtype': DTYPES})
device_type = check_device(config['device'], config['dtype'])
globals().update(config)
if max_examples < 0:
    fail(f'max_examples must be 0 (all) or positive, got {max_examples}')
if batch_size < 1:
    fail(f'batch_size must be at least 1, got {batch_size}')
if init_from != 'resume':
    pretrained_config(init_from) # an unknown name or a folder that is not a GPT-2: one line, before the data
# -----------------------------------------------------------------------------

# the data first: its errors show before any weights are loaded
offline_fix = 'offline, pass --data_path=PATH to a copy of hellaswag_val.jsonl'
examples = read_examples(data_path or cached_val_file(offline_fix=offline_fix), max_examples)

ptdtype = TORCH_DTYPES[dtype]
ctx = nullcontext() if dtype == 'float32' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

# model: from a checkpoint in out_dir, or OpenAI's GPT-2 weights, as sample.py loads them
model, _ = load_model(init_from, out_dir, device)
if model.config.vocab_size < GPT2_VOCAB_SIZE:
    fail(f"the model's vocab_size is {model.config.vocab_size}: HellaSwag is scored with GPT-2's BPE "
         f"({GPT2_VOCAB_SIZE} tokens), so it needs a model trained on GPT-2 tokens, not on characters")
if compile:
    model = torch.compile(model) # requires PyTorch 2.0 (optional)

enc = get_encoding('gpt2')
report_cut_contexts(examples, enc, context_limit(model))
result = evaluate(model, examples, enc, device, ctx, batch_size, progress=True)
n = result['n']
print(f"hellaswag: {n} examples, acc {result['acc']:.4f} ({result['correct']}/{n}), "
      f"acc_norm {result['acc_norm']:.4f} ({result['correct_norm']}/{n})")
