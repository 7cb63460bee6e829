"""training/documents.py reads rows that start at documents as the 24 Jan 2026 record's loader does (its
BOSFinder.next_batch, read again below on one rank): from a small uint16 .bin file of documents of 1 to 40 tokens,
some longer than the maximum length, the same rows in file order; drawn rows start at documents and are the same
for the same key."""
import numpy as np
import pytest

from training.documents import DocumentRows
from training.errors import ConfigError

DOC, ROW, LONGEST = 50256, 24, 16  # doc_token, a row's tokens (block_size), the maximum document length


@pytest.fixture
def data(tmp_path):
    """train.bin of 60 documents (each starting at DOC, of 1 to 40 tokens) after 5 tokens of no document, read as
    train.py reads it."""
    rng = np.random.default_rng(0)
    documents = [np.concatenate([[DOC], rng.integers(0, 50000, size=n)]) for n in rng.integers(0, 40, size=60)]
    tokens = np.concatenate([rng.integers(0, 50000, size=5), *documents]).astype(np.uint16)
    tokens.tofile(tmp_path / 'train.bin')
    return np.memmap(tmp_path / 'train.bin', dtype=np.uint16, mode='r')


def record_rows(tokens, n_rows):
    """The record's BOSFinder.next_batch(ROW, LONGEST), n_rows times on one rank: each row the documents from the next
    start on, each cut to LONGEST, the last cut so that the row has ROW + 1 tokens; the next row from the start after
    its last document."""
    bos = np.flatnonzero(np.asarray(tokens) == DOC)
    i, rows = 0, []
    for _ in range(n_rows):
        pieces, length = [], 0
        while length <= ROW:
            start = bos[i]
            end = min(bos[i + 1] if i + 1 < len(bos) else len(tokens), start + LONGEST, start + ROW - length + 1)
            pieces.append(tokens[start:end])
            length += end - start
            i += 1
        rows.append(np.concatenate(pieces))
    return rows


def test_rows_in_file_order_are_the_records(data):
    """All the rows the file holds, as the record's loader reads them, each of row + 1 tokens from a document's
    start; asked for in any split of micro-batches, the same; after the last, the file's first again."""
    documents = DocumentRows(data, DOC, ROW, LONGEST)
    expected = record_rows(data, 12)
    rows = np.concatenate([documents.rows(data, None, 3, before) for before in range(0, 12, 3)])
    assert rows.dtype == np.int64 and rows.shape == (12, ROW + 1)
    assert all(np.array_equal(row, record) for row, record in zip(rows, expected))
    assert all(row[0] == DOC for row in rows)
    fresh = DocumentRows(data, DOC, ROW, LONGEST)
    assert np.array_equal(fresh.rows(data, None, 2, 10), rows[10:12])  # resumed anywhere: the same rows


def test_the_row_after_the_last_whole_one_starts_the_file_again(data):
    """Where too few documents are left for a row, the next pass starts: the record's loader stops there."""
    documents = DocumentRows(data, DOC, ROW, LONGEST)
    fitting = []
    for k in range(100):
        row = documents.rows(data, None, 1, k)[0]
        if k and documents.sequence[k] == 0:
            break
        fitting.append(row)
    assert all(np.array_equal(row, record) for row, record in zip(fitting, record_rows(data, len(fitting))))
    assert np.array_equal(row, fitting[0])
    with pytest.raises(IndexError):  # the record's loader has no row past them in this file
        record_rows(data, len(fitting) + 1)


def test_drawn_rows_start_at_documents_and_repeat_for_the_same_key(data):
    """Each drawn row is the row that starts at one of the file's documents; the same key draws the same rows, another
    key others."""
    documents = DocumentRows(data, DOC, ROW, LONGEST)
    from_each = [documents.row(data, first) for first in range(documents.first_docs)]
    rows = documents.rows(data, (1337, 0, 5, 1), 8)
    assert all(any(np.array_equal(row, candidate) for candidate in from_each) for row in rows)
    assert np.array_equal(rows, documents.rows(data, (1337, 0, 5, 1), 8))
    assert not np.array_equal(rows, documents.rows(data, (1337, 0, 5, 2), 8))


def test_a_file_without_a_rows_worth_of_documents_is_a_config_error(tmp_path):
    tokens = np.array([1, 2, DOC, 3, 4, DOC, 5], dtype=np.uint16)
    with pytest.raises(ConfigError, match=r'holds 2 documents .* fewer than a row'):
        DocumentRows(tokens, DOC, ROW, LONGEST, 'train.bin')
    with pytest.raises(ConfigError, match=r'^train.bin holds no doc_token=7, at which its rows must start: prepare it '
                                          r'with a document separator .* or pass the --doc_token that separates'):
        DocumentRows(tokens, 7, 2, LONGEST, 'train.bin')  # no smaller --block_size helps there
