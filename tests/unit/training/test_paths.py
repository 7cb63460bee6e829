"""training/paths.py: the out_dir check."""
import os

import pytest

from training.errors import ConfigError
from training.paths import check_writable_dir


def test_writable_dir_check_leaves_nothing_behind(tmp_path):
    check_writable_dir(str(tmp_path / 'new' / 'deeper'))
    check_writable_dir(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / 'file').write_text('x')
    with pytest.raises(ConfigError, match=f"out_dir='{tmp_path / 'file' / 'out'}' cannot be a directory: "
                                          f"{tmp_path / 'file'} is a file"):
        check_writable_dir(str(tmp_path / 'file' / 'out'))
    with pytest.raises(ConfigError, match='out_dir is empty'):
        check_writable_dir('')


@pytest.mark.skipif(not os.path.isdir('/proc/self'), reason='needs Linux /proc, where nobody, root included, writes')
def test_unwritable_dir_is_refused_even_as_root():
    with pytest.raises(ConfigError, match="cannot write in out_dir='/proc/nanogpt_out'"):
        check_writable_dir('/proc/nanogpt_out')
