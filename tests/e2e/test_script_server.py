"""tests/script_server.py, which most end-to-end runs go through: a forked child gives what `python script` gives, and
torchrun's workers through it what torchrun's own give; TESTS_PLAIN_SUBPROCESS=1 runs scripts without it, alike."""
import os
import re
import subprocess
import sys

import pytest
import torch

import helpers
import script_server
from helpers import (load, logged_losses, one_thread_env, patched_env, run_python, run_torchrun, running_script_server,
                     train)
from script_server import ScriptServer

SCRIPT = """
import os, sys
print('argv', sys.argv[1:], 'cwd', os.getcwd(), 'var', os.environ.get('SERVER_TEST'), 'path0', sys.path[0])
print('main', __name__, file=sys.stderr)
if sys.argv[1] == 'exit':
    sys.exit('error: a one-line message')
if sys.argv[1] == 'raise':
    raise ValueError('uncaught')
if sys.argv[1] == 'hook':
    sys.excepthook = lambda *exc: print('hooked', exc[1], file=sys.stderr)
    raise ValueError('to the hook')
if sys.argv[1] == 'interrupt':
    raise KeyboardInterrupt
if sys.argv[1] == 'at exit':  # a thread still running is joined, then atexit's handlers run, output flushed
    import atexit, threading, time
    atexit.register(print, 'atexit handler', end='')
    threading.Thread(target=lambda: time.sleep(0.2) or print('thread done')).start()
"""


@pytest.fixture(scope='module')
def server():
    server = ScriptServer(one_thread_env())
    yield server
    server.close()


@pytest.mark.parametrize('mode', ['ok', 'exit', 'raise', 'hook', 'interrupt', 'at exit'])
def test_a_child_runs_a_script_as_python_does(server, tmp_path, mode):
    (tmp_path / 'scripts').mkdir()
    (tmp_path / 'scripts' / 'script.py').write_text(SCRIPT)
    env = one_thread_env({'SERVER_TEST': 'set', **patched_env('probe')})
    argv = [sys.executable, str(tmp_path / 'scripts' / 'script.py'), mode, '--key=a value']
    forked = server.run(argv, tmp_path, env, timeout=60)
    real = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
    last_line = real.stderr.strip().splitlines()[-1]
    assert forked.stderr.strip().splitlines()[-1] == last_line
    assert forked.stderr.index('patched; parent process ') < forked.stderr.index('main __main__')  # patches first
    assert real.returncode == {'ok': 0, 'exit': 1, 'raise': 1, 'hook': 1, 'interrupt': -2, 'at exit': 0}[mode]
    assert real.stdout.endswith('thread done\natexit handler') == (mode == 'at exit')


def test_a_child_past_its_timeout_is_killed(server, tmp_path):
    (tmp_path / 'script.py').write_text('import sys, time\ntime.sleep(float(sys.argv[1]))\n')
    with pytest.raises(subprocess.TimeoutExpired):
        server.run([sys.executable, str(tmp_path / 'script.py'), '60'], tmp_path, server.env, timeout=1)
    assert server.run([sys.executable, str(tmp_path / 'script.py'), '0'], tmp_path, server.env,
                      timeout=60).returncode == 0  # the server goes on


def test_variables_read_at_start_need_a_real_process(server, tmp_path):
    (tmp_path / 'script.py').write_text('')
    argv = [sys.executable, str(tmp_path / 'script.py')]
    assert server.run(argv, tmp_path, {**server.env, 'OMP_NUM_THREADS': '2'}, timeout=60) is None
    assert server.run(argv, tmp_path, {**server.env, 'PYTHONHASHSEED': '1'}, timeout=60) is None
    assert server.run(argv, tmp_path, {**server.env, 'WANDB_MODE': 'offline', 'PYTHONPATH': '/somewhere',
                                       'TORCHELASTIC_RUN_ID': 'none'}, timeout=60).returncode == 0


WORKER = """
import os, signal, sys, time
import torch.distributed as dist
rank = int(os.environ['RANK'])
def stop(signum, frame):
    sys.stdout.write(f'rank {rank} stopped by signal {signum}\\n')
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
signal.signal(signal.SIGTERM, stop)
dist.init_process_group('gloo')
# one write, not flushed: torchrun's workers are unbuffered (print's two writes could interleave with the other rank's)
sys.stdout.write(f'rank {rank} of {dist.get_world_size()}: {sys.argv[1:]}\\n')
if rank == 1:
    open(sys.argv[1], 'w').close()
    time.sleep(60)  # until torchrun stops it
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
sys.exit(3)
"""


