"""For the tests of the harness itself: says on stderr, before the script runs, that the patches ran and which
process started this one (pytest for a plain subprocess, the script server's monitor for a forked child)."""
import os
import sys

print(f'patched; parent process {os.getppid()}', file=sys.stderr)
