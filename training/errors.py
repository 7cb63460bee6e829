"""The one way bad input is reported: a ConfigError whose message is one line naming the key, file or value and the
fix, and fail(), which prints it and exits with status 2, without a traceback."""
import os
import sys


class ConfigError(ValueError):
    """A problem the user can fix; str(e) is the one-line message."""


def first_line(exc, limit=160):
    """The first line of an exception's message, shortened, for embedding in a one-line error."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + '...'


def fail(message, every_rank=False):
    """Print `error: message` on stderr and exit with status 2.

    Under torchrun every rank runs the same checks and would print the same line: only rank 0 prints, unless
    every_rank (a failure of this rank's own, such as a timeout), which is printed with the rank. Once a process group
    exists, the process exits at once (os._exit): other ranks' collectives may be in flight, and the interpreter's
    teardown would wait on them or abort on gloo's threads (see the end of train.py)."""
    rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    if every_rank or rank == 0:
        print(f"error: {f'rank {rank}: ' if every_rank and world_size > 1 else ''}{message}", file=sys.stderr)
    distributed = sys.modules.get('torch.distributed')  # not imported here: the prepare scripts need no torch
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    sys.exit(2)
