"""The end-to-end tests' fast path. A Python that has imported torch (seconds, the most of a tiny run) forks a child for
each script run, and the child runs it as `python script args` (or `python -m module args`) would: its argv,
directory, environment, stdin, stdout and stderr (the caller's own file descriptors), the same exit status and
uncaught-exception handling, and it ends as Python's exit does, short of the teardown of its modules
(exit_as_python_does). Its callers: ScriptServer.run (helpers.run_script, and torchrun's launcher in
helpers.run_torchrun), and torchrun's workers, each `python -S script_server.py worker script args` in place of
torchrun's `python -u script args`: it passes torchrun's signals on to its child, and ends as the child did.

What a child does not do again is torch's import: environment variables read then (PYTHON*, OMP_*, MKL_*, TORCH*,
CUDA*) are the server's own, so a run that sets them is refused and runs as a real process (run_script and the worker
fall back); but PYTHONPATH, which the child applies as Python's start does, sitecustomize.py included
(tests/patches/sitecustomize.py), and torchrun's variables for its workers, which torch.distributed reads when it runs.

The server imports nothing of this repository: each child imports the scripts' modules afresh, as a new process would.
It never runs a torch operation nor starts a thread, so its children fork from a process without threads."""
import atexit
import io
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

READ_AT_START = ('PYTHON', 'OMP_', 'MKL_', 'TORCH', 'CUDA')  # environment variables: by Python or by torch's import
READ_WHEN_USED = ('PYTHONPATH', 'TORCHELASTIC_', 'TORCH_NCCL_')
ADDRESS = 'SCRIPT_SERVER'  # the environment variable that gives torchrun's workers the server's socket
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)  # what torchrun stops its workers with


def read_at_start_differences(env, own):
    """The variables read at start whose values in `env` are not those of `own`, the server's environment."""
    return sorted(key for key in {*env, *own} if key.startswith(READ_AT_START) and not key.startswith(READ_WHEN_USED)
                  and env.get(key) != own.get(key))


class ScriptServer:
    """Starts the server; run() runs a script through it."""

    def __init__(self, env):
        self.env = env
        self.address = os.path.join(tempfile.mkdtemp(prefix='script-server-'), 'socket')
        self.process = subprocess.Popen([sys.executable, __file__, 'serve', self.address], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.process.stdout.readline() == 'listening\n', 'the script server did not start'

    def run(self, argv, cwd, env, timeout):
        """subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout), argv being
        [sys.executable, script, ...] or [sys.executable, '-m', module, ...]; None where env needs a real process."""
        with tempfile.TemporaryDirectory() as directory:
            paths = os.devnull, os.path.join(directory, 'stdout'), os.path.join(directory, 'stderr')
            files = [open(path, mode) for path, mode in zip(paths, 'rww')]
            with files[0], files[1], files[2]:
                answer = request(self.address, dict(argv=argv[1:], cwd=str(cwd), env=env, timeout=timeout),
                                 [f.fileno() for f in files])
            if answer is None:
                return None
            with open(paths[1]) as stdout, open(paths[2]) as stderr:
                output = stdout.read(), stderr.read()
        if answer['returncode'] is None:
            raise subprocess.TimeoutExpired(argv, timeout, *output)
        return subprocess.CompletedProcess(argv, answer['returncode'], *output)

    def close(self):
        self.process.stdin.close()  # the server's cue to end
        self.process.wait()
        shutil.rmtree(os.path.dirname(self.address))


def request(address, run, fds, on_pid=None, while_alive=lambda: True):
    """Send the server `run` (argv, cwd, env, timeout, unbuffered) with fds as the child's stdin, stdout, stderr; call
    on_pid with the child's pid once it runs. The server's last answer: {'returncode': its exit status, None at its
    timeout}; None where it refused the run. Should while_alive() turn false while waiting, the server kills the
    child."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(address)
        socket.send_fds(connection, [b'.'], fds)
        connection.sendall(json.dumps(run).encode() + b'\n')
        received = b''
        while True:
            if select.select([connection], [], [], 1.0)[0]:
                data = connection.recv(65536)
                if not data:
                    raise ConnectionError('the script server ended during a run')
                received += data
            elif not while_alive():
                sys.exit(1)
            while b'\n' in received:
                line, received = received.split(b'\n', 1)
                answer = json.loads(line)
                if 'pid' not in answer:
                    return None if 'refused' in answer else answer
                if on_pid:
                    on_pid(answer['pid'])


def serve(address, own_env):
    """Accept runs on the socket at `address` until stdin closes, each watched by a forked monitor (run_child), which
    refuses those whose variables read at start are not those of own_env. In the child, returns its run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    print('listening', flush=True)
    while True:
        readable = select.select([listener, sys.stdin], [], [], 1.0)[0]
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:  # monitors that are done
                pass
        except ChildProcessError:
            pass
        if sys.stdin in readable:  # nothing is written there: it closed
            sys.exit(0)
        if listener in readable:
            connection = listener.accept()[0]
            if os.fork() == 0:
                listener.close()
                return run_child(connection, own_env)
            connection.close()


def run_child(connection, own_env):
    """The monitor: receive a run, fork its child, answer its pid, then its exit status; kill it (its process group)
    at its timeout or when the caller is gone. In the child, returns the run."""
    _, fds, _, _ = socket.recv_fds(connection, 1, 3)
    received = b''
    while not received.endswith(b'\n'):
        received += connection.recv(65536)
    run = json.loads(received)
    refused = read_at_start_differences(run['env'], own_env)
    if refused:
        connection.sendall(json.dumps({'refused': refused}).encode() + b'\n')
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)  # its own process group: a kill reaches what it started too
        connection.close()
        for fd, received_fd in enumerate(fds):
            os.dup2(received_fd, fd)
            os.close(received_fd)
        return run
    for fd in fds:
        os.close(fd)
    connection.sendall(json.dumps({'pid': pid}).encode() + b'\n')
    deadline = time.monotonic() + run['timeout'] if run['timeout'] else float('inf')
    while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
        caller_gone = select.select([connection], [], [], 0.005)[0]  # it sends nothing more: readable is closed
        if caller_gone or time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
    answer = {'returncode': os.waitstatus_to_exitcode(status[1]) if status[0] else None}
    try:
        connection.sendall(json.dumps(answer).encode() + b'\n')
    except OSError:
        pass  # the caller is gone
    os._exit(0)


