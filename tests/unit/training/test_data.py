"""training/data.py: atomic output files, tiktoken encodings' one-line errors, the sequential batch order."""
from pathlib import Path

import numpy as np
import pytest
import tiktoken
import torch

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


def test_sequential_offsets_read_every_token_once_in_order_then_start_again():
    """A file of 35 tokens holds 4 whole windows of 8 (and each one's next-token target): rows 0..3 cover tokens 0..32
    in order, row 4 is row 0 again; rows asked for in pieces are the same rows."""
    assert data.sequential_offsets(35, 8, 0, 6).tolist() == [0, 8, 16, 24, 0, 8]
    assert data.sequential_offsets(33, 8, 0, 5).tolist() == [0, 8, 16, 24, 0]  # 33 = 4 * 8 + 1: still 4 windows
    assert data.sequential_offsets(32, 8, 0, 4).tolist() == [0, 8, 16, 0]  # the 4th has no last target
    pieces = np.concatenate([data.sequential_offsets(1000, 8, first, 3) for first in range(0, 300, 3)])
    assert pieces.tolist() == data.sequential_offsets(1000, 8, 0, 300).tolist()


def test_a_batch_with_a_token_past_the_vocabulary_names_the_file_and_the_token():
    x, y = torch.tensor([[3, 1], [0, 2]]), torch.tensor([[1, 4], [2, 3]])
    data.check_tokens('data/x/val.bin', 5, x, y)  # 0 to 4: every one has an embedding
    with pytest.raises(ConfigError, match=r"data/x/val.bin holds token 4, but the model's vocabulary has 4 tokens "
                                          r"\(0 to 3\)"):
        data.check_tokens('data/x/val.bin', 4, x, y)
    with pytest.raises(ConfigError, match='holds token 3'):  # an input token alone (the first of a row) counts
        data.check_tokens('data/x/val.bin', 3, x, y[:, :1])
