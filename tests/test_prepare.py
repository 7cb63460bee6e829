"""prepare/ scripts on small corpora written here: nanoGPT's file formats, round trips, and one-line errors.

No network: BPE goes through a tiny tiktoken Encoding built here; gpt2 checks run only when tiktoken's gpt2 files
are already cached (e.g. TIKTOKEN_CACHE_DIR pointing at them)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from helpers import EOT, ROOT, gpt2_cached, tiny_encoding
from prepare import common, openwebtext, shakespeare, shakespeare_char  # noqa: E402
from training import data  # noqa: E402
from training.errors import ConfigError  # noqa: E402
from training.meta import load_meta

CORPUS = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
          "First Citizen:\nYou are all resolved rather to die than to famish?\n"
          "Caf\u00e9 \u00e0 la th\u00e9\u00e2tre.\n") * 3


def read_bin(path):
    assert path.stat().st_size % 2 == 0
    return np.fromfile(path, dtype=np.uint16)


def run_script(name, *args, cwd):
    return subprocess.run([sys.executable, str(ROOT / 'prepare' / f'{name}.py'), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


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


def test_char_script_runs_from_any_directory(tmp_path):
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text(CORPUS, encoding='utf-8')
    result = run_script('shakespeare_char', '--input', str(corpus), '--out_dir', 'out', cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f'length of dataset in characters: {len(CORPUS):,}' in result.stdout
    assert f'vocab size: {len(set(CORPUS)):,}' in result.stdout
    assert f'train has {int(len(CORPUS) * 0.9):,} tokens' in result.stdout
    assert len(read_bin(tmp_path / 'out' / 'train.bin')) + len(read_bin(tmp_path / 'out' / 'val.bin')) == len(CORPUS)


def test_default_out_dir_is_data_in_the_current_directory(tmp_path):
    """Where train.py, run from the same directory, reads --dataset=shakespeare_char (every path is relative to the
    current directory)."""
    corpus = tmp_path / 'corpus.txt'
    corpus.write_text(CORPUS, encoding='utf-8')
    result = run_script('shakespeare_char', '--input', str(corpus), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / 'data' / 'shakespeare_char').iterdir()) == \
        ['meta.pkl', 'train.bin', 'val.bin']


def test_out_dir_that_is_a_file_is_one_line_and_writes_nothing(tmp_path):
    corpus, taken = tmp_path / 'corpus.txt', tmp_path / 'taken'
    corpus.write_text(CORPUS, encoding='utf-8')
    taken.write_text('a file')
    result = run_script('shakespeare_char', '--input', str(corpus), '--out_dir', str(taken), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: out_dir={str(taken)!r} cannot be a directory: {taken} is "
                                                  f"a file; use another --out_dir"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ['corpus.txt', 'taken'] and taken.read_text() == 'a file'


def test_failed_download_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / 'out'
    result = run_script('shakespeare_char', '--url', 'http://127.0.0.1:9/input.txt', '--out_dir', str(out),
                        cwd=tmp_path)
    assert result.returncode == 2
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and error.startswith('error: could not download')
    assert '--input PATH' in error
    assert not out.exists()


def test_failed_download_keeps_existing_outputs(tmp_path, monkeypatch):
    def unreachable(url, timeout):
        raise OSError('network is unreachable')
    monkeypatch.setattr(data.urllib.request, 'urlopen', unreachable)
    (tmp_path / 'train.bin').write_bytes(b'old')
    with pytest.raises(ConfigError, match='--input PATH'):
        shakespeare_char.main(['--out_dir', str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin']
    assert (tmp_path / 'train.bin').read_bytes() == b'old'


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


def test_vocabulary_too_large_for_uint16_writes_nothing(tmp_path):
    with pytest.raises(common.PrepareError, match='uint16'):
        shakespeare.prepare(CORPUS, tmp_path, tiny_encoding(special_id=70000))
    assert list(tmp_path.iterdir()) == []


def test_encoding_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="'gpt3' is not a tiktoken encoding; choose one of: .*gpt2"):
        data.get_encoding('gpt3')

    def offline(name):
        raise ConnectionError('Failed to resolve openaipublic.blob.core.windows.net\nsecond line')
    monkeypatch.setattr(tiktoken, 'get_encoding', offline)
    with pytest.raises(ConfigError) as info:
        data.get_encoding('gpt2')
    assert 'TIKTOKEN_CACHE_DIR' in str(info.value) and '\n' not in str(info.value)


def make_documents(count=40):
    return [f'Document {i}: the {"quick " * (i % 7)}brown fox, th\u00e9 {i * i}.' for i in range(count)]


def write_documents(path, count=40):
    docs = make_documents(count)
    with open(path, 'w', encoding='utf-8') as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({'id': i, 'body': doc}) + '\n')
    return docs


def split_documents(ids):
    """Token stream -> the documents it holds, cut at each end-of-text."""
    ends = np.flatnonzero(ids == EOT)
    assert len(ends) and ends[-1] == len(ids) - 1
    return [ids[start:end] for start, end in zip(np.r_[0, ends[:-1] + 1], ends)]


def test_openwebtext_cli_on_local_jsonl(tmp_path, monkeypatch):
    enc = tiny_encoding()
    monkeypatch.setattr(tiktoken, 'get_encoding', lambda name: enc)  # stands in for gpt2
    docs = write_documents(tmp_path / 'docs.jsonl')
    out = tmp_path / 'out'
    openwebtext.main(['--dataset', 'json', '--data_files', str(tmp_path / 'docs.jsonl'), '--text_column', 'body',
                      '--test_size', '0.1', '--num_proc', '2', '--cache_dir', str(tmp_path / 'hf'),
                      '--out_dir', str(out)])
    assert sorted(p.name for p in out.iterdir()) == ['train.bin', 'val.bin']
    train, val = read_bin(out / 'train.bin'), read_bin(out / 'val.bin')
    assert len(train) + len(val) == sum(len(enc.encode_ordinary(doc)) + 1 for doc in docs)
    train_docs, val_docs = split_documents(train), split_documents(val)
    assert (len(train_docs), len(val_docs)) == (36, 4)
    decoded = [enc.decode(doc.tolist()) for doc in train_docs + val_docs]
    assert sorted(decoded) == sorted(docs)
    assert decoded != docs  # documents were shuffled before the split


def test_openwebtext_text_files_and_bad_column(tmp_path):
    lines = [f'line {i} of the corpus' for i in range(30)]
    (tmp_path / 'a.txt').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    splits = openwebtext.load_splits('text', data_files=[str(tmp_path / 'a.txt')], test_size=0.0005,
                                     cache_dir=str(tmp_path / 'hf'))
    assert (len(splits['train']), len(splits['val'])) == (29, 1)  # nanoGPT's fraction still leaves one val document
    with pytest.raises(common.PrepareError, match="--text_column 'body' is not in the dataset; its columns: text"):
        openwebtext.prepare(splits, tmp_path / 'out', tiny_encoding(), text_column='body')
    counts = openwebtext.prepare(splits, tmp_path / 'out', tiny_encoding())
    assert counts['val'] == len(read_bin(tmp_path / 'out' / 'val.bin'))
    assert len(split_documents(read_bin(tmp_path / 'out' / 'train.bin'))) == 29


def test_openwebtext_missing_files_is_one_line(tmp_path):
    with pytest.raises(common.PrepareError) as info:
        openwebtext.load_splits('json', data_files=[str(tmp_path / 'missing.jsonl')], cache_dir=str(tmp_path / 'hf'))
    assert '--data_files PATH' in str(info.value) and '\n' not in str(info.value)


def test_default_num_proc_is_about_half_the_cores():
    assert openwebtext.default_num_proc() == max(1, (os.cpu_count() or 1) // 2)


def write_corpus(path, docs, fmt):
    """`docs` in a column 'text' of a json lines or parquet file, or one a line in a text file."""
    if fmt == 'json':
        path.write_text(''.join(json.dumps({'text': doc}) + '\n' for doc in docs), encoding='utf-8')
    elif fmt == 'text':
        path.write_text(''.join(doc + '\n' for doc in docs), encoding='utf-8')
    else:
        pq.write_table(pa.table({'text': pa.array(docs, pa.string())}), path)
    return path


def run_openwebtext(monkeypatch, capsys, *args):
    """openwebtext.py's main as the script runs it, in this process, the tiny encoding standing in for gpt2, and
    small batches and write buffers so that a few documents use several of each: (exit status, stdout, stderr)."""
    monkeypatch.setattr(tiktoken, 'get_encoding', lambda name: tiny_encoding())
    monkeypatch.setattr(openwebtext, 'STREAM_BATCH', 3)
    monkeypatch.setattr(openwebtext, 'WRITE_BUFFER', 50)
    try:
        common.run_main(lambda: openwebtext.main([str(arg) for arg in args]))
        status = 0
    except SystemExit as e:
        status = e.code
    out, err = capsys.readouterr()
    return status, out, err


def document_ids(docs):
    """Each document's ids as the non-streaming path encodes it: encode_ordinary, then end-of-text."""
    enc = tiny_encoding()
    return [enc.encode_ordinary(doc) + [EOT] for doc in docs]