def torchrun_worker(script_args):
    """torchrun's worker `python -u script args`, run by the server at $SCRIPT_SERVER where it can: torchrun's signals
    go to the child, and this process ends as the child did (its exit status, or its signal); it stops the child
    should torchrun die. Without a server, or where the server refuses the run, it becomes that command."""
    env = dict(os.environ)
    address = env.pop(ADDRESS, None)
    child, pending = [], []

    def forward(signum, frame):
        try:
            os.killpg(child[0], signum) if child else pending.append(signum)
        except ProcessLookupError:
            pass  # it has just ended

    def started(pid):
        child.append(pid)
        for signum in pending:
            forward(signum, None)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    launcher = os.getppid()
    run = dict(argv=script_args, cwd=os.getcwd(), env=env, timeout=None, unbuffered=True)
    answer = address and request(address, run, [0, 1, 2], started, lambda: os.getppid() == launcher)
    if not answer:
        os.execve(sys.executable, [sys.executable, '-u', *script_args], env)
    if answer['returncode'] < 0:
        signal.signal(-answer['returncode'], signal.SIG_DFL)
        os.kill(os.getpid(), -answer['returncode'])
    sys.exit(answer['returncode'])


def unbuffered(stream):
    """`stream` as `python -u` opens it: every write goes to its file descriptor at once."""
    return io.TextIOWrapper(io.FileIO(stream.fileno(), 'w', closefd=False), encoding=stream.encoding,
                            errors=stream.errors, write_through=True)


def exit_as_python_does(status):
    """End the child as Python's exit does, short of tearing down its modules: threads joined, atexit's handlers run,
    stdout and stderr flushed. Tearing down torch's modules in a forked child copies every page of the server's objects
    it touches, which takes longer than a tiny training run, for nothing a script can rely on (Python does not promise
    to finalize the objects alive at exit)."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if status == -signal.SIGINT:  # an uncaught KeyboardInterrupt: Python ends by the signal
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def system_exit_status(e):
    """The exit status of an uncaught SystemExit, its message (neither None nor an int) printed as Python does."""
    if e.code is None or isinstance(e.code, int):
        return e.code or 0
    print(e.code, file=sys.stderr)
    return 1


if __name__ == '__main__':
    if sys.argv[1] == 'worker':
        torchrun_worker(sys.argv[2:])
    import gc
    import importlib
    import runpy
    import site
    own_env = dict(os.environ)  # as it started: torch's import sets some (TORCHINDUCTOR_CACHE_DIR)
    importlib.import_module('torch._dynamo')  # torch, and its compiler, which every torch optimizer imports when built
    gc.freeze()  # the children's collections pass over the server's objects: no copy of their pages
    run = serve(sys.argv[2], own_env)
    os.chdir(run['cwd'])
    os.environ.clear()
    os.environ.update(run['env'])
    sys.argv = run['argv']
    if run.get('unbuffered'):
        sys.stdout = sys.__stdout__ = unbuffered(sys.stdout)
        sys.stderr = sys.__stderr__ = unbuffered(sys.stderr)
    # as Python starts: PYTHONPATH's folders, sitecustomize, then the script's folder (python -m: the current one)
    # first, instead of the server's
    sys.path[0:1] = [path for path in run['env'].get('PYTHONPATH', '').split(os.pathsep)
                     if path and path not in sys.path]
    site.execsitecustomize()
    try:
        if sys.argv[0] == '-m':
            sys.path.insert(0, os.getcwd())
            sys.argv = sys.argv[1:]
            runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
            runpy.run_path(sys.argv[0], run_name='__main__')
        exit_status = 0
    except SystemExit as e:
        exit_status = system_exit_status(e)
    except BaseException as e:  # uncaught: the traceback, or what the script's sys.excepthook makes of it
        sys.excepthook(type(e), e, e.__traceback__)
        exit_status = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
    exit_as_python_does(exit_status)
