"""OpenWebText (or any Hugging Face or local text dataset) in GPT-2 BPE, as nanoGPT's data/openwebtext/prepare.py:
a shuffled train/val split of the documents, each encoded with encode_ordinary plus the end-of-text token, written
to uint16 train.bin/val.bin in data/openwebtext/.

Full OpenWebText needs ~54 GB in the Hugging Face cache and gives ~9B train tokens (train.bin ~17 GB). RAM stays
bounded: tokenized documents live in the datasets cache on disk and are copied into the .bin memmap shard by shard.
For a small start, take part of a split (--split 'train[:1%]') or local files (--dataset json --data_files a.jsonl).
"""
import argparse
import os
import sys

import datasets
import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from any directory
from prepare import common

# nanoGPT loads 'openwebtext', a script dataset, which datasets>=4 refuses to run; this is the same corpus as parquet
DEFAULT_DATASET = 'Skylion007/openwebtext'
SPLIT_SEED = 2357  # nanoGPT's, so the same documents land in val
WRITE_SHARDS = 1024  # nanoGPT's: each shard's ids are gathered in RAM, then copied into the memmap


def default_num_proc():
    """About half the cores, at least 1: tokenizing is CPU-bound, the rest of the machine stays usable."""
    return max(1, (os.cpu_count() or 1) // 2)


def check_test_size(test_size):
    if not 0 < test_size < 1:
        raise common.PrepareError(f'--test_size {test_size} must be a fraction between 0 and 1 (nanoGPT: 0.0005)')


def describe(dataset, name, split):
    """How errors name the input, e.g. "dataset 'HuggingFaceFW/fineweb-edu' config 'sample-10BT' split 'train'"."""
    config = f' config {name!r}' if name else ''
    return f'dataset {dataset!r}{config} split {split!r}'


def load_documents(dataset, name, split, **kwargs):
    """datasets.load_dataset with one-line errors; kwargs go to it (data_files, cache_dir, num_proc, streaming)."""
    try:
        return datasets.load_dataset(dataset, name, split=split, **kwargs)
    except StopIteration:  # datasets' json reader finds no first record to read the columns from
        raise common.PrepareError(f'{describe(dataset, name, split)} has no documents; '
                                  f'pass files that hold some with --data_files PATH') from None
    except Exception as e:  # hub, network, file and format errors all mean this dataset cannot be read as given
        raise common.PrepareError(f'could not load {describe(dataset, name, split)} ({common.one_line(e)}); '
                                  f'to use local files pass --dataset text|json|parquet --data_files PATH') from None


def load_splits(dataset, data_files=None, split='train', test_size=0.0005, num_proc=1, cache_dir=None, name=None):
    """Load `split` of `dataset` and divide its documents into shuffled 'train' and 'val' (a DatasetDict)."""
    check_test_size(test_size)
    documents = load_documents(dataset, name, split, data_files=data_files, num_proc=num_proc, cache_dir=cache_dir)
    if len(documents) < 2:
        raise common.PrepareError(f'{describe(dataset, name, split)} has {len(documents)} document(s); '
                                  f'train and val need at least 2')
    splits = documents.train_test_split(test_size=test_size, seed=SPLIT_SEED, shuffle=True)
    splits['val'] = splits.pop('test')
    return splits


def encode_document(example, enc, text_column):
    """One document's ids followed by end-of-text, which marks document boundaries in the token stream."""
    ids = enc.encode_ordinary(example[text_column])
    ids.append(enc.eot_token)
    return {'ids': ids, 'len': len(ids)}


def write_tokens(tokenized, path, desc):
    """Copy the documents' ids into a uint16 memmap at `path`, shard by shard; return the number of tokens."""
    total = int(np.sum(tokenized.with_format('numpy')['len'][:], dtype=np.uint64))
    arr = np.memmap(path, dtype=np.uint16, mode='w+', shape=(total,))
    num_shards = min(WRITE_SHARDS, len(tokenized))  # an empty shard would have nothing to concatenate
    idx = 0
    for shard_index in tqdm(range(num_shards), desc=desc):
        shard = tokenized.shard(num_shards=num_shards, index=shard_index, contiguous=True).with_format('numpy')
        ids = np.concatenate(shard['ids'][:])
        arr[idx:idx + len(ids)] = ids
        idx += len(ids)
    arr.flush()
    return total


def prepare(splits, out_dir, enc, text_column='text', num_proc=1):
    """Tokenize the 'train' and 'val' splits with the tiktoken Encoding `enc` and write <split>.bin to `out_dir`."""
    common.check_fits_uint16(enc.n_vocab, f'encoding {enc.name!r}')
    if '<|endoftext|>' not in enc.special_tokens_set:
        raise common.PrepareError(f'encoding {enc.name!r} has no <|endoftext|> token to separate documents; '
                                  f'use --encoding gpt2')
    columns = splits['train'].column_names
    if text_column not in columns:
        raise common.PrepareError(f'--text_column {text_column!r} is not in the dataset; '
                                  f'its columns: {", ".join(columns)}')
    tokenized = splits.map(encode_document, fn_kwargs={'enc': enc, 'text_column': text_column},
                           remove_columns=columns, desc='tokenizing the splits', num_proc=num_proc)
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f'{split}.bin') for split in tokenized]
    with common.atomic_files(*paths) as tmps:
        counts = {split: write_tokens(tokenized[split], tmp, f'writing {split}.bin')
                  for split, tmp in zip(tokenized, tmps)}
    for split, count in counts.items():
        print(f'{split} has {count:,} tokens')
    return counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dataset', default=DEFAULT_DATASET,
                        help="Hugging Face dataset, or text/json/parquet/csv with --data_files (default: "
                             "%(default)s, OpenWebText as parquet; nanoGPT's script-based 'openwebtext' does not "
                             "load in datasets>=4)")
    parser.add_argument('--name', help='configuration of --dataset, e.g. sample-10BT of HuggingFaceFW/fineweb-edu')
    parser.add_argument('--data_files', nargs='+', metavar='PATH',
                        help='local files or globs for --dataset text/json/parquet/csv')
    parser.add_argument('--split', default='train', help="split to read, e.g. 'train[:1%%]' (default: %(default)s)")
    parser.add_argument('--text_column', default='text', help='column holding the documents (default: %(default)s)')
    parser.add_argument('--test_size', type=float, default=0.0005,
                        help='fraction of the documents that goes to val.bin (default: %(default)s, as nanoGPT)')
    parser.add_argument('--num_proc', type=int, default=default_num_proc(),
                        help='processes for loading and tokenizing (default: half the cores, %(default)s)')
    parser.add_argument('--cache_dir', help='Hugging Face datasets cache for downloads and tokenized documents '
                                            '(default: HF_DATASETS_CACHE); needs room for the whole corpus')
    common.add_encoding_arg(parser)
    common.add_out_dir_arg(parser, 'openwebtext')
    args = parser.parse_args(argv)
    if args.num_proc < 1:
        raise common.PrepareError(f'--num_proc {args.num_proc} must be at least 1')
    enc = common.get_encoding(args.encoding)
    splits = load_splits(args.dataset, args.data_files, args.split, args.test_size, args.num_proc, args.cache_dir,
                         args.name)
    prepare(splits, args.out_dir, enc, args.text_column, args.num_proc)


if __name__ == '__main__':  # the guard also keeps worker processes (spawned on Windows and macOS) from re-running it
    common.run_main(main)
