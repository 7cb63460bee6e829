"""Shared by the prepare/ scripts: command-line options, the input text, the train/val split and all-or-nothing
writing of nanoGPT's train.bin/val.bin (uint16 token ids) and meta.pkl. Downloads, atomic writes and tiktoken
encodings are the library's (training/data.py), which the scripts use too."""
import contextlib
import os
import pickle
import signal
import sys

import numpy as np

from training.data import atomic_files, download, temporary_name
from training.errors import INTERRUPTED_STATUS, ConfigError, fail, first_line, print_error
from training.paths import check_writable_dir

SHAKESPEARE_URL = 'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt'
UINT16_IDS = 2 ** 16  # train.bin/val.bin hold uint16 ids, so a vocabulary may have at most this many tokens
TRAIN_FRACTION = 0.9  # nanoGPT's shakespeare split: the first 90% of the text trains, the rest validates
OUTPUT_NAMES = ('train.bin', 'val.bin', 'meta.pkl', 'input.txt')  # what the scripts write to their out_dir


class PrepareError(ConfigError):
    """A problem the user can fix; str(e) is the one-line message."""


def run_main(main):
    """Run a script's main(); a PrepareError (any ConfigError) becomes one line on stderr and exit status 2, Ctrl-C
    one line and status 130 (atomic_files has removed the temporaries by then: no output was written)."""
    leave_ctrl_c_to_this_process()
    try:
        main()
    except ConfigError as e:
        fail(e)
    except BaseException as e:
        if not interrupted(e):
            raise
        print_error('interrupted: no output written, temporary files removed')
        sys.exit(INTERRUPTED_STATUS)


def leave_ctrl_c_to_this_process():
    """Ctrl-C signals every process of the terminal's foreground group: the worker processes that datasets forks for
    num_proc > 1 inherit this handler and ignore it (each would print its traceback); this process stops them and
    says so in one line. (Workers spawned, on macOS and Windows, keep Python's handler.)"""
    main_pid = os.getpid()

    def handler(signum, frame):
        if os.getpid() == main_pid:
            raise KeyboardInterrupt
    signal.signal(signal.SIGINT, handler)


def interrupted(exc):
    """Whether `exc` is Ctrl-C's KeyboardInterrupt or was raised while handling one: datasets' map with num_proc > 1
    raises a TimeoutError as it cleans up its worker pool, which Ctrl-C stopped too."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__context__
    return False


def remove_stale_temporaries(out_dir):
    """Remove the temporaries of out_dir's outputs that a killed run left: atomic_files removes its own on any
    exception, but not when the process is killed (SIGKILL, a closed terminal, a power cut), and they can be GBs."""
    for name in OUTPUT_NAMES:
        tmp = temporary_name(os.path.join(out_dir, name))
        if os.path.isfile(tmp):
            size = os.path.getsize(tmp)
            os.remove(tmp)
            print(f'removed {tmp} ({size / 1e6:,.1f} MB), left by an interrupted run')


def default_out_dir(name):
    """data/<name>/ in the current directory, where `train.py --dataset=<name>` looks: every relative path, in these
    scripts as in train.py and sample.py, is relative to the current directory."""
    return os.path.join('data', name)


def add_out_dir_arg(parser, name):
    parser.add_argument('--out_dir', default=default_out_dir(name),
                        help=f'where train.bin/val.bin go (default: data/{name}/ in the current directory)')


def add_text_args(parser, name):
    """--input, --url and --out_dir of the scripts that prepare one text file."""
    parser.add_argument('--input', metavar='PATH',
                        help='text file to use; default: OUT_DIR/input.txt, downloaded from --url when absent')
    parser.add_argument('--url', default=SHAKESPEARE_URL,
                        help='where to download input.txt from (default: %(default)s)')
    add_out_dir_arg(parser, name)


def add_encoding_arg(parser):
    parser.add_argument('--encoding', default='gpt2',
                        help='tiktoken encoding (default: %(default)s); '
                             'offline, set TIKTOKEN_CACHE_DIR to a folder holding its cached files')


def read_text(input_path, url, out_dir):
    """The text of `input_path`, or of out_dir/input.txt, which is downloaded from `url` when absent (as nanoGPT).
    Checks first that out_dir can be written, where the outputs will go."""
    check_writable_dir(out_dir)
    remove_stale_temporaries(out_dir)
    if input_path is None:
        input_path = os.path.join(out_dir, 'input.txt')
        if not os.path.exists(input_path):
            download(url, input_path)
    try:
        with open(input_path, encoding='utf-8') as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PrepareError(f'cannot read {input_path} ({first_line(e)}); '
                           f'pass a UTF-8 text file with --input PATH') from None


def split_text(text):
    """nanoGPT's split: the first 90% of the characters for training, the rest for validation."""
    cut = int(len(text) * TRAIN_FRACTION)
    if cut == 0 or cut == len(text):
        raise PrepareError(f'the input has {len(text)} characters, too few to split 90/10; '
                           f'pass a longer text with --input PATH')
    return text[:cut], text[cut:]


def check_fits_uint16(vocab_size, what):
    if vocab_size > UINT16_IDS:
        raise PrepareError(f'{what} has {vocab_size:,} tokens but train.bin/val.bin store uint16 ids '
                           f'(at most {UINT16_IDS:,}); use a smaller vocabulary')


@contextlib.contextmanager
def output_files(out_dir, *names):
    """atomic_files of out_dir/<name> for each of `names`, out_dir (and its parents) made where missing and removed
    again where the block fails: a prepare that fails leaves no trace, not even an empty folder. Outputs without a
    meta.pkl (a tiktoken encoding's ids) remove the one there, another dataset's (remove_meta)."""
    made, folder = [], os.path.abspath(out_dir)
    while not os.path.isdir(folder):  # the folders makedirs makes, out_dir first
        made.append(folder)
        folder = os.path.dirname(folder)
    os.makedirs(out_dir, exist_ok=True)
    try:
        with atomic_files(*(os.path.join(out_dir, name) for name in names)) as tmps:
            yield tmps
    except BaseException:
        with contextlib.suppress(OSError):  # each empty: atomic_files removed its temporaries
            for folder in made:
                os.rmdir(folder)
        raise
    if 'meta.pkl' not in names:
        remove_meta(out_dir)


def write_splits(out_dir, splits, meta=None):
    """Write each split's ids to out_dir/<split>.bin as uint16, and `meta` to out_dir/meta.pkl: all or nothing."""
    names = [f'{split}.bin' for split in splits] + (['meta.pkl'] if meta is not None else [])
    with output_files(out_dir, *names) as tmps:
        for ids, tmp in zip(splits.values(), tmps):
            np.array(ids, dtype=np.uint16).tofile(tmp)
        if meta is not None:
            with open(tmps[-1], 'wb') as f:
                pickle.dump(meta, f)


def remove_meta(out_dir):
    """Remove out_dir/meta.pkl, where the train.bin/val.bin just written there are a tiktoken encoding's: train.py
    would take its vocabulary (a character dataset's, prepared there before) for theirs."""
    path = os.path.join(out_dir, 'meta.pkl')
    if os.path.exists(path):
        os.remove(path)
        print(f"removed {path}, another dataset's vocabulary: train.bin/val.bin here are now tiktoken ids")
