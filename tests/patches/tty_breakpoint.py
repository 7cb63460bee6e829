"""breakpoint() in a script the tests run as a plain subprocess (TESTS_PLAIN_SUBPROCESS=1; PYTHONBREAKPOINT names
set_trace): pdb on the terminal, since the script's stdin and stdout are the test's pipes."""
import pdb
import sys


def set_trace(header=None):
    try:
        debugger = pdb.Pdb(stdin=open('/dev/tty'), stdout=open('/dev/tty', 'w'))
    except OSError:  # no terminal: a CI run, or torchrun's workers, each in a session of its own
        debugger = pdb.Pdb()
    if header is not None:
        debugger.message(header)
    debugger.set_trace(sys._getframe(1))
