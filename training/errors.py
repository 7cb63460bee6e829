"""The one way errors reach the user: one line naming the key, file or value and the fix, on stderr, and exit status
2, without a traceback. A script calls install_handler() once; from then on an uncaught ConfigError ends it that way,
and so does any exception a handler registered with on_error() describes. fail() does the same from a line of code."""
import atexit
import os
import sys
import time

# seconds a rank other than 0 waits before it reports an error that every rank may share (see fail)
OTHER_RANKS_WAIT = 10
ERROR_STATUS = 2
INTERRUPTED_STATUS = 130  # what a shell reports for a process that Ctrl-C (SIGINT, 2) ended: 128 + 2


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
    """Print `error: message` on stderr (see report) and exit with status 2. Once a process group exists, the process
    exits at once (os._exit): other ranks' collectives may be in flight, and the interpreter's teardown would wait on
    them or abort on gloo's threads."""
    report(message, every_rank, secondary)
    if _distributed_is_initialized():
        _exit_now()
    sys.exit(ERROR_STATUS)


def report(message, every_rank=False, secondary=False, every_rank_has_it=False):
    """Print `error: message` on stderr, once for all ranks where they share it: rank 0 speaks for all, another rank
    waits for torchrun to stop it and speaks only if it is still running (at once with every_rank: its own failure);
    a secondary error, the echo of another rank's failure, waits on every rank, so the first failure is the one said.
    every_rank_has_it: every rank has it at once (Ctrl-C reaches the whole process group): only rank 0 speaks, and
    no rank waits."""
    rank, world_size = int(os.environ.get('RANK', 0)), int(os.environ.get('WORLD_SIZE', 1))
    if every_rank_has_it and rank != 0:
        return
    if secondary or (rank != 0 and not every_rank):
        time.sleep(OTHER_RANKS_WAIT)
        every_rank = True
    prefix = f'rank {rank}: ' if world_size > 1 and every_rank else ''
    print_error(f'error: {prefix}{message}')


def _distributed_is_initialized():
    distributed = sys.modules.get('torch.distributed')  # not imported here: the prepare scripts need no torch
    return distributed is not None and distributed.is_available() and distributed.is_initialized()


def _exit_now(status=ERROR_STATUS):
    """Exit at once with `status`, from anywhere, even an excepthook (where SystemExit is not honoured). Without a
    process group the atexit functions run first (wandb, tqdm); with one they are skipped, as fail() explains."""
    sys.stdout.flush()
    sys.stderr.flush()
    if not _distributed_is_initialized():
        atexit._run_exitfuncs()
    os._exit(status)


# (exception type, describe) pairs, the newest last; describe(e) gives the message, or (message, options: report's,
# and `status`, the exit status, ERROR_STATUS by default), or None for an exception it does not explain, whose
# traceback is shown as usual
_handlers = []


def on_error(exc_type, describe):
    """From now on, an uncaught `exc_type` that describe(e) explains ends the script with that one line, as fail()."""
    _handlers.append((exc_type, describe))


def report_failure(exc):
    """Print the one line of the newest handler that explains `exc` and return its exit status; None if none does."""
    for exc_type, describe in reversed(_handlers):
        if isinstance(exc, exc_type):
            failure = describe(exc)
            if failure is not None:
                message, options = (failure, {}) if isinstance(failure, str) else failure
                options = dict(options)
                status = options.pop('status', ERROR_STATUS)
                report(message, **options)
                return status
    return None


def install_handler():
    """The script's one error path: uncaught ConfigErrors (and what on_error registers later) end it with one line
    and status 2, Ctrl-C with `interrupted` and status 130; anything else keeps its traceback. Handlers of an earlier
    install in this process are dropped."""
    _handlers[:] = [(ConfigError, str), (KeyboardInterrupt, lambda e: ('interrupted', {'status': INTERRUPTED_STATUS}))]

    def excepthook(exc_type, exc, tb):
        # torch.distributed's own excepthook wraps this one and collects its stderr to prefix it with the rank: the
        # one line goes to the process's stderr itself, since this process exits before that hook writes anything
        captured, sys.stderr = sys.stderr, sys.__stderr__
        status = report_failure(exc)
        if status is not None:
            _exit_now(status)
        sys.stderr = captured
        sys.__excepthook__(exc_type, exc, tb)

    sys.excepthook = excepthook