def joined(ids_list):
    return [i for ids in ids_list for i in ids]


@pytest.mark.parametrize('fmt', ['json', 'text', 'parquet'])
def test_streaming_keeps_the_documents_of_the_full_path(tmp_path, monkeypatch, capsys, fmt):
    docs = make_documents(40)
    path = write_corpus(tmp_path / f'docs.{fmt}', docs, fmt)
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', fmt, '--data_files', path, '--test_size',
                                       '0.1', '--max_tokens', '1_000_000', '--out_dir', tmp_path / 'stream')
    assert status == 0, err
    assert "dataset '%s' split 'train' ended after 40 documents, short of --max_tokens 1,000,000" % fmt in out
    train, val = read_bin(tmp_path / 'stream' / 'train.bin'), read_bin(tmp_path / 'stream' / 'val.bin')
    # documents 0, 10, 20, 30 are val: ceil(n * 0.1) of the first n; the others train, in file order
    ids = document_ids(docs)
    assert val.tolist() == joined(ids[i] for i in (0, 10, 20, 30))
    assert train.tolist() == joined(ids[i] for i in range(40) if i % 10)
    # the non-streaming path on the same file: the same documents, tokens and split sizes, shuffled
    splits = openwebtext.load_splits(fmt, data_files=[str(path)], test_size=0.1, cache_dir=str(tmp_path / 'hf'))
    openwebtext.prepare(splits, tmp_path / 'full', tiny_encoding())
    full = [split_documents(read_bin(tmp_path / 'full' / f'{split}.bin')) for split in ('train', 'val')]
    streamed = [split_documents(train), split_documents(val)]
    assert [len(docs) for docs in streamed] == [len(docs) for docs in full] == [36, 4]
    assert sorted(map(list, streamed[0] + streamed[1])) == sorted(map(list, full[0] + full[1]))
    train_docs, val_docs = ({tiny_encoding().decode(doc.tolist()) for doc in split} for split in streamed)
    assert not train_docs & val_docs and train_docs | val_docs == set(docs)


