"""Every test here runs a script as a user does (a subprocess, torchrun) or compiles or traces for long: slow by where
it lives, and `python -m pytest -m "not slow"` leaves this folder out. Here too: one short training run whose
checkpoint several tests read, and the card presets' memory traces, run in the background."""
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from helpers import TINY_ARGS, run_script, trace_card_preset, write_char_dataset

HERE = Path(__file__).parent
CARD_PRESET_TEST = 'test_card_presets_fit_their_card'  # test_estimate_memory.py's


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
    # last, by when card_preset_traces has traced them
    items.sort(key=lambda item: item.originalname == CARD_PRESET_TEST)


class TracedWhenAsked:
    """A card preset's trace made in this process when its result is asked for, as a future's result() gives it."""

    def __init__(self, path):
        self.path = path

    def result(self):
        return trace_card_preset(self.path)


@pytest.fixture(scope='session', autouse=True)
def card_preset_traces(request):
    """{preset: future of helpers.trace_card_preset} for the card presets whose test was selected, traced one after
    the other in a background process from the first end-to-end test on, at the lowest priority: on the core the
    tests' runs (one process at a time, mostly) leave free. The gpt2-xl presets' traces take most of a minute each.
    Under pytest-xdist every core runs tests already, and each worker would trace every preset: each test traces its
    own preset there."""
    paths = [item.callspec.params['path'] for item in request.session.items if item.originalname == CARD_PRESET_TEST]
    if not paths or os.environ.get('PYTEST_XDIST_WORKER'):
        yield {path: TracedWhenAsked(path) for path in paths}
        return
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context('spawn'), initializer=os.nice, initargs=(19,))
    yield {path: pool.submit(trace_card_preset, path) for path in paths}
    pool.shutdown(cancel_futures=True)


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
