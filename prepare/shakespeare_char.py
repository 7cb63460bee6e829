"""Character-level Tiny Shakespeare, as nanoGPT's data/shakespeare_char/prepare.py: one token per character,
a 90/10 split, uint16 train.bin/val.bin and meta.pkl {vocab_size, itos, stoi} in data/shakespeare_char/."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # runnable from any directory
from prepare import common


def prepare(text, out_dir):
    """Encode `text` with its sorted character vocabulary and write the splits and meta; return (train, val) sizes."""
    print(f'length of dataset in characters: {len(text):,}')
    chars = sorted(set(text))
    vocab_size = len(chars)
    print('all the unique characters:', ''.join(chars))
    print(f'vocab size: {vocab_size:,}')
    common.check_fits_uint16(vocab_size, 'the character vocabulary')
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    train_text, val_text = common.split_text(text)
    train_ids = [stoi[ch] for ch in train_text]
    val_ids = [stoi[ch] for ch in val_text]
    print(f'train has {len(train_ids):,} tokens')
    print(f'val has {len(val_ids):,} tokens')
    common.write_splits(out_dir, {'train': train_ids, 'val': val_ids},
                        meta={'vocab_size': vocab_size, 'itos': itos, 'stoi': stoi})
    return len(train_ids), len(val_ids)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    common.add_text_args(parser, 'shakespeare_char')
    args = parser.parse_args(argv)
    prepare(common.read_text(args.input, args.url, args.out_dir), args.out_dir)


if __name__ == '__main__':
    common.run_main(main)
