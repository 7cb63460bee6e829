"""training/errors.py: the scripts' one error path."""
import subprocess
import sys

import pytest

from helpers import ROOT

SCRIPT = '''
from training import errors
errors.install_handler()

class Custom(Exception):
    pass

errors.on_error(Custom, lambda e: None if 'not mine' in str(e) else f'explained: {e}')
print('before')
{raise_line}
'''


@pytest.mark.parametrize('raise_line, status, stderr', [
    ("raise errors.ConfigError('bad key: use --key=1')", 2, 'error: bad key: use --key=1\n'),
    ("raise Custom('out of something')", 2, 'error: explained: out of something\n'),
    ("raise Custom('not mine')", 1, 'Traceback'),
    ("raise KeyError('other')", 1, 'Traceback'),
])
def test_an_uncaught_error_a_handler_explains_is_one_line_and_status_2(raise_line, status, stderr):
    result = subprocess.run([sys.executable, '-c', SCRIPT.replace('{raise_line}', raise_line)], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == status, result.stderr
    assert result.stdout == 'before\n'  # flushed before the exit
    if status == 2:
        assert result.stderr == stderr
    else:
        assert result.stderr.startswith(stderr) and 'error: ' not in result.stderr


def test_install_handler_drops_the_handlers_of_an_earlier_install():
    from training import errors
    errors.install_handler()
    errors.on_error(KeyError, lambda e: 'explained')
    errors.install_handler()
    assert not errors.report_failure(KeyError('x'))
