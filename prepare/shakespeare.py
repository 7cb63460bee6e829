"""Tiny Shakespeare in GPT-2 BPE, as nanoGPT's data/shakespeare/prepare.py: a 90/10 split of the text, each part
encoded with tiktoken's encode_ordinary, uint16 train.bin/val.bin in data/shakespeare/ (no meta.pkl: GPT-2 vocab)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from any directory
from prepare import common
from training.data import get_encoding


def prepare(text, out_dir, enc):
    """Encode both parts of `text` with the tiktoken Encoding `enc` and write the splits; return (train, val) sizes."""
    common.check_fits_uint16(enc.n_vocab, f'encoding {enc.name!r}')
    train_text, val_text = common.split_text(text)
    train_ids = enc.encode_ordinary(train_text)
    val_ids = enc.encode_ordinary(val_text)
    print(f'train has {len(train_ids):,} tokens')
    print(f'val has {len(val_ids):,} tokens')
    common.write_splits(out_dir, {'train': train_ids, 'val': val_ids})
    return len(train_ids), len(val_ids)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_text_args(parser, 'shakespeare')
    common.add_encoding_arg(parser)
    args = parser.parse_args(argv)
    enc = get_encoding(args.encoding)
    prepare(common.read_text(args.input, args.url, args.out_dir), args.out_dir, enc)


if __name__ == '__main__':
    common.run_main(main)
