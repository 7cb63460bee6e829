"""Training rows that start at a document, as the 24 Jan 2026 record reads FineWeb (its BOSFinder): documents in file
order, one starting at each doc_token (<|endoftext|>), each cut to a maximum length, packed into rows of block_size + 1
tokens, the last document of a row cut where the row ends and the next row starting at the next document. From
nanoGPT's uint16 .bin files (prepare/openwebtext.py's), and like train.py's windows a function of (seed, iteration,
micro-step) alone: batch_order 'random' starts each row at a document drawn from that key, 'sequential' reads the
documents in order from the file's first, each once a pass, row after row."""
import numpy as np

from training.errors import ConfigError

SCAN_TOKENS = 2 ** 24  # the file is searched for document starts in pieces of this many tokens: 32 MiB of uint16


def document_starts(data, doc_token):
    """The offsets of every doc_token in `data` (a uint16 array or memmap), in order, as int64."""
    pieces = [np.flatnonzero(data[start:start + SCAN_TOKENS] == doc_token) + start
              for start in range(0, len(data), SCAN_TOKENS)]
    return np.concatenate(pieces).astype(np.int64) if pieces else np.zeros(0, dtype=np.int64)


class DocumentRows:
    """The rows of a token file whose documents start at doc_token: row_tokens + 1 tokens each (inputs and their
    next-token targets), made of whole documents from one's start, each at most max_doc_tokens long."""

    def __init__(self, data, doc_token, row_tokens, max_doc_tokens, path='the data'):
        self.starts = document_starts(data, doc_token)
        self.lengths = np.minimum(np.diff(self.starts, append=len(data)), max_doc_tokens)
        self.ends = np.cumsum(self.lengths)  # a row's tokens from document 0 up to the end of each document
        self.row_tokens = row_tokens
        # the documents a row can start at: those with row_tokens + 1 tokens from their start to the file's end
        self.first_docs = int(np.searchsorted(self.ends - self.lengths, self.total() - row_tokens - 1, side='right'))
        if len(self.starts) == 0:
            raise ConfigError(f"{path} holds no doc_token={doc_token}, at which its rows must start: prepare it with "
                              f"a document separator (prepare/openwebtext.py ends each with <|endoftext|>, 50256), or "
                              f"pass the --doc_token that separates its documents")
        if self.first_docs == 0:
            raise ConfigError(f"{path} holds {len(self.starts)} documents starting at doc_token={doc_token} with "
                              f"{self.total()} tokens in all (each cut to {max_doc_tokens}), fewer than a row's "
                              f"block_size + 1 = {row_tokens + 1}: prepare more text, or use a smaller --block_size")
        self.sequence = [0]  # the first document of each row of batch_order='sequential', as far as asked

    def total(self):
        return int(self.ends[-1]) if len(self.ends) else 0

    def row(self, data, first):
        """The row_tokens + 1 tokens of the row that starts at document `first`."""
        need = self.row_tokens + 1
        last = int(np.searchsorted(self.ends, self.ends[first] - self.lengths[first] + need))  # the row ends in it
        pieces = [data[start:start + n] for start, n in zip(self.starts[first:last + 1], self.lengths[first:last + 1])]
        return np.concatenate(pieces)[:need]

    def next_first(self, first):
        """The document the row after the one starting at `first` starts at: the one after the document the row ends
        in (its rest unread, as the record's), or the file's first where too few tokens follow."""
        last = int(np.searchsorted(self.ends, self.ends[first] - self.lengths[first] + self.row_tokens + 1))
        return last + 1 if last + 1 < self.first_docs else 0

    def rows(self, data, key, rows, rows_before=None):
        """(rows, row_tokens + 1) int64 tokens of `data`: each row from a document drawn from a generator seeded by
        `key`, or with rows_before, the rows after that many in file order."""
        if rows_before is None:
            firsts = np.random.default_rng(key).integers(self.first_docs, size=rows)
        else:
            while len(self.sequence) < rows_before + rows:
                self.sequence.append(self.next_first(self.sequence[-1]))
            firsts = self.sequence[rows_before:rows_before + rows]
        return np.stack([self.row(data, first).astype(np.int64) for first in firsts])
