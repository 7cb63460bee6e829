"""prepare/common.py: the scripts' main, Ctrl-C included."""
import pytest

from prepare import common


def test_an_error_while_cleaning_up_after_ctrl_c_is_the_interrupt(capsys):
    """datasets' map with num_proc > 1 raises a TimeoutError as it closes the worker pool that Ctrl-C stopped."""
    def main():
        try:
            raise KeyboardInterrupt
        finally:
            raise TimeoutError
    with pytest.raises(SystemExit) as exit_:
        common.run_main(main)
    assert exit_.value.code == 130 and capsys.readouterr().err == ('interrupted: no output written, temporary files '
                                                                   'removed\n')
    with pytest.raises(TimeoutError):
        common.run_main(lambda: (_ for _ in ()).throw(TimeoutError()))
