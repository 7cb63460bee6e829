"""Every test here runs a script as a user does (a subprocess, torchrun) or compiles or traces for long: slow by where
it lives, and `python -m pytest -m "not slow"` leaves this folder out. Here too: one short training run whose
checkpoint several tests read."""
from pathlib import Path

import pytest

from helpers import TINY_ARGS, run_script, write_char_dataset

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
    """One 30-iteration run of the tiny model, checkpointed at iters 15 and 30: (completed process, data dir,
    out dir). Read-only for the tests: copy out_dir before changing anything in it."""
    root = tmp_path_factory.mktemp('tiny_run')
    write_char_dataset(root / 'data')
    out = root / 'out'
    result = run_script('train.py', *TINY_ARGS, f'--data_dir={root / "data"}', f'--out_dir={out}',
                        '--max_iters=30', '--eval_interval=15')
    assert result.returncode == 0, result.stderr
    return result, root / 'data', out
