"""prepare/shakespeare.py and prepare/shakespeare_char.py on a small corpus: nanoGPT's file formats, round trips,
and one-line errors. No network: BPE goes through a tiny tiktoken Encoding; the gpt2 check runs only when
tiktoken's gpt2 files are cached (TIKTOKEN_CACHE_DIR)."""
import numpy as np
import pytest

from helpers import EOT, gpt2_cached, tiny_encoding
from prepare import common, shakespeare, shakespeare_char
from training import data
from training.errors import ConfigError
from training.meta import load_meta


CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n"
          "Caf\u00e9 \u00e0 la th\u00e9\u00e2tre.\n") * 3


def read_bin(path):
    assert path.stat().st_size % 2 == 0
    return np.fromfile(path, dtype=np.uint16)


def test_char_outputs_round_trip(tmp_path):
    n_train, n_val = shakespeare_char.prepare(CORPUS, tmp_path)
    assert (n_train, n_val) == (int(len(CORPUS) * 0.9), len(CORPUS) - int(len(CORPUS) * 0.9))
    meta = load_meta(str(tmp_path / 'meta.pkl'))  # as train.py and sample.py read it
    assert set(meta) == {'vocab_size', 'itos', 'stoi'}
    assert meta['vocab_size'] == len(set(CORPUS))
    assert [meta['itos'][i] for i in range(meta['vocab_size'])] == sorted(set(CORPUS))
    assert all(meta['itos'][i] == ch for ch, i in meta['stoi'].items())
    train, val = read_bin(tmp_path / 'train.bin'), read_bin(tmp_path / 'val.bin')
    assert (len(train), len(val)) == (n_train, n_val)
    assert ''.join(meta['itos'][int(i)] for i in np.concatenate([train, val])) == CORPUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ['meta.pkl', 'train.bin', 'val.bin']


def test_failed_download_keeps_existing_outputs(tmp_path, monkeypatch):
    def unreachable(url, timeout):
        raise OSError('network is unreachable')
    monkeypatch.setattr(data.urllib.request, 'urlopen', unreachable)
    (tmp_path / 'train.bin').write_bytes(b'old')
    with pytest.raises(ConfigError, match='--input PATH'):
        shakespeare_char.main(['--out_dir', str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin']
    assert (tmp_path / 'train.bin').read_bytes() == b'old'


def test_too_short_input_is_an_error(tmp_path):
    with pytest.raises(common.PrepareError, match='too few to split'):
        shakespeare_char.prepare('a', tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_bpe_outputs_round_trip(tmp_path):
    enc = tiny_encoding()
    n_train, n_val = shakespeare.prepare(CORPUS, tmp_path, enc)
    cut = int(len(CORPUS) * 0.9)
    train, val = read_bin(tmp_path / 'train.bin'), read_bin(tmp_path / 'val.bin')
    assert train.tolist() == enc.encode_ordinary(CORPUS[:cut]) and len(train) == n_train
    assert val.tolist() == enc.encode_ordinary(CORPUS[cut:]) and len(val) == n_val
    assert max(train) >= 256  # the merges were used
    assert enc.decode(np.concatenate([train, val]).tolist()) == CORPUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin', 'val.bin']


def test_bpe_outputs_over_a_character_dataset_remove_its_meta(tmp_path, capsys):
    """The character set's meta.pkl beside BPE ids would give train.py the wrong vocabulary: it goes, said so."""
    shakespeare_char.prepare(CORPUS, tmp_path)
    shakespeare.prepare(CORPUS, tmp_path, tiny_encoding())
    assert f"removed {tmp_path / 'meta.pkl'}, another dataset's vocabulary" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin', 'val.bin']


def test_vocabulary_too_large_for_uint16_writes_nothing(tmp_path):
    with pytest.raises(common.PrepareError, match='uint16'):
        shakespeare.prepare(CORPUS, tmp_path, tiny_encoding(special_id=70000))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not gpt2_cached(), reason="tiktoken's gpt2 files are not cached (set TIKTOKEN_CACHE_DIR)")
def test_gpt2_encoding(tmp_path):
    enc = data.get_encoding('gpt2')
    assert enc.encode_ordinary('hello world') == [31373, 995] and enc.eot_token == EOT
    shakespeare.prepare(CORPUS, tmp_path, enc)
    ids = np.concatenate([read_bin(tmp_path / 'train.bin'), read_bin(tmp_path / 'val.bin')])
    assert enc.decode(ids.tolist()) == CORPUS
