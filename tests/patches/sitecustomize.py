"""Run by Python as every process starts whose PYTHONPATH holds this folder (helpers.patched_env): where
$TESTS_PATCHES names modules of this folder (comma-separated), the repository and tests/ go first on sys.path and each
module is imported, in order, before the script runs. A patch changes what the script will call, for what no test
can reach: a download, a full disk, a fault. torchrun's workers inherit the environment, and so the patches."""
import importlib
import os
import sys

PATCHES = [name for name in os.environ.get('TESTS_PATCHES', '').split(',') if name]
if PATCHES:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [os.path.dirname(tests), tests]
    for name in PATCHES:
        importlib.import_module(name)
