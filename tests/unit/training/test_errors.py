"""training/errors.py: the scripts' one error path, and fail()'s one line under torchrun."""
import os
import subprocess
import sys

import pytest

from helpers import ROOT
from training.errors import fail


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


@pytest.mark.parametrize('rank, every_rank, printed', [('0', False, 'error: bad\n'),
                                                        ('1', False, 'error: rank 1: bad\n'),
                                                        ('1', True, 'error: rank 1: bad\n')])
def test_fail_names_the_rank_where_the_error_is_the_ranks_own(rank, every_rank, printed):
    """Rank 1 waits for torchrun to stop it once rank 0 has printed the same error (not waited for here)."""
    code = f'from training import errors; errors.OTHER_RANKS_WAIT = 0; errors.fail("bad", every_rank={every_rank})'
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, 'RANK': rank, 'WORLD_SIZE': '2'})
    assert (result.returncode, result.stderr) == (2, printed)


def test_an_error_line_is_one_write_so_ranks_sharing_stderr_do_not_interleave(monkeypatch):
    """Unbuffered (PYTHONUNBUFFERED=1), each write of stderr is a write to the file torchrun's ranks share: print's
    text and newline are two, and another rank's line could land between them ('error: rank 0: ...error: rank 1:')."""
    writes = []
    monkeypatch.setattr(sys, 'stderr', type('Unbuffered', (), {'write': lambda self, text: writes.append(text),
                                                              'flush': lambda self: None})())
    with pytest.raises(SystemExit):
        fail('bad')
    assert writes == ['error: bad\n']


def test_ctrl_c_is_one_line_and_the_shells_status_130_until_a_script_says_more(capsys):
    from training import errors
    errors.install_handler()
    assert errors.report_failure(KeyboardInterrupt()) == 130
    errors.on_error(KeyboardInterrupt, lambda e: ('interrupted at iter 3', {'status': errors.INTERRUPTED_STATUS}))
    assert errors.report_failure(KeyboardInterrupt()) == 130
    assert errors.report_failure(errors.ConfigError('bad key')) == 2
    assert capsys.readouterr().err == 'error: interrupted\nerror: interrupted at iter 3\nerror: bad key\n'


def test_what_every_rank_has_at_once_is_said_by_rank_0_alone_and_no_rank_waits(capsys, monkeypatch):
    """Ctrl-C reaches every rank of a torchrun: rank 0's line is the one, at once; the others end without a word,
    where a failure of their own would wait OTHER_RANKS_WAIT for torchrun first."""
    from training import errors
    monkeypatch.setattr(errors.time, 'sleep', lambda seconds: pytest.fail('a rank waited'))
    monkeypatch.setenv('WORLD_SIZE', '2')
    for rank, said in (('0', 'error: interrupted at iter 3\n'), ('1', '')):
        monkeypatch.setenv('RANK', rank)
        errors.report('interrupted at iter 3', every_rank_has_it=True)
        assert capsys.readouterr().err == said
