"""prepare/openwebtext.py on local corpora written here (json, text, parquet; in memory and streamed): the splits,
the token budget, its one-line errors and Ctrl-C. No network: BPE goes through a tiny tiktoken Encoding."""
import json
import os

import numpy as np
import pytest
import tiktoken

# requirements.txt's, for prepare/openwebtext.py alone: a machine running only the GPU suite may lack it
datasets = pytest.importorskip('datasets')
import pyarrow as pa  # noqa: E402  (datasets' own dependency)
import pyarrow.parquet as pq  # noqa: E402

from helpers import EOT, tiny_encoding
from prepare import common, openwebtext


def read_bin(path):
    assert path.stat().st_size % 2 == 0
    return np.fromfile(path, dtype=np.uint16)


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


@pytest.mark.parametrize('cores, processes', [(16, 8), (3, 1), (1, 1), (None, 1)])
def test_default_num_proc_is_about_half_the_cores(monkeypatch, cores, processes):
    monkeypatch.setattr(os, 'cpu_count', lambda: cores)  # None: Python could not tell
    assert openwebtext.default_num_proc() == processes


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
    with pytest.raises(common.PrepareError, match='connection reset by peer'):  # into a folder it makes: none left
        openwebtext.prepare_stream(datasets.IterableDataset.from_generator(broken_stream), tmp_path / 'new' / 'owt',
                                   tiny_encoding(), 10 ** 6, test_size=0.1)
    assert not (tmp_path / 'new').exists()


@pytest.mark.parametrize('max_tokens', [[], ['--max_tokens', '1_000']])
def test_name_reaches_load_dataset(tmp_path, monkeypatch, capsys, max_tokens):
    calls = []

    def load_dataset(path, name, **kwargs):
        calls.append((path, name, kwargs.get('streaming', False)))
        raise ValueError(f'BuilderConfig {name!r} not found')
    monkeypatch.setattr(openwebtext.datasets, 'load_dataset', load_dataset)
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'HuggingFaceFW/fineweb-edu', '--name',
                                       'sample-10BT', *max_tokens, '--out_dir', tmp_path / 'out')
    assert calls == [('HuggingFaceFW/fineweb-edu', 'sample-10BT', bool(max_tokens))]
    assert ("reading dataset 'HuggingFaceFW/fineweb-edu' config 'sample-10BT' split 'train' from the Hugging Face Hub "
            "(without network access each request is retried for about half a minute, then this stops)") in out
    assert status == 2 and err.startswith("error: could not load dataset 'HuggingFaceFW/fineweb-edu' config "
                                          "'sample-10BT' split 'train' (BuilderConfig 'sample-10BT' not found)")


def test_a_small_budget_holds_out_a_usable_val_split(tmp_path, monkeypatch, capsys):
    """nanoGPT's 0.0005 of 100k tokens would be one document; the default holds out enough for ten 1024 windows."""
    path = write_corpus(tmp_path / 'docs.jsonl', make_documents(2500), 'json')
    status, out, err = run_openwebtext(monkeypatch, capsys, '--dataset', 'json', '--data_files', path,
                                       '--max_tokens', '100_000', '--out_dir', tmp_path / 'out')
    assert status == 0, err
    assert "holding out 0.1 of the documents for val.bin (about 11,111 tokens), not nanoGPT's 0.0005 (about 50)" in out
    assert len(read_bin(tmp_path / 'out' / 'val.bin')) >= openwebtext.MIN_VAL_TOKENS and 'warning' not in out
    assert 'Hugging Face Hub' not in out  # local files: no wait for a network to say
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


def test_a_streamed_val_split_is_said_with_the_test_size_that_fixes_it(tmp_path, monkeypatch, capsys):
    """Where train.bin's tokens are fixed (--max_tokens reached), val grows with test_size's odds: the suggested
    --test_size gives val.bin about DEFAULT_VAL_TOKENS (a fraction scaled as the in-memory split's would overshoot
    some 1.5 times here)."""
    path = write_corpus(tmp_path / 'docs.jsonl', make_documents(3000), 'json')
    args = ['--dataset', 'json', '--data_files', path, '--max_tokens', '30_000', '--out_dir', tmp_path]
    status, out, _ = run_openwebtext(monkeypatch, capsys, *args, '--test_size', '0.01')
    [warning] = [line for line in out.splitlines() if line.startswith('warning: ')]
    status, out, err = run_openwebtext(monkeypatch, capsys, *args, '--test_size', warning.split('--test_size ')[-1])
    assert status == 0, err
    assert len(read_bin(tmp_path / 'train.bin')) == 30_000
    assert 0.8 < len(read_bin(tmp_path / 'val.bin')) / openwebtext.DEFAULT_VAL_TOKENS < 1.25


@pytest.mark.parametrize('max_tokens', [[], ['--max_tokens', '1_000']], ids=['in memory', 'streamed'])
def test_rows_without_text_are_no_documents_and_another_type_is_one_line(tmp_path, monkeypatch, capsys, max_tokens):
    docs = make_documents(40)
    rows = [{'text': None if i % 3 == 0 else doc} for i, doc in enumerate(docs)]
    (tmp_path / 'rows.jsonl').write_text(''.join(json.dumps(row) + '\n' for row in rows), encoding='utf-8')
    args = ['--dataset', 'json', '--data_files', tmp_path / 'rows.jsonl', *max_tokens, '--test_size', '0.25',
            '--cache_dir', tmp_path / 'hf']
    status, _, err = run_openwebtext(monkeypatch, capsys, *args, '--out_dir', tmp_path / 'out')
    assert status == 0, err
    tokens = np.concatenate([read_bin(tmp_path / 'out' / f'{split}.bin') for split in ('train', 'val')])
    assert sorted(map(tuple, split_documents(tokens))) == sorted(
        tuple(ids[:-1]) for ids in document_ids([doc for i, doc in enumerate(docs) if i % 3]))
    (tmp_path / 'ints.jsonl').write_text(''.join(json.dumps({'text': i}) + '\n' for i in range(10)))
    args[3] = tmp_path / 'ints.jsonl'
    status, _, err = run_openwebtext(monkeypatch, capsys, *args, '--out_dir', tmp_path / 'ints')
    assert status == 2 and err.splitlines()[-1] == (
        "error: --text_column 'text' holds a value of type int, not text: pass the column of the documents with "
        "--text_column (if it is that one, remove the rows that hold something else)")  # after the progress bars
    assert not (tmp_path / 'ints' / 'train.bin').exists()


def test_a_sliced_split_with_max_tokens_is_one_line_before_any_read(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(openwebtext.datasets, 'load_dataset', lambda *args, **kwargs: pytest.fail('read'))
    status, _, err = run_openwebtext(monkeypatch, capsys, '--split', 'train[:10%]', '--max_tokens', '1000',
                                     '--out_dir', tmp_path / 'out')
    assert status == 2 and err == ("error: --split 'train[:10%]' is a slice, which a stream cannot take: with "
                                   "--max_tokens pass the split whole (--split 'train'); --max_tokens itself bounds "
                                   "what is read\n")


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
