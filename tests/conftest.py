"""Fixtures shared by the tests: a tiny character dataset, and one short training run whose checkpoint several tests
read. Helpers that tests import live in helpers.py."""
import pytest

from helpers import TINY_ARGS, run_script, write_char_dataset


@pytest.fixture
def data_dir(tmp_path):
    """tmp_path/data holding the tiny character dataset DATASET."""
    write_char_dataset(tmp_path / 'data')
    return tmp_path / 'data'


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