@pytest.mark.parametrize('last_train_doc, cut', [(9, 0), (15, 5)])
def test_streaming_budget_is_exact(tmp_path, monkeypatch, capsys, last_train_doc, cut):
    """train.bin gets exactly --max_tokens: the last train document is cut `cut` tokens into it (0: it ends there)
    and reading stops, so val holds the val documents among those read up to it."""
    docs = make_documents(40)
    ids = document_ids(docs)
    train_ids = joined(ids[i] for i in range(last_train_doc) if i % 10) + ids[last_train_doc][:cut]
    if cut == 0:
        train_ids += ids[last_train_doc]
    max_tokens = len(train_ids)
    assert max_tokens < 1000  # so tqdm shows the count unscaled
    path = write_corpus(tmp_path / 'docs.jsonl', docs, 'json')
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', path,
                                       '--test_size', '0.1', '--max_tokens', max_tokens, '--out_dir', tmp_path)
    assert status == 0, err
    train, val = read_bin(tmp_path / 'train.bin'), read_bin(tmp_path / 'val.bin')
    assert train.tolist() == train_ids and len(train) == max_tokens
    assert val.tolist() == joined(ids[i] for i in range(0, last_train_doc + 1, 10))
    assert f'train has {max_tokens:,} tokens' in out and 'ended after' not in out
    assert f'{max_tokens}/{max_tokens}' in err  # the progress bar counts train tokens up to its total, the budget


def test_token_writer_holds_a_bounded_buffer(tmp_path, monkeypatch):
    monkeypatch.setattr(openwebtext, 'WRITE_BUFFER', 10)
    with open(tmp_path / 'ids.bin', 'wb') as f:
        writer = openwebtext.TokenWriter(f)
        for i in range(30):
            writer.write([i, i + 1, 50000])
            assert writer.buffered < 10 and f.tell() + 2 * writer.buffered == 2 * writer.count
        writer.flush()
    assert read_bin(tmp_path / 'ids.bin').tolist() == joined([i, i + 1, 50000] for i in range(30))


