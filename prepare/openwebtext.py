"""OpenWebText, FineWeb-Edu or any Hugging Face or local text dataset in GPT-2 BPE, as nanoGPT's
data/openwebtext/prepare.py: each document encoded with encode_ordinary plus the end-of-text token, written to uint16
train.bin/val.bin in data/openwebtext/ (or --out_dir).

Without --max_tokens, as nanoGPT: the whole split is downloaded (OpenWebText: ~54 GB of Hugging Face cache, ~9B
train tokens, train.bin ~17 GB) and its documents shuffled into train and val (--test_size of them, seed 2357).
RAM stays bounded: tokenized documents live in the datasets cache and are copied into the .bin memmap in shards.
For a small start take part of a split (--split 'train[:1%]') or local files (--dataset json --data_files a.jsonl).

With --max_tokens N the dataset is streamed, nothing is downloaded ahead, and only the outputs take disk
(2 bytes a token). Documents are read in stream order, not shuffled. Document 0 and then one in every 1/test_size
(0, 2000, 4000, ... for 0.0005) go to val: of the first n documents read, ceil(n * test_size) are val, the count
train_test_split gives. The others fill train.bin until it holds exactly N tokens: the last train document is cut
there, so train.bin may end without end-of-text, and reading stops; val keeps the documents held out so far (about
N * test_size tokens). If the stream ends first, both files keep what was read and the script says so. Where
nanoGPT's 0.0005 would leave val.bin too few tokens to evaluate on (--max_tokens under about 40M), the default
--test_size holds out more documents, up to 10%, and the script says so; it warns of a small val.bin either way.
A run that is killed leaves train.bin.tmp/val.bin.tmp (Ctrl-C removes them): the next run removes them first.
FineWeb-Edu's 10B-token sample matches GPT-2 124M's budget (llm.c reproduced GPT-2 124M on 10B FineWeb tokens):
    python prepare/openwebtext.py --dataset HuggingFaceFW/fineweb-edu --name sample-10BT \\
        --max_tokens 10_000_000_000 --out_dir data/fineweb_edu
"""
import argparse
import itertools
import math
import os
import sys

import datasets
import numpy as np
from tqdm import tqdm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from any directory
from prepare import common
from training.data import get_encoding

# nanoGPT loads 'openwebtext', a script dataset, which datasets>=4 refuses to run; this is the same corpus as parquet
DEFAULT_DATASET = 'Skylion007/openwebtext'
SPLIT_SEED = 2357  # nanoGPT's, so the same documents land in val
WRITE_SHARDS = 1024  # nanoGPT's: each shard's ids are gathered in RAM, then copied into the memmap
STREAM_BATCH = 1024  # --max_tokens: documents read and tokenized (by num_proc threads) at a time
WRITE_BUFFER = 2 ** 20  # --max_tokens: ids gathered in RAM per split (2 MiB) before they are appended to the file
NANOGPT_TEST_SIZE = 0.0005  # the fraction of the documents nanoGPT holds out for val
# val.bin's least useful size: ten disjoint windows of GPT-2's 1024 tokens. With fewer, train.py's val loss averages
# a few overlapping windows (none at all below 1025 tokens, and train.py refuses the dataset)
MIN_VAL_TOKENS = 10 * 1025
DEFAULT_VAL_TOKENS = 2 * MIN_VAL_TOKENS  # what the default --test_size aims at: documents' lengths vary around it


