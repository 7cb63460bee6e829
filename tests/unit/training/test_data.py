"""training/data.py: atomic output files and tiktoken encodings' one-line errors."""
from pathlib import Path

import pytest
import tiktoken

from training import data
from training.errors import ConfigError


def test_atomic_files_replace_all_or_nothing(tmp_path):
    paths = [tmp_path / 'train.bin', tmp_path / 'val.bin']
    for path in paths:
        path.write_bytes(b'old')
    with pytest.raises(RuntimeError):
        with data.atomic_files(*paths) as tmps:
            Path(tmps[0]).write_bytes(b'new')
            raise RuntimeError('interrupted after the first file')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin', 'val.bin']
    assert all(path.read_bytes() == b'old' for path in paths)
    with data.atomic_files(*paths) as tmps:
        for tmp in tmps:
            Path(tmp).write_bytes(b'new')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin', 'val.bin']
    assert all(path.read_bytes() == b'new' for path in paths)


def test_encoding_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="'gpt3' is not a tiktoken encoding; choose one of: .*gpt2"):
        data.get_encoding('gpt3')

    def offline(name):
        raise ConnectionError('Failed to resolve openaipublic.blob.core.windows.net\nsecond line')
    monkeypatch.setattr(tiktoken, 'get_encoding', offline)
    with pytest.raises(ConfigError) as info:
        data.get_encoding('gpt2')
    assert 'TIKTOKEN_CACHE_DIR' in str(info.value) and '\n' not in str(info.value)
