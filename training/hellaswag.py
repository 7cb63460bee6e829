"""HellaSwag (Zellers et al. 2019) for base models: the validation set, read with one-line errors, and its scoring
as llm.c's "completion style" (docs/hellaswag.md): acc by each ending's summed loss, acc_norm by its mean loss a token.
The losses come from chunked_cross_entropy over the endings' rows: a forward's memory, never the full logits.
"""
import json
import math
import os
from contextlib import nullcontext

import torch
from tqdm import tqdm

from training.data import download
from training.errors import ConfigError

DATA_URL = 'https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl'
DATA_DIR = os.path.join('data', 'hellaswag')  # relative to the current directory, as every data path
NUM_ENDINGS = 4


class HellaSwagError(ConfigError):
    """A data problem the user can fix; str(e) is the one-line message."""


def cached_val_file(data_dir=DATA_DIR, url=DATA_URL, offline_fix=None):
    """data_dir/hellaswag_val.jsonl, downloaded from `url` the first time (through a temporary file). A failed
    download's error ends with `offline_fix`, what the calling script accepts instead; by default, where to put a
    copy of the file."""
    path = os.path.join(data_dir, os.path.basename(DATA_URL))
    if not os.path.exists(path):
        download(url, path, fix=offline_fix or f'offline, put a copy of {os.path.basename(path)} at {path}')
    return path


def check_example(example, where):
    """`example` (a parsed line) as {ctx, endings, label}, or HellaSwagError naming `where` and the field."""
    if not isinstance(example, dict):
        raise HellaSwagError(f'{where}: expected a JSON object with ctx, endings and label')
    for field in ('ctx', 'endings', 'label'):
        if field not in example:
            raise HellaSwagError(f"{where}: no field '{field}'")
    ctx, endings, label = example['ctx'], example['endings'], example['label']
    if not isinstance(ctx, str) or not ctx:
        raise HellaSwagError(f"{where}: field 'ctx' must be a non-empty string")
    if (not isinstance(endings, list) or len(endings) != NUM_ENDINGS
            or not all(isinstance(ending, str) for ending in endings)):
        raise HellaSwagError(f"{where}: field 'endings' must be a list of {NUM_ENDINGS} strings")
    if type(label) is not int or not 0 <= label < NUM_ENDINGS:
        raise HellaSwagError(f"{where}: field 'label' must be 0, 1, 2 or 3, got {label!r}")
    return dict(ctx=ctx, endings=endings, label=label)


def read_examples(path, max_examples=0):
    """The examples of a HellaSwag jsonl file (one JSON object a line), the first `max_examples` of them (0: all)."""
    examples = []
    try:
        with open(path, encoding='utf-8') as f:
            for line_number, line in enumerate(f, 1):
                if max_examples and len(examples) == max_examples:
                    break
                if not line.strip():
                    continue
                where = f'{path} line {line_number}'
                try:
                    example = json.loads(line)
                except json.JSONDecodeError as e:
                    raise HellaSwagError(f'{where}: not valid JSON ({e})') from None
                examples.append(check_example(example, where))
    except (OSError, UnicodeDecodeError) as e:
        raise HellaSwagError(f'cannot read {path} ({e})') from None
    if not examples:
        raise HellaSwagError(f'{path} has no examples')
    return examples


def context_limit(model):
    """The rows `model` reads at most: model.py's GPT its block_size; None for gpt2026.py's GPT2026, which has none
    (its windows bound what a position sees), so no context is cut."""
    return getattr(model.config, 'block_size', None)


def render(example, enc, block_size):
    """(context tokens, [tokens of each ending]). When context and ending exceed the model's block_size + 1 tokens
    (the last token is only a target), the context loses its oldest tokens, the same for every ending (None: no
    limit)."""
    return fit(*encode(example, enc), block_size)


def encode(example, enc):
    """(context tokens, [tokens of each ending]), whole."""
    return enc.encode(example['ctx']), [enc.encode(' ' + ending) for ending in example['endings']]