def test_torchrun_workers_run_as_torchruns_own(tmp_path, monkeypatch):
    """Rank 0 fails once rank 1 has printed; torchrun stops rank 1 with SIGTERM, which the worker passes on."""
    monkeypatch.delenv(helpers.PLAIN_SUBPROCESS, raising=False)  # the server's workers, whatever the switch
    (tmp_path / 'worker.py').write_text(WORKER)
    words = ['--standalone', '--nproc_per_node=2', 'worker.py', str(tmp_path / 'printed')]
    served = run_torchrun(*words, cwd=tmp_path, timeout=120)
    os.remove(tmp_path / 'printed')
    real = subprocess.run([sys.executable, '-m', 'torch.distributed.run', *words], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=one_thread_env())
    assert served.returncode == real.returncode == 1
    assert sorted(served.stdout.splitlines()) == sorted(real.stdout.splitlines()) == [
        *(f"rank {rank} of 2: ['{tmp_path / 'printed'}']" for rank in (0, 1)), 'rank 1 stopped by signal 15']
    exitcodes = [re.findall(r'rank +: (\d).*\n +exitcode +: (\S+)', result.stderr) for result in (served, real)]
    assert sorted(exitcodes[0]) == sorted(exitcodes[1]) == [('0', '3'), ('1', '-15')]


def test_a_torchrun_worker_without_the_server_is_torchruns_own(tmp_path):
    """No server, or a variable read at start set: `python -u script`, torch not imported beforehand."""
    (tmp_path / 'script.py').write_text("import sys\nprint('torch' in sys.modules, end='')\nsys.exit(4)\n")
    worker = [sys.executable, '-S', script_server.__file__, 'worker', 'script.py']
    for env in ({}, {'OMP_NUM_THREADS': '2', script_server.ADDRESS: running_script_server().address}):
        result = subprocess.run(worker, cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                env=one_thread_env(env))
        assert (result.returncode, result.stdout) == (4, 'False')


def test_the_plain_subprocess_switch_runs_train_py_as_the_server_does(tmp_path, data_dir, monkeypatch):
    """TESTS_PLAIN_SUBPROCESS=1: train.py, patched, a child of pytest's own process (one that breakpoint() can stop),
    with the losses and weights of a run forked by the script server."""
    runs = {}
    for plain in ('0', '1'):
        monkeypatch.setenv(helpers.PLAIN_SUBPROCESS, plain)
        runs[plain] = train(data_dir, tmp_path / plain, '--max_iters=4', '--eval_interval=2', env=patched_env('probe'))
        assert runs[plain].returncode == 0, runs[plain].stderr
    parents = {plain: int(re.search(r'patched; parent process (\d+)', run.stderr)[1]) for plain, run in runs.items()}
    assert parents['1'] == os.getpid() != parents['0']
    assert sorted(logged_losses(runs['1'].stdout)) == [0, 1, 2, 3, 4]
    assert logged_losses(runs['1'].stdout) == logged_losses(runs['0'].stdout)
    assert logged_losses(runs['1'].stdout, 'step') == logged_losses(runs['0'].stdout, 'step')
    weights = [load(tmp_path / plain)['model'] for plain in runs]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_a_compile_in_the_tests_process_leaves_the_runs_forked(tmp_path, monkeypatch):
    """torch.compile sets variables in the process that runs it, read at torch's start; the runs that follow do not
    inherit them, and stay children of the script server rather than real processes."""
    monkeypatch.delenv(helpers.PLAIN_SUBPROCESS, raising=False)
    running_script_server()  # started before the compile, as in a session whose runs come before and after one
    torch.compile(lambda x: x + 1)(torch.zeros(2))
    (tmp_path / 'script.py').write_text('')
    result = run_python(tmp_path / 'script.py', env=patched_env('probe'))
    assert result.returncode == 0, result.stderr
    assert int(re.search(r'patched; parent process (\d+)', result.stderr)[1]) != os.getpid()