@pytest.mark.parametrize('corpus, args, message', [
    ('missing_column', [], "--text_column 'text' is not in the dataset; its columns: id, body"),
    ('empty.jsonl', [], "dataset 'json' split 'train' has no documents"),
    ('empty.txt', ['--dataset', 'text'], "dataset 'text' split 'train' has no documents"),
    ('docs.jsonl', ['--max_tokens', '0'], '--max_tokens 0 must be at least 1'),
    ('docs.jsonl', ['--max_tokens', '-5'], '--max_tokens -5 must be at least 1'),
])
def test_streaming_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, corpus, args, message):
    write_documents(tmp_path / 'missing_column')
    write_corpus(tmp_path / 'docs.jsonl', make_documents(5), 'json')
    (tmp_path / 'empty.jsonl').write_text('')
    (tmp_path / 'empty.txt').write_text('')
    out = tmp_path / 'out'
    status, _, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', tmp_path / corpus,
                                     '--max_tokens', 100, *args, '--out_dir', out)
    assert status == 2
    assert len(err.splitlines()) == 1 and err.startswith('error: ') and message in err
    assert not out.exists()


def test_streaming_failure_keeps_previous_outputs(tmp_path, monkeypatch, capsys):
    for name in ('train.bin', 'val.bin'):
        (tmp_path / name).write_bytes(b'old')
    write_corpus(tmp_path / 'one.jsonl', ['a single document'], 'json')
    status, _, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', tmp_path / 'one.jsonl',
                                     '--max_tokens', 100, '--out_dir', tmp_path)
    assert status == 2 and err.endswith("\nerror: dataset 'json' split 'train' has 1 document(s), all held out "
                                        "for val; pass more documents or a smaller --test_size\n")  # after the bar

    def broken_stream():  # a stream that fails after some documents, as a dropped connection does
        for doc in make_documents(20):
            yield {'text': doc}
        raise ConnectionError('connection reset by peer')
    monkeypatch.setattr(openwebtext, 'WRITE_BUFFER', 50)  # so part of train.bin.tmp was written before the failure
    with pytest.raises(common.PrepareError, match=r'could not read the dataset \(connection reset by peer\)'):
        openwebtext.prepare_stream(datasets.IterableDataset.from_generator(broken_stream), tmp_path, tiny_encoding(),
                                   10 ** 6, test_size=0.1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ['one.jsonl', 'train.bin', 'val.bin']
    assert all((tmp_path / name).read_bytes() == b'old' for name in ('train.bin', 'val.bin'))


@pytest.mark.parametrize('max_tokens', [[], ['--max_tokens', '1_000']])
def test_name_reaches_load_dataset(tmp_path, monkeypatch, capsys, max_tokens):
    calls = []

    def load_dataset(path, name, **kwargs):
        calls.append((path, name, kwargs.get('streaming', False)))
        raise ValueError(f'BuilderConfig {name!r} not found')
    monkeypatch.setattr(openwebtext.datasets, 'load_dataset', load_dataset)
    status, _, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'HuggingFaceFW/fineweb-edu', '--name',
                                     'sample-10BT', *max_tokens, '--out_dir', tmp_path / 'out')
    assert calls == [('HuggingFaceFW/fineweb-edu', 'sample-10BT', bool(max_tokens))]
    assert status == 2 and err.startswith("error: could not load dataset 'HuggingFaceFW/fineweb-edu' config "
                                          "'sample-10BT' split 'train' (BuilderConfig 'sample-10BT' not found)")


def test_openwebtext_script_rejects_a_budget_of_zero(tmp_path):
    result = run_script('openwebtext', '--max_tokens', '0', '--out_dir', 'out', cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == 'error: --max_tokens 0 must be at least 1 (e.g. 10_000_000_000)\n'
    assert not (tmp_path / 'out').exists()


@pytest.mark.skipif(not gpt2_cached(), reason="tiktoken's gpt2 files are not cached (set TIKTOKEN_CACHE_DIR)")
def test_gpt2_encoding(tmp_path):
    enc = data.get_encoding('gpt2')
    assert enc.encode_ordinary('hello world') == [31373, 995] and enc.eot_token == EOT
    shakespeare.prepare(CORPUS, tmp_path, enc)
    ids = np.concatenate([read_bin(tmp_path / 'train.bin'), read_bin(tmp_path / 'val.bin')])
    assert enc.decode(ids.tolist()) == CORPUS


def test_a_small_budget_holds_out_a_usable_val_split(tmp_path, monkeypatch, capsys):
    """nanoGPT's 0.0005 of 100k tokens would be one document; the default holds out enough for ten 1024 windows."""
    path = write_corpus(tmp_path / 'docs.jsonl', make_documents(2500), 'json')
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', path,
                                       '--max_tokens', '100_000', '--out_dir', tmp_path / 'out')
    assert status == 0, err
    assert "holding out 0.1 of the documents for val.bin (about 11,111 tokens), not nanoGPT's 0.0005 (about 50)" in out
    assert len(read_bin(tmp_path / 'out' / 'val.bin')) >= openwebtext.MIN_VAL_TOKENS and 'warning' not in out
    assert openwebtext.default_test_size(10_000_000_000) == openwebtext.default_test_size(None) == 0.0005  # nanoGPT's
    assert openwebtext.default_test_size(30_000_000) == 0.001