def fit(ctx_tokens, ending_tokens, block_size):
    """render's cut: the context's newest tokens that fit before the longest ending in block_size + 1 tokens."""
    if block_size is None:
        return ctx_tokens, ending_tokens
    room = block_size + 1 - max(len(tokens) for tokens in ending_tokens)
    if room < 1:
        raise HellaSwagError(f"a HellaSwag ending of {block_size + 1 - room} tokens leaves no room for its context in "
                             f"the model's block_size of {block_size}: HellaSwag scores models of a larger block_size "
                             f"(train one with a larger --block_size, or --hellaswag=False)")
    return ctx_tokens[-room:], ending_tokens


def report_cut_contexts(examples, enc, block_size):
    """Print, when render cuts any of `examples` to fit block_size, how many: a score on cut contexts is not
    comparable with one on whole contexts (GPT-2's reference scores). Once a run, before the first evaluation; with
    no block_size (None), none is cut."""
    cut = 0
    for example in examples:
        ctx_tokens, ending_tokens = encode(example, enc)
        cut += len(fit(ctx_tokens, ending_tokens, block_size)[0]) < len(ctx_tokens)
    if cut:
        print(f'hellaswag: {cut:,} of the {len(examples):,} examples are longer than block_size={block_size}: '
              f'their contexts lose their oldest tokens, so the scores are not those of whole contexts')


def make_batch(rendered, device):
    """Inputs and targets, (examples * 4, T), for rendered examples: row 4*i + j is context i + ending j, padded on
    the right (causal attention: padding changes nothing before it). Targets are -1 except on the ending tokens."""
    rows = [(ctx, ending) for ctx, endings in rendered for ending in endings]
    T = max(len(ctx) + len(ending) for ctx, ending in rows) - 1
    idx = torch.zeros((len(rows), T), dtype=torch.long)
    targets = torch.full((len(rows), T), -1, dtype=torch.long)
    for r, (ctx, ending) in enumerate(rows):
        tokens = ctx + ending
        idx[r, :len(tokens) - 1] = torch.tensor(tokens[:-1])
        targets[r, len(ctx) - 1:len(tokens) - 1] = torch.tensor(ending)  # position t predicts token t + 1
    return idx.to(device), targets.to(device)


@torch.no_grad()
def ending_losses(model, rendered, device, ctx=nullcontext()):
    """(summed loss, number of tokens) of each ending given its context, both (examples, 4)."""
    idx, targets = make_batch(rendered, device)
    with ctx:
        _, losses = model(idx, targets, reduction='none')  # (rows, T), 0 off the endings
    shape = (len(rendered), NUM_ENDINGS)
    return losses.sum(1).view(shape), (targets != -1).sum(1).view(shape)


def rank_share(examples, rank, world_size):
    """This rank's examples (every world_size-th from `rank`) and how many of them count: shares that are one short
    are topped up with an uncounted example, so every rank makes the same forward passes (FSDP's forward needs all)."""
    share = examples[rank::world_size]
    counted = len(share)
    share += examples[:1] * (math.ceil(len(examples) / world_size) - counted)
    return share, counted


@torch.no_grad()
def evaluate(model, examples, enc, device, ctx=nullcontext(), batch_size=8, rank=0, world_size=1, progress=False):
    """HellaSwag accuracies of `model` (the raw GPT or its compiled wrapper, never DDP's) on this rank's share of
    `examples`: dict(acc, acc_norm, n, correct, correct_norm); over ranks, all-reduce the counts and divide."""
    share, counted = rank_share(examples, rank, world_size)
    rendered = [render(example, enc, context_limit(model)) for example in share]  # its errors come before eval()
    was_training = model.training
    model.eval()
    correct = correct_norm = 0
    with tqdm(total=counted, unit='example', desc='hellaswag', disable=not progress) as bar:
        for start in range(0, len(share), batch_size):
            sum_loss, n_tokens = ending_losses(model, rendered[start:start + batch_size], device, ctx)
            k = max(0, min(batch_size, counted - start))  # the top-up example, last in the share, does not count
            labels = torch.tensor([example['label'] for example in share[start:start + k]], device=sum_loss.device)
            correct += (sum_loss[:k].argmin(1) == labels).sum().item()
            correct_norm += ((sum_loss[:k] / n_tokens[:k]).argmin(1) == labels).sum().item()
            bar.update(k)
    model.train(was_training)
    return dict(acc=correct / max(counted, 1), acc_norm=correct_norm / max(counted, 1), n=counted,
                correct=correct, correct_norm=correct_norm)
