"""The data's files, for the prepare scripts and the library alike: downloads, all-or-nothing writes, and tiktoken
encodings, each with one-line errors; and train.py's sequential batch order."""
import contextlib
import os
import shutil
import urllib.request

import numpy as np
import tiktoken

from training.errors import ConfigError, first_line


def download(url, path, fix='fetch the file another way and pass --input PATH'):
    """Fetch `url` into `path` through a temporary file, so a failed download leaves nothing behind.
    `fix` ends the error message: what the user can do instead."""
    print(f'downloading {url} to {path}')
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            os.makedirs(os.path.dirname(path), exist_ok=True)  # once the server answers: offline, nothing is created
            with atomic_files(path) as (tmp,), open(tmp, 'wb') as f:
                shutil.copyfileobj(response, f)
    except (OSError, ValueError) as e:  # URLError, HTTPError and timeouts are OSErrors; a malformed URL is a ValueError
        raise ConfigError(f'could not download {url} ({first_line(e)}); {fix}') from None


def temporary_name(path):
    return f'{path}.tmp'


@contextlib.contextmanager
def atomic_files(*paths):
    """Yield temporary names next to `paths`; they replace `paths` only if the block succeeds, else they are removed.

    Same directory, so os.replace is a rename: readers see the old files or the complete new ones, never a half.
    """
    tmps = [temporary_name(path) for path in paths]
    try:
        yield tmps
    except BaseException:
        for tmp in tmps:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        raise
    for tmp, path in zip(tmps, paths):
        os.replace(tmp, path)


def get_encoding(name):
    """tiktoken.get_encoding(name), with one-line errors for an unknown name and for files that cannot be fetched."""
    names = tiktoken.list_encoding_names()
    if name not in names:
        raise ConfigError(f'{name!r} is not a tiktoken encoding; choose one of: {", ".join(names)}')
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # tiktoken downloads its BPE files on first use; whatever fails there, the fix is the cache
        raise ConfigError(f'could not load the tiktoken {name!r} files ({first_line(e)}); offline, set '
                           f'TIKTOKEN_CACHE_DIR to a folder holding tiktoken\'s cached {name} files') from None


def check_tokens(path, vocab_size, *batches):
    """ConfigError where the batches read from `path` (CPU tensors) hold a token the model has no embedding for: a GPU
    would stop at a device-side assert, a CPU at an IndexError, neither naming the file."""
    largest = max(int(batch.max()) for batch in batches)
    if largest >= vocab_size:
        raise ConfigError(f"{path} holds token {largest}, but the model's vocabulary has {vocab_size} tokens (0 to "
                          f"{vocab_size - 1}): the .bin files are not of the dataset the model's vocabulary (its "
                          f"meta.pkl, or GPT-2's without one) is for; prepare the dataset again into a folder of its "
                          f"own")


def sequential_offsets(n_tokens, block_size, first_row, rows):
    """The offsets of windows first_row .. first_row + rows - 1 of a file of n_tokens read as consecutive windows of
    block_size tokens (each followed by its last target), from the start again after the last whole window: every
    token once a pass, in order, as modded-nanogpt reads its shards (train.py's batch_order='sequential')."""
    per_pass = (n_tokens - 1) // block_size
    return (np.arange(first_row, first_row + rows) % per_pass) * block_size