@pytest.mark.parametrize('max_tokens', [['--max_tokens', '5_000'], []])
def test_a_small_val_split_is_said_with_the_test_size_that_fixes_it(tmp_path, monkeypatch, capsys, max_tokens):
    path = write_corpus(tmp_path / 'docs.jsonl', make_documents(300), 'json')
    args = ['--dataset', 'json', '--data_files', path, *max_tokens, '--cache_dir', tmp_path / 'hf']
    status, out, err = run_openwebtext(monkeypatch, capsys, *args, '--test_size', '0.0005', '--out_dir', tmp_path)
    val_tokens = len(read_bin(tmp_path / 'val.bin'))
    [warning] = [line for line in out.splitlines() if line.startswith('warning: ')]
    assert status == 0 and warning.startswith(f'warning: val.bin has only {val_tokens:,} tokens, fewer than the '
                                              f'10,250 of ten 1024-token windows')
    larger = warning.split('--test_size ')[-1]
    status, out, err = run_openwebtext(monkeypatch, capsys, *args, '--test_size', larger, '--out_dir', tmp_path)
    assert status == 0 and len(read_bin(tmp_path / 'val.bin')) > 10 * val_tokens


def test_temporaries_of_a_killed_run_are_removed_first(tmp_path, monkeypatch, capsys):
    (tmp_path / 'train.bin.tmp').write_bytes(bytes(3_000_000))  # as a SIGKILLed run leaves them
    (tmp_path / 'val.bin.tmp').write_bytes(bytes(10))
    (tmp_path / 'notes.tmp').write_bytes(b'the user\'s')
    path = write_corpus(tmp_path / 'docs.jsonl', make_documents(40), 'json')
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', path,
                                       '--max_tokens', '100', '--out_dir', tmp_path)
    assert status == 0, err
    assert out.startswith(f"removed {tmp_path / 'train.bin.tmp'} (3.0 MB), left by an interrupted run\n"
                          f"removed {tmp_path / 'val.bin.tmp'} (0.0 MB), left by an interrupted run\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ['docs.jsonl', 'notes.tmp', 'train.bin', 'val.bin']


def test_ctrl_c_is_one_line_and_keeps_previous_outputs(tmp_path, monkeypatch, capsys):
    for name in ('train.bin', 'val.bin'):
        (tmp_path / name).write_bytes(b'old')

    def interrupted_stream():
        for doc in make_documents(20):
            yield {'text': doc}
        raise KeyboardInterrupt
    stream = datasets.IterableDataset.from_generator(interrupted_stream)
    monkeypatch.setattr(openwebtext, 'load_documents', lambda *args, **kwargs: stream)
    status, _, err = run_openwebtext(monkeypatch, capsys, '--max_tokens', '10_000', '--out_dir', tmp_path)
    assert status == 130
    assert err.endswith('\ninterrupted: no output written, temporary files removed\n')  # after the progress bar
    assert 'Traceback' not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['train.bin', 'val.bin']
    assert all((tmp_path / name).read_bytes() == b'old' for name in ('train.bin', 'val.bin'))


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


@pytest.mark.slow
def test_ctrl_c_stops_forked_workers_without_their_tracebacks(tmp_path):
    """Ctrl-C reaches the whole process group, as datasets' workers under num_proc > 1: one line, nothing else."""
    code = ('import multiprocessing, os, signal, time\n'
            'from prepare import common\n'
            'def work(_):\n'
            '    time.sleep(60)\n'
            'def main():\n'
            '    with multiprocessing.get_context("fork").Pool(2) as pool:\n'
            '        result = pool.map_async(work, range(2))\n'
            '        time.sleep(1)\n'
            '        os.killpg(0, signal.SIGINT)\n'
            '        result.get()\n'
            'common.run_main(main)\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            start_new_session=True)  # its own process group, which killpg(0) signals
    assert result.returncode == 130
    assert result.stderr == 'interrupted: no output written, temporary files removed\n'
