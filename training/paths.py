"""Paths: every relative path (config files, out_dir, data_dir, the prepare scripts' --out_dir) is relative to the
current directory, as in nanoGPT's train.py; the project's own files are found from ROOT. A directory a script will
write into is checked before any work."""
import os
import tempfile

from training.errors import ConfigError, first_line

# The project's folder: its own files (train.py, config/, prepare/, training/) are found from here, wherever it runs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_writable_dir(path, key='out_dir'):
    """ConfigError unless `path` is a directory, or can be made one, in which a file can be created: checked by
    creating a file and removing it (as root, permission bits do not tell). Nothing is left behind, not even
    `path`."""
    if not path:
        raise ConfigError(f'{key} is empty: give a directory, e.g. --{key}=out')
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f'{key}={path!r} cannot be a directory: {existing} is a file; use another --{key}')
    try:
        handle, probe = tempfile.mkstemp(prefix='.write-check-', dir=existing)
        os.close(handle)
        os.remove(probe)
    except OSError as e:
        raise ConfigError(f'cannot write in {key}={path!r} ({first_line(e)}): use a writable --{key}') from None