def default_num_proc():
    """About half the cores, at least 1: tokenizing is CPU-bound, the rest of the machine stays usable."""
    return max(1, (os.cpu_count() or 1) // 2)


def check_test_size(test_size):
    if not 0 < test_size < 1:
        raise common.PrepareError(f'--test_size {test_size} must be a fraction between 0 and 1 (nanoGPT: 0.0005)')


def check_max_tokens(max_tokens):
    if max_tokens < 1:
        raise common.PrepareError(f'--max_tokens {max_tokens} must be at least 1 (e.g. 10_000_000_000)')


def default_test_size(max_tokens):
    """--test_size's default: nanoGPT's; with --max_tokens, the fraction that holds out about DEFAULT_VAL_TOKENS
    (expected_val_tokens) where nanoGPT's would hold out fewer, at most the 10% of nanoGPT's shakespeare split."""
    if max_tokens is None:
        return NANOGPT_TEST_SIZE
    needed = DEFAULT_VAL_TOKENS / (max_tokens + DEFAULT_VAL_TOKENS)
    if needed <= NANOGPT_TEST_SIZE:
        return NANOGPT_TEST_SIZE
    return min(math.ceil(needed * 1000) / 1000, round(1 - common.TRAIN_FRACTION, 3))


def expected_val_tokens(test_size, max_tokens):
    """About how many tokens the documents held out for val hold, where train gets max_tokens from the rest."""
    return round(test_size / (1 - test_size) * max_tokens)


def check_val_size(val_tokens, test_size, train_fixed=False):
    """Say, when val.bin has fewer than MIN_VAL_TOKENS tokens, what --test_size would give it about DEFAULT_VAL_TOKENS,
    at most half: the held-out tokens grow with the fraction of documents held out, or, where train.bin's tokens are
    fixed (a stream that reached --max_tokens), with its odds, test_size / (1 - test_size)."""
    if val_tokens >= MIN_VAL_TOKENS:
        return
    growth = DEFAULT_VAL_TOKENS / max(val_tokens, 1)
    if train_fixed:
        odds = test_size / (1 - test_size) * growth
        needed = odds / (1 + odds)
    else:
        needed = test_size * growth
    larger = min(0.5, math.ceil(needed * 1000) / 1000)
    print(f'warning: val.bin has only {val_tokens:,} tokens, fewer than the {MIN_VAL_TOKENS:,} of ten '
          f'1024-token windows, so its loss is noisy (train.py refuses a block_size of {val_tokens} or more); '
          f'for a larger val.bin run again with --test_size {larger:g}')


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
        raise common.PrepareError(f'could not load {describe(dataset, name, split)} ({common.first_line(e)}); '
                                  f'to use local files pass --dataset text|json|parquet --data_files PATH') from None


def load_splits(dataset, data_files=None, split='train', test_size=NANOGPT_TEST_SIZE, num_proc=1, cache_dir=None,
                name=None):
    """Load `split` of `dataset` and divide its documents into shuffled 'train' and 'val' (a DatasetDict)."""
    check_test_size(test_size)
    documents = load_documents(dataset, name, split, data_files=data_files, num_proc=num_proc, cache_dir=cache_dir)
    if len(documents) < 2:
        raise common.PrepareError(f'{describe(dataset, name, split)} has {len(documents)} document(s); '
                                  f'train and val need at least 2')
    splits = documents.train_test_split(test_size=test_size, seed=SPLIT_SEED, shuffle=True)
    splits['val'] = splits.pop('test')
    return splits


def document_texts(texts, text_column):
    """The documents' texts of a column's values: None (a row without text, which some corpora have) is no document;
    a value of another type means text_column names another column, a PrepareError."""
    for text in texts:
        if text is not None and not isinstance(text, str):
            raise common.PrepareError(f'--text_column {text_column!r} holds a value of type {type(text).__name__}, '
                                      f'not text: pass the column of the documents with --text_column (if it is that '
                                      f'one, remove the rows that hold something else)')
    return [text for text in texts if text is not None]


def encode_document(example, enc, text_column):
    """One document's ids followed by end-of-text, which marks document boundaries in the token stream; none for a
    row without text."""
    texts = document_texts([example[text_column]], text_column)
    ids = enc.encode_ordinary(texts[0]) + [enc.eot_token] if texts else []
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


def check_encoding(enc):
    common.check_fits_uint16(enc.n_vocab, f'encoding {enc.name!r}')
    if '<|endoftext|>' not in enc.special_tokens_set:
        raise common.PrepareError(f'encoding {enc.name!r} has no <|endoftext|> token to separate documents; '
                                  f'use --encoding gpt2')


def prepare(splits, out_dir, enc, text_column='text', num_proc=1):
    """Tokenize the 'train' and 'val' splits with the tiktoken Encoding `enc` and write <split>.bin to `out_dir`."""
    check_encoding(enc)
    columns = splits['train'].column_names
    if text_column not in columns:
        raise common.PrepareError(f'--text_column {text_column!r} is not in the dataset; '
                                  f'its columns: {", ".join(columns)}')
    tokenized = splits.map(encode_document, fn_kwargs={'enc': enc, 'text_column': text_column},
                           remove_columns=columns, desc='tokenizing the splits', num_proc=num_proc)
    with common.output_files(out_dir, *(f'{split}.bin' for split in tokenized)) as tmps:
        counts = {split: write_tokens(tokenized[split], tmp, f'writing {split}.bin')
                  for split, tmp in zip(tokenized, tmps)}
    for split, count in counts.items():
        print(f'{split} has {count:,} tokens')
    return counts


def is_val(index, test_size):
    """Streaming split: the document at `index` (0-based, in stream order) goes to val when it raises
    ceil(n * test_size), so of any first n documents ceil(n * test_size) are val, as train_test_split counts:
    documents 0, 1/test_size, 2/test_size, ... (0, 2000, 4000, ... for nanoGPT's 0.0005)."""
    return math.ceil((index + 1) * test_size) > math.ceil(index * test_size)


def read_texts(stream, text_column, what):
    """The texts of the documents of `stream`, STREAM_BATCH at a time, with one-line errors."""
    batches = stream.iter(batch_size=STREAM_BATCH)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # a network or format error in the middle of the stream
            raise common.PrepareError(f'could not read {what} ({common.first_line(e)})') from None
        if text_column not in batch:
            raise common.PrepareError(f'--text_column {text_column!r} is not in the dataset; '
                                      f'its columns: {", ".join(batch)}')
        yield document_texts(batch[text_column], text_column)


class TokenWriter:
    """Appends ids to an open uint16 file, holding at most about WRITE_BUFFER of them in RAM."""

    def __init__(self, f):
        self.f, self.parts, self.buffered, self.count = f, [], 0, 0

    def write(self, ids):
        self.parts.append(np.array(ids, dtype=np.uint16))
        self.buffered += len(ids)
        self.count += len(ids)
        if self.buffered >= WRITE_BUFFER:
            self.flush()

    def flush(self):
        if self.parts:
            np.concatenate(self.parts).tofile(self.f)
        self.parts, self.buffered = [], 0


def prepare_stream(stream, out_dir, enc, max_tokens, text_column='text', test_size=NANOGPT_TEST_SIZE,
                   num_proc=1, what='the dataset'):
    """Tokenize documents of the IterableDataset `stream` until train.bin holds exactly `max_tokens` tokens (the
    last train document is cut there), holding out for val the documents is_val picks; return the token counts."""
    check_encoding(enc)
    check_max_tokens(max_tokens)
    check_test_size(test_size)
    batches = read_texts(stream, text_column, what)
    first = next(batches, None)  # a missing column or an empty corpus fails here, before anything is written
    if first is None:
        raise common.PrepareError(f'{what} has no documents; pass a dataset or --data_files that hold some')
    with common.output_files(out_dir, 'train.bin', 'val.bin') as tmps, open(tmps[0], 'wb') as train_file, \
            open(tmps[1], 'wb') as val_file:
        train, val = TokenWriter(train_file), TokenWriter(val_file)
        documents = (ids + [enc.eot_token] for texts in itertools.chain([first], batches)
                     for ids in enc.encode_ordinary_batch(texts, num_threads=num_proc))
        index = -1  # the last document's: none yet
        with tqdm(total=max_tokens, unit='tok', unit_scale=True, desc='writing train.bin') as bar:
            for index, ids in enumerate(documents):
                if is_val(index, test_size):
                    val.write(ids)
                    continue
                ids = ids[:max_tokens - train.count]
                train.write(ids)
                bar.update(len(ids))
                if train.count == max_tokens:
                    break
        train.flush()
        val.flush()
        if index < 0:
            raise common.PrepareError(f'{what} has no documents with text; pass a dataset or --data_files that hold '
                                      f'some')
        if train.count == 0:
            raise common.PrepareError(f'{what} has {index + 1} document(s), all held out for val; '
                                      f'pass more documents or a smaller --test_size')
    if train.count < max_tokens:
        print(f'{what} ended after {index + 1:,} documents, short of --max_tokens {max_tokens:,}')
    print(f'train has {train.count:,} tokens')
    print(f'val has {val.count:,} tokens')
    return {'train': train.count, 'val': val.count}


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
    parser.add_argument('--text_column', default='text',
                        help='column holding the documents (default: %(default)s); rows without text are skipped')
    parser.add_argument('--test_size', type=float,
                        help=f'fraction of the documents that goes to val.bin (default: {NANOGPT_TEST_SIZE}, as '
                             f'nanoGPT; with a --max_tokens under {DEFAULT_VAL_TOKENS / NANOGPT_TEST_SIZE / 1e6:.0f}M, '
                             f'more, so that val.bin holds about {DEFAULT_VAL_TOKENS:,} tokens)')
    parser.add_argument('--num_proc', type=int, default=default_num_proc(),
                        help='processes for loading and tokenizing, threads for tokenizing with --max_tokens '
                             '(default: half the cores, %(default)s)')
    parser.add_argument('--cache_dir', help='Hugging Face datasets cache for downloads and tokenized documents '
                                            '(default: HF_DATASETS_CACHE); needs room for the whole corpus '
                                            'unless --max_tokens streams it')
    parser.add_argument('--max_tokens', type=int, metavar='N',
                        help='stream the dataset instead of downloading it and stop when train.bin holds exactly '
                             'N tokens; underscores are allowed: 10_000_000_000')
    common.add_encoding_arg(parser)
    common.add_out_dir_arg(parser, 'openwebtext')
    args = parser.parse_args(argv)
    if args.num_proc < 1:
        raise common.PrepareError(f'--num_proc {args.num_proc} must be at least 1')
    if args.max_tokens is not None:
        check_max_tokens(args.max_tokens)  # before the encoding and the stream, which may reach the network
        if '[' in args.split:  # datasets' slices (train[:10%]) need the split's length, which a stream has not
            raise common.PrepareError(f'--split {args.split!r} is a slice, which a stream cannot take: with '
                                      f'--max_tokens pass the split whole (--split {args.split.split("[")[0]!r}); '
                                      f'--max_tokens itself bounds what is read')
    common.check_writable_dir(args.out_dir)
    common.remove_stale_temporaries(args.out_dir)  # before the download or the stream: they may need that room
    enc = get_encoding(args.encoding)
    test_size = args.test_size
    if test_size is None:
        test_size = default_test_size(args.max_tokens)
        if test_size != NANOGPT_TEST_SIZE:
            print(f'holding out {test_size:g} of the documents for val.bin (about '
                  f'{expected_val_tokens(test_size, args.max_tokens):,} tokens), not nanoGPT\'s {NANOGPT_TEST_SIZE} '
                  f'(about {expected_val_tokens(NANOGPT_TEST_SIZE, args.max_tokens):,}): --test_size chooses')
    if not args.data_files and not os.path.isdir(args.dataset):  # else a packaged reader of local files, or a folder
        print(f'reading {describe(args.dataset, args.name, args.split)} from the Hugging Face Hub (without network '
              f'access each request is retried for about half a minute, then this stops)', flush=True)
    if args.max_tokens is not None:
        stream = load_documents(args.dataset, args.name, args.split, data_files=args.data_files,
                                cache_dir=args.cache_dir, streaming=True)
        counts = prepare_stream(stream, args.out_dir, enc, args.max_tokens, args.text_column, test_size,
                                args.num_proc, describe(args.dataset, args.name, args.split))
    else:
        splits = load_splits(args.dataset, args.data_files, args.split, test_size, args.num_proc, args.cache_dir,
                             args.name)
        counts = prepare(splits, args.out_dir, enc, args.text_column, args.num_proc)
    check_val_size(counts['val'], test_size, train_fixed=args.max_tokens == counts['train'])


if __name__ == '__main__':  # the guard also keeps worker processes (spawned on Windows and macOS) from re-running it
    common.run_main(main)
