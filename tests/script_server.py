"""run_script's fast path. A Python that has imported torch (seconds, the most of a tiny run) forks a child for each
script run, and the child runs it as `python script args` would: its argv, directory, environment, stdin from
/dev/null, stdout and stderr to files, the same exit status and uncaught-exception handling. What a child does
not do again is torch's import: environment variables read then (PYTHON*, OMP_*, MKL_*, TORCH*, CUDA*) are the
server's own, so a run that sets them goes through a real subprocess (helpers.run_script decides); but for
PYTHONPATH, which the child applies as Python's start does, sitecustomize.py included (helpers.patched_env's).

The server imports nothing of this repository: each child imports the scripts' modules afresh, as a new process
would. It never runs a torch operation, so its children fork from a process without threads."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

READ_AT_START = ('PYTHON', 'OMP_', 'MKL_', 'TORCH', 'CUDA')  # environment variables: by Python or by torch's import
APPLIED_BY_THE_CHILD = ('PYTHONPATH',)


class ScriptServer:
    """The client: run() sends the server a run and waits for its exit status."""

    def __init__(self, env):
        self.env = env
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=env)

    def can_run(self, env):
        """Whether a run in environment `env` can be a child of the server: env has the server's values of what is
        read at start."""
        return all(env.get(key) == self.env.get(key) for key in {*env, *self.env}
                   if key.startswith(READ_AT_START) and key not in APPLIED_BY_THE_CHILD)

    def run(self, argv, cwd, env, timeout):
        """subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout), argv[0] being
        sys.executable and argv[1] the script."""
        with tempfile.TemporaryDirectory() as directory:
            out, err = os.path.join(directory, 'stdout'), os.path.join(directory, 'stderr')
            request = dict(argv=argv[1:], cwd=str(cwd), env=env, stdout=out, stderr=err, timeout=timeout)
            self.process.stdin.write(json.dumps(request) + '\n')
            self.process.stdin.flush()
            returncode = json.loads(self.process.stdout.readline())
            with open(out) as stdout, open(err) as stderr:
                output = stdout.read(), stderr.read()
        if returncode is None:
            raise subprocess.TimeoutExpired(argv, timeout, *output)
        return subprocess.CompletedProcess(argv, returncode, *output)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def serve():
    """Fork a child for each request line; answer each with its exit status (None: killed at its timeout). In the
    child, returns the request."""
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)  # its own process group: a timeout kills what it started too
            return request
        deadline = time.monotonic() + request['timeout']
        while (status := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        if status[0] == 0:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print('null', flush=True)
        else:
            print(json.dumps(os.waitstatus_to_exitcode(status[1])), flush=True)
    sys.exit(0)


if __name__ == '__main__':
    import importlib
    import site
    importlib.import_module('torch._dynamo')  # torch, and its compiler, which every torch optimizer imports when built
    request = serve()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request['stdout'], os.O_WRONLY | os.O_CREAT),
                            (2, request['stderr'], os.O_WRONLY | os.O_CREAT)):
        os.dup2(os.open(path, flags), fd)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    sys.argv = request['argv']
    # as Python starts: PYTHONPATH's folders, sitecustomize, then the script's folder first (instead of the server's)
    sys.path[0:1] = [path for path in request['env'].get('PYTHONPATH', '').split(os.pathsep)
                     if path and path not in sys.path]
    site.execsitecustomize()
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
    import runpy
    runpy.run_path(sys.argv[0], run_name='__main__')
