"""A dataset's meta.pkl (nanoGPT's vocabulary file: vocab_size, and stoi/itos for characters), read without running
any code that a downloaded file might carry: pickle.load would call whatever the file names."""
import os
import pickle

from model import GPT2_VOCAB_SIZE
from training.errors import ConfigError, first_line

META_NAME = 'meta.pkl'


class _ForeignObject(pickle.UnpicklingError):
    pass


class _PlainUnpickler(pickle.Unpickler):
    """Dicts, lists, tuples, str, int, float and bool are built by the pickle machine itself; everything else
    (classes, functions, whose __reduce__ is how a pickle runs code) is looked up here, so refusing every lookup
    refuses code."""

    def find_class(self, module, name):
        raise _ForeignObject(f'{module}.{name}')


def trained_meta_path(train_config):
    """data_dir/dataset/meta.pkl of the run a checkpoint's config describes, or None if it names no dataset."""
    if 'dataset' not in train_config:
        return None
    return os.path.join(train_config.get('data_dir', 'data'), train_config['dataset'], META_NAME)


def load_meta(path):
    """The dict in meta.pkl at `path`; ConfigError with one line if it holds anything but plain data, before any
    of it runs, or cannot be read."""
    try:
        with open(path, 'rb') as f:
            meta = _PlainUnpickler(f).load()
    except _ForeignObject as e:
        raise ConfigError(f'{path} refers to {e}, but a meta.pkl holds only plain data (dict, str, int, list): not '
                          f'loaded, nothing in it ran; prepare the dataset again with its prepare script') from None
    except Exception as e:  # a corrupt or truncated file: whatever failed, the fix is to prepare the dataset again
        raise ConfigError(f'cannot read {path} ({first_line(e)}): prepare the dataset again') from None
    if not isinstance(meta, dict):
        raise ConfigError(f'{path} holds a {type(meta).__name__}, not the dict of a meta.pkl: prepare the dataset '
                          f'again')
    return meta


def vocab_size_of(meta_path, meta):
    """The vocab_size of meta.pkl at meta_path, read as `meta`: a model trained on it has that many tokens (train.py
    builds it so), at least one. ConfigError with one line otherwise."""
    try:
        vocab_size = int(meta['vocab_size'])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f'cannot read vocab_size from {meta_path} ({first_line(e)}): prepare the dataset '
                          f'again') from None
    if vocab_size < 1:
        raise ConfigError(f'{meta_path} has vocab_size {vocab_size}, but a vocabulary has at least one token: prepare '
                          f'the dataset again')
    return vocab_size


def characters(meta_path, vocab_size):
    """What the token ids of a model of vocab_size tokens mean: (stoi, itos) from meta.pkl at meta_path (its dataset's,
    as trained_meta_path names it), or None without one, for GPT-2's tokens. ConfigError with one line where meta.pkl
    has no characters, or is of another vocabulary than the model's (sampled tokens would have no character, a
    prompt's no embedding), or where there is none and vocab_size is too small for GPT-2's tokens."""
    if meta_path is not None and os.path.exists(meta_path):
        meta = load_meta(meta_path)
        missing = [key for key in ('stoi', 'itos') if key not in meta]
        if missing:
            raise ConfigError(f'{meta_path} has no {missing[0]!r} (a vocabulary of characters): prepare the dataset '
                              f'again')
        if vocab_size_of(meta_path, meta) != vocab_size:
            raise ConfigError(f"{meta_path} has vocab_size {meta['vocab_size']} but the model's is {vocab_size}: it "
                              f"is not the dataset this model was trained on")
        return meta['stoi'], meta['itos']
    if vocab_size < GPT2_VOCAB_SIZE:
        raise ConfigError(f"the model's vocab_size is {vocab_size}, too small for GPT-2's tokens, and its dataset's "
                          f"meta.pkl ({meta_path or 'none recorded'}) is not there: run from the directory it was "
                          f"trained in, or prepare that dataset again")
    return None
