"""tests/script_server.py, which most end-to-end runs go through: a forked child gives what `python script` gives."""
import os
import subprocess
import sys

import pytest

from helpers import one_thread_env, patched_env
from script_server import ScriptServer

SCRIPT = """
import os, sys
import helper_module
print('argv', sys.argv[1:], 'cwd', os.getcwd(), 'var', os.environ.get('SERVER_TEST'), 'path0', sys.path[0])
print('patched', getattr(helper_module, 'PATCHED', False), 'main', __name__, file=sys.stderr)
if sys.argv[1] == 'exit':
    sys.exit('error: a one-line message')
if sys.argv[1] == 'raise':
    raise ValueError('uncaught')
if sys.argv[1] == 'hook':
    sys.excepthook = lambda *exc: print('hooked', exc[1], file=sys.stderr)
    raise ValueError('to the hook')
"""


@pytest.fixture(scope='module')
def server():
    server = ScriptServer(one_thread_env())
    yield server
    server.close()


@pytest.mark.parametrize('mode', ['ok', 'exit', 'raise', 'hook'])
def test_a_child_runs_a_script_as_python_does(server, tmp_path, mode):
    (tmp_path / 'scripts').mkdir()
    (tmp_path / 'scripts' / 'script.py').write_text(SCRIPT)
    (tmp_path / 'helper_module.py').write_text('')  # beside sitecustomize.py, on PYTHONPATH
    env = one_thread_env({'SERVER_TEST': 'set',
                          **patched_env(tmp_path, 'import helper_module\nhelper_module.PATCHED = True')})
    argv = [sys.executable, str(tmp_path / 'scripts' / 'script.py'), mode, '--key=a value']
    assert server.can_run(env)
    forked = server.run(argv, tmp_path, env, timeout=60)
    real = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    last_line = real.stderr.strip().splitlines()[-1]
    assert forked.stderr.strip().splitlines()[-1] == last_line
    assert 'patched True main __main__' in forked.stderr
    assert real.returncode == {'ok': 0, 'exit': 1, 'raise': 1, 'hook': 1}[mode]


def test_a_child_past_its_timeout_is_killed(server, tmp_path):
    (tmp_path / 'script.py').write_text('import sys, time\ntime.sleep(float(sys.argv[1]))\n')
    with pytest.raises(subprocess.TimeoutExpired):
        server.run([sys.executable, str(tmp_path / 'script.py'), '60'], tmp_path, dict(os.environ), timeout=1)
    assert server.run([sys.executable, str(tmp_path / 'script.py'), '0'], tmp_path, dict(os.environ),
                      timeout=60).returncode == 0  # the server goes on


def test_variables_read_at_start_need_a_real_process(server):
    assert not server.can_run({**server.env, 'OMP_NUM_THREADS': '2'})
    assert not server.can_run({**server.env, 'PYTHONHASHSEED': '1'})
    assert server.can_run({**server.env, 'WANDB_MODE': 'offline', 'PYTHONPATH': '/somewhere'})
