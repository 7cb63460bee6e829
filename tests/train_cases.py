"""`python tests/train_cases.py CASES`: train.py run once per case inside this one process, as `python train.py ...`
would run it (a fresh __main__ each time, stdout and stderr captured, the exit status from SystemExit or from what the
error handler of training.errors.install_handler does), so that torch and the repository are imported once, not per
case. CASES: a JSON list of [argv, environment] pairs; prints a JSON list of [exit status, stderr], one a case."""
import contextlib
import io
import json
import os
import runpy
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT  # train.py's folder, as `python train.py` has it
from training import errors  # noqa: E402 (after the path it needs)

results = []
for argv, env in json.loads(sys.argv[1]):
    saved_env = dict(os.environ)
    os.environ.update(env)
    sys.argv = ['train.py', *argv]
    stderr, status = io.StringIO(), 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException as e:  # what the excepthook of training.errors.install_handler does, short of exiting
            status = errors.report_failure(e) or 1
            if status == 1:
                traceback.print_exc()
    os.environ.clear()
    os.environ.update(saved_env)
    results.append((status, stderr.getvalue()))
print(json.dumps(results))
