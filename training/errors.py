"""The one way bad input is reported: a ConfigError whose message is one line naming the key, file or value and the
fix, and fail(), which prints it and exits with status 2, without a traceback."""
import os
import sys
import time

# seconds a rank other than 0 waits before it reports an error that every rank may share (see fail)
OTHER_RANKS_WAIT = 10


class ConfigError(ValueError):
    """A problem the user can fix; str(e) is the one-line message."""


def first_line(exc, limit=160):
    """The first line of an exception's message, shortened, for embedding in a one-line error."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + '...'


def print_error(line):
    """`line` and its newline on stderr in one write: torchrun's ranks share one stderr, and print's two writes (the
    text, then the newline) interleave with another rank's line when the stream is unbuffered (PYTHONUNBUFFERED=1)."""
    sys.stderr.write(line + '\n')
    sys.stderr.flush()


def fail(message, every_rank=False, secondary=False):
    """Print `error: message` on stderr and exit with status 2.

    Under torchrun every rank runs the same checks and would print the same line: rank 0 prints it for all. Another
    rank waits first, for torchrun to stop it once rank 0 has failed the same way; if it is still running then, the
    error was its own, and it prints it with its rank, as it does at once with every_rank (a failure of this rank's
    own, such as an out-of-memory error). A secondary error, the consequence of another rank's failure (its
    connection closed), waits on every rank: the rank that failed first says why. Once a process group exists, the
    process exits at once (os._exit): other ranks' collectives may be in flight, and the interpreter's teardown would
    wait on them or abort on gloo's threads."""
    rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    if secondary or (rank != 0 and not every_rank):
        time.sleep(OTHER_RANKS_WAIT)
        every_rank = True
    prefix = f'rank {rank}: ' if world_size > 1 and every_rank else ''
    print_error(f'error: {prefix}{message}')
    distributed = sys.modules.get('torch.distributed')  # not imported here: the prepare scripts need no torch
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        sys.stdout.flush()
        os._exit(2)
    sys.exit(2)
