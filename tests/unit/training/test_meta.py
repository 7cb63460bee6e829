"""training/meta.py: a dataset's meta.pkl is read without running code; nanoGPT's own meta.pkl loads as before."""
import pickle
import re

import pytest

from helpers import write_char_dataset
from training import rules
from training.errors import ConfigError
from training.meta import characters, load_meta


class WritesAFile:
    """What a malicious meta.pkl carries: unpickling it calls open(path, 'w'), which creates the file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, 'w')


def test_nanogpt_meta_loads(tmp_path):
    path = write_char_dataset(tmp_path) / 'meta.pkl'
    meta = load_meta(str(path))
    with open(path, 'rb') as f:
        assert meta == pickle.load(f)
    assert meta['itos'][meta['stoi']['F']] == 'F' and meta['vocab_size'] == len(meta['stoi'])


@pytest.mark.parametrize('protocol', [0, pickle.HIGHEST_PROTOCOL])
def test_a_pickle_that_runs_code_is_refused_and_nothing_runs(tmp_path, protocol):
    target = tmp_path / 'pwned'
    path = tmp_path / 'meta.pkl'
    path.write_bytes(pickle.dumps({'vocab_size': 65, 'payload': WritesAFile(str(target))}, protocol=protocol))
    with pytest.raises(ConfigError) as e:
        load_meta(str(path))
    assert not target.exists()
    message = str(e.value)
    assert '\n' not in message and re.fullmatch(rf'{re.escape(str(path))} refers to (builtins|io)\.open, but a '
                                                  rf'meta\.pkl holds only plain data .*', message)


def test_train_rules_refuse_a_malicious_meta(tmp_path):
    """train.py and estimate_memory.py read the vocabulary size through rules.meta_vocab_size."""
    target = tmp_path / 'pwned'
    (tmp_path / 'evil').mkdir()
    (tmp_path / 'evil' / 'meta.pkl').write_bytes(pickle.dumps({'vocab_size': WritesAFile(str(target))}))
    with pytest.raises(ConfigError, match=r'refers to (builtins|io)\.open'):
        rules.meta_vocab_size({'data_dir': str(tmp_path), 'dataset': 'evil'})
    assert not target.exists()


@pytest.mark.parametrize('content, message', [(b'\x80\x04not a pickle', 'cannot read'),
                                              (pickle.dumps([1, 2]), 'holds a list, not the dict')])
def test_a_damaged_meta_is_one_line(tmp_path, content, message):
    (tmp_path / 'meta.pkl').write_bytes(content)
    with pytest.raises(ConfigError, match=message) as e:
        load_meta(str(tmp_path / 'meta.pkl'))
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('vocab_size', [0, -5])
def test_a_vocabulary_without_tokens_is_one_line(tmp_path, vocab_size):
    write_char_dataset(tmp_path, 'none', vocab_size=1)
    with open(tmp_path / 'none' / 'meta.pkl', 'wb') as f:
        pickle.dump({'vocab_size': vocab_size}, f)
    with pytest.raises(ConfigError, match=f'has vocab_size {vocab_size}, but a vocabulary has at least one token'):
        rules.meta_vocab_size({'data_dir': str(tmp_path), 'dataset': 'none'})


def test_characters_are_the_models_vocabulary_or_gpt2s(tmp_path):
    """sample.py's and export_hf.py's reading of a checkpoint's meta.pkl: the characters of a vocabulary of the
    model's size (a meta.pkl may pad it beyond its characters, as train.py builds the model with its vocab_size);
    none (GPT-2's BPE) without a meta.pkl, where the model has GPT-2's tokens at least."""
    path = write_char_dataset(tmp_path, text='abcab') / 'meta.pkl'
    stoi, itos = characters(str(path), 3)
    assert stoi == {'a': 0, 'b': 1, 'c': 2} and itos == {0: 'a', 1: 'b', 2: 'c'}
    for vocab_size in (2, 65):  # sampled tokens without a character; prompts' without an embedding
        with pytest.raises(ConfigError, match=f"has vocab_size 3 but the model's is {vocab_size}: it is not the "
                                              f"dataset this model was trained on"):
            characters(str(path), vocab_size)
    assert characters(str(write_char_dataset(tmp_path, 'padded', text='abcab', vocab_size=8) / 'meta.pkl'),
                      8) == (stoi, itos)
    with open(path, 'wb') as f:
        pickle.dump({'vocab_size': 3, 'stoi': stoi}, f)
    with pytest.raises(ConfigError, match="has no 'itos' \\(a vocabulary of characters\\)"):
        characters(str(path), 3)
    assert characters(None, 50304) is None and characters(str(tmp_path / 'absent.pkl'), 50257) is None
    with pytest.raises(ConfigError, match="the model's vocab_size is 65, too small for GPT-2's tokens, and its "
                                          "dataset's meta.pkl \\(none recorded\\) is not there"):
        characters(None, 65)
