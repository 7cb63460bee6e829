"""A dataset's meta.pkl (nanoGPT's vocabulary file: vocab_size, and stoi/itos for characters), read without running
any code that a downloaded file might carry: pickle.load would call whatever the file names."""
import os
import pickle

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
