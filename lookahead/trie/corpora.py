"""External corpora: text that requests draft from before any request has shown it.

A corpus (a manual, curated answers, a code base) is a token stream held in
native ``TokenStore`` s of its own, indexed like a scope's shared history and
read by drafts alongside it, on the same footing (match length, frequency:
``_drafting.pyx`` reads a request's history and its corpora as one list of
shared stores).  Unlike a history, a corpus is never evicted by traffic: only
:meth:`CorpusSet.remove` frees it.  All corpora share one memory budget
(``LookaheadConfig.corpus_memory_bytes``, ``--speculative-lookahead-corpus-memory-mb``),
separate from the histories'; a corpus that does not fit is refused whole,
with the sizes in the error, never truncated.

Scopes.  A corpus is *public* (``scope=None``: every request may draft from
it) or bound to one scope (``"cache_salt:X"``, ``"extra_key:X"``, the keys of
``lookahead.plugin.request_feed``): a request of another scope, or of the default
scope, never drafts from it.  A request may also name the corpora it wants
(``LookaheadCache.put_prompt(corpora=...)``): it then drafts from those
among the ones it may see, plus its own scope's history, and from no other
corpus.

Stores.  A native store's capacity is a power of two; to keep a 10M-token
corpus from paying for 16M, a corpus is cut into pieces of power-of-two
capacities that add up to little more than its length (the largest pieces
first).  A match never spans two pieces; the pieces are cut where a
document ends when one ends near the cut.

Loading.  Tokens are appended and indexed in slices, the store's lock
released between 32-token chunks (``TokenStore.append_indexed``, no GIL),
so a draft never waits for a load, and the corpus is drafted from while it
loads (what is indexed so far).  A loaded piece is frozen
(``TokenStore.freeze``): its chains become arrays, which drafts walk
without a cache miss per step.  A removal during the load stops it at the
next slice; the load then raises :class:`CorpusRemoved`.

Token streams follow SGLang's NGRAM external corpus: ``token_chunks`` are
consecutive pieces of one stream, and a document boundary is SGLang's
separator ``-2**31`` (``-1`` is accepted too).  The readers at the end of
this module turn files into such streams.
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

from lookahead.trie._store import TokenStore

# SGLang's document separator in external corpus token streams
# (sglang/srt/speculative/cpp_ngram/external_corpus.py, SEPARATOR_TOKEN).
SGLANG_SEPARATOR = -(2**31)
SEPARATOR = -1  # the trie's

# Tokens appended per slice of a load (between checks for a removal).
LOAD_SLICE = 1 << 16
# The smallest piece of a corpus (tokens).
MIN_PIECE = 1 << 10
# A piece's cut moves back to a document's end at most this far.
CUT_SLACK = 4096

# Bytes per token of a corpus piece of capacity ``cap`` with ``norders``
# orders: the stream (4), a chain link per order (4 each), and half as many
# chain heads per order as tokens (4 each), as a ring store allocates them.


def piece_bytes(cap: int, norders: int) -> int:
    return cap * 4 + norders * cap * 4 + norders * (cap // 2) * 4


def piece_sizes(n: int, max_pieces: int = 2) -> list[int]:
    """Power-of-two capacities for a stream of ``n`` tokens: one piece when
    rounding ``n`` up wastes at most 1/8 of it, else the largest power of
    two that fits and the rest rounded up (at least ``MIN_PIECE`` each):
    at most about 1/4 spare, and usually much less (10M tokens: 8M + 2M)."""
    sizes, left = [], n
    while left > 0:
        up = max(MIN_PIECE, 1 << (left - 1).bit_length())
        if up - left <= left // 8 or len(sizes) == max_pieces - 1 or left <= MIN_PIECE:
            sizes.append(up)
            break
        cap = 1 << (left.bit_length() - 1)
        sizes.append(cap)
        left -= cap
    return sizes


class CorpusRemoved(ValueError):
    """The corpus was removed while it loaded: the load stopped."""


class CorpusError(ValueError):
    """A corpus that cannot be added (bad ids, over budget, a duplicate id)."""


class CorpusOverBudget(CorpusError):
    """A corpus larger than what is left of the corpus budget."""


@dataclass
class Corpus:
    """One corpus: ``tokens`` (separators included) in ``stores``."""

    corpus_id: str
    scope: Optional[str]
    tokens: int
    nbytes: int
    stores: tuple = ()
    loaded: int = 0  # tokens appended (and indexed) so far
    state: str = "loading"  # "loading", "ready", "removed"
    published: bool = True  # drafts read it (False: added with publish=False, until CorpusSet.publish)
    cancel: threading.Event = field(default_factory=threading.Event)

    def info(self) -> dict:
        return {"tokens": self.tokens, "bytes": self.nbytes, "scope": self.scope,
                "state": self.state, "loaded": self.loaded, "published": self.published}


def as_stream(token_chunks: Any, max_id: int) -> np.ndarray:
    """``token_chunks`` (pieces of one stream: lists or arrays of ids, or one
    flat sequence) as one int32 array, SGLang's separator mapped to the
    trie's.  A clear ``CorpusError`` for anything else."""
    if isinstance(token_chunks, np.ndarray):
        chunks = [token_chunks]
    else:
        try:
            chunks = list(token_chunks)
        except TypeError:
            raise CorpusError(f"token_chunks must be a list of token id lists, got {type(token_chunks).__name__}") \
                from None
        if chunks and all(isinstance(c, (int, np.integer)) and not isinstance(c, bool) for c in chunks):
            chunks = [chunks]  # one flat stream
    arrays = []
    for i, chunk in enumerate(chunks):
        try:
            arr = np.asarray(chunk)
        except Exception as exc:  # ragged, odd objects
            raise CorpusError(f"token_chunks[{i}] is not a list of token ids ({exc})") from None
        if arr.size == 0:
            continue
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise CorpusError(f"token_chunks[{i}] must be a flat list of integer token ids, "
                              f"got {arr.dtype} of shape {arr.shape}")
        arr = arr.astype(np.int64)
        bad = (arr > max_id) | ((arr < 0) & (arr != SEPARATOR) & (arr != SGLANG_SEPARATOR))
        if bad.any():
            raise CorpusError(f"token_chunks[{i}] holds id {int(arr[bad][0])}, outside the vocabulary "
                              f"[0, {max_id}] (document separators are -1 or {SGLANG_SEPARATOR})")
        arr[arr < 0] = SEPARATOR
        arrays.append(arr.astype(np.int32))
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int32)


def _cuts(stream: np.ndarray, sizes: list[int]) -> list[tuple[int, int]]:
    # Where each piece starts and ends: at a document's end when one ends
    # within CUT_SLACK before the piece would be full.
    out, start = [], 0
    for i, cap in enumerate(sizes):
        end = min(len(stream), start + cap)
        if i < len(sizes) - 1 and end < len(stream):
            window = stream[max(start + 1, end - CUT_SLACK):end]
            seps = np.flatnonzero(window == SEPARATOR)
            if seps.size:
                end = max(start + 1, end - CUT_SLACK) + int(seps[-1])
        out.append((start, end))
        start = end
    if start < len(stream):  # cut-backs left a tail: it goes into the last piece if it fits
        s, _ = out[-1]
        out[-1] = (s, len(stream))
    return out


class CorpusSet:
    """The corpora of one cache: adds, removes, the budget, and what each
    scope may draft from.

    ``view`` maps each corpus id to ``(scope, stores)`` for the corpora
    drafts may read (loading or ready); it is replaced, never changed in
    place, so drafts read it without a lock.  ``generation`` counts its
    changes (requests cache their stores per generation)."""

    def __init__(self, max_bytes: int, orders: tuple, max_id: int):
        self.max_bytes = max_bytes
        self.orders = orders
        self.max_id = max_id
        self._lock = threading.Lock()
        self._corpora: dict[str, Corpus] = {}
        self.view: dict[str, tuple] = {}
        self.generation = 0

    # -- what drafts read ------------------------------------------------------

    def stores_for(self, scope: Any, choice: Optional[frozenset]) -> tuple:
        """The stores a request of ``scope`` (a key, or anything else for a
        request that shares nothing) drafts from: every public corpus and
        every corpus bound to its scope; only those named in ``choice``
        if it is not None.  Public ones first, then the scope's, each by id."""
        out = []
        for corpus_id, (cscope, stores) in self.view.items():
            if cscope is not None and cscope != scope:
                continue
            if choice is not None and corpus_id not in choice:
                continue
            out.extend(stores)
        return tuple(out)

    def _publish(self) -> None:
        # Must hold self._lock.  Public corpora first (sorted by id), then scoped.
        items = sorted(((c.scope is not None, c.corpus_id), c) for c in self._corpora.values()
                       if c.state != "removed" and c.stores and c.published)
        self.view = {c.corpus_id: (c.scope, c.stores) for _, c in items}
        self.generation += 1

    # -- changes ---------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._corpora.values())

    def add(self, corpus_id: str, token_chunks: Any, scope: Optional[str] = None, *,
            background: bool = False, on_done: Optional[Callable] = None, publish: bool = True):
        """Add a corpus; see ``LookaheadCache.add_corpus``.  Returns the
        tokens loaded, or with ``background`` a ``Future`` of them (the
        checks, the budget and the allocation happen before it returns)."""
        if type(corpus_id) is not str or not corpus_id:
            raise CorpusError(f"corpus_id must be a non-empty str, got {corpus_id!r}")
        if scope is not None and type(scope) is not str:
            raise CorpusError(f"scope must be a str or None (public), got {type(scope).__name__} {scope!r}")
        stream = as_stream(token_chunks, self.max_id)
        # Leading and repeated separators carry nothing.
        if len(stream) and stream[0] == SEPARATOR:
            stream = stream[np.argmax(stream != SEPARATOR) if (stream != SEPARATOR).any() else len(stream):]
        sizes = piece_sizes(len(stream)) if len(stream) else []
        cuts = _cuts(stream, sizes) if sizes else []
        # A cut that moved back can leave the last piece short of room: grow it.
        sizes = [max(cap, 1 << max(0, (e - s - 1).bit_length())) for cap, (s, e) in zip(sizes, cuts)]
        nbytes = sum(piece_bytes(cap, len(self.orders)) for cap in sizes)
        with self._lock:
            if corpus_id in self._corpora:
                raise CorpusError(f"corpus {corpus_id!r} already exists "
                                  f"({self._corpora[corpus_id].state}); remove it before adding it again")
            used = sum(c.nbytes for c in self._corpora.values())
            if used + nbytes > self.max_bytes:
                raise CorpusOverBudget(
                    f"corpus {corpus_id!r} of {len(stream):,} tokens needs {nbytes:,} bytes with its index, "
                    f"but the corpus budget (--speculative-lookahead-corpus-memory-mb) has "
                    f"{self.max_bytes - used:,} of {self.max_bytes:,} bytes left")
            try:
                stores = tuple(TokenStore(cap, True, self.orders) for cap in sizes)
            except MemoryError as exc:
                raise CorpusError(f"corpus {corpus_id!r}: {exc}") from None
            corpus = self._corpora[corpus_id] = Corpus(corpus_id, scope, int(len(stream)), nbytes, stores,
                                                       published=publish)
            if not stores:
                corpus.state = "ready"
            self._publish()
        if not background:
            self._load(corpus, stream, cuts)
            return corpus.tokens
        future: Future = Future()

        def run():
            future.set_running_or_notify_cancel()
            try:
                future.set_result(self._load(corpus, stream, cuts))
            except BaseException as exc:
                future.set_exception(exc)
            if on_done is not None:
                on_done(future)

        threading.Thread(target=run, name=f"lookahead-corpus-{corpus_id}", daemon=True).start()
        return future

    def _load(self, corpus: Corpus, stream: np.ndarray, cuts: list) -> int:
        for store, (start, end) in zip(corpus.stores, cuts):
            pos = start
            while pos < end:
                if corpus.cancel.is_set():
                    raise CorpusRemoved(f"corpus {corpus.corpus_id!r} was removed while it loaded "
                                        f"(after {corpus.loaded:,} of {corpus.tokens:,} tokens)")
                step = min(end, pos + LOAD_SLICE)
                store.append_indexed(np.ascontiguousarray(stream[pos:step]))
                corpus.loaded += step - pos
                pos = step
            # The piece is complete and never changes again: its chains laid
            # out as arrays make its drafts faster (same occurrences, same order).
            if not corpus.cancel.is_set():
                store.freeze()
        with self._lock:
            if corpus.cancel.is_set():
                raise CorpusRemoved(f"corpus {corpus.corpus_id!r} was removed while it loaded "
                                    f"(after {corpus.loaded:,} of {corpus.tokens:,} tokens)")
            corpus.state = "ready"
        return corpus.tokens

    def publish(self, corpus_id: str) -> None:
        """Let drafts read a corpus added with ``publish=False``."""
        with self._lock:
            corpus = self._corpora.get(corpus_id) if type(corpus_id) is str else None
            if corpus is None:
                raise CorpusError(f"corpus {corpus_id!r} not found")
            if not corpus.published:
                corpus.published = True
                self._publish()

    def remove(self, corpus_id: str) -> Corpus:
        """Remove a corpus (ready or loading: a load stops at its next
        slice).  Drafts stop reading it at once; its memory is freed once a
        draft or the load that holds it lets go.  ``CorpusError`` if there
        is none of that id."""
        with self._lock:
            corpus = self._corpora.pop(corpus_id, None) if type(corpus_id) is str else None
            if corpus is None:
                raise CorpusError(f"corpus {corpus_id!r} not found")
            corpus.cancel.set()
            corpus.state = "removed"
            self._publish()
            return corpus

    def list(self) -> dict[str, dict]:
        with self._lock:
            return {cid: c.info() for cid, c in sorted(self._corpora.items())}

    def ready(self) -> list[tuple[str, Optional[str], np.ndarray]]:
        """(id, scope, stream) of every fully loaded corpus, for saving
        (the pieces joined by separators)."""
        with self._lock:
            held = [c for c in self._corpora.values() if c.state == "ready"]
        out = []
        for c in held:
            parts = [s.tokens() for s in c.stores]
            joined = []
            for i, p in enumerate(parts):
                if i:
                    joined.append(np.asarray([SEPARATOR], np.int32))
                joined.append(p)
            out.append((c.corpus_id, c.scope, np.concatenate(joined) if joined else np.zeros(0, np.int32)))
        return out

    def stats(self) -> dict:
        with self._lock:
            cs = list(self._corpora.values())
        return {"corpora": len(cs), "corpus_tokens": sum(c.tokens for c in cs),
                "corpus_tokens_loaded": sum(c.loaded for c in cs),
                "corpus_bytes": sum(c.nbytes for c in cs), "corpus_capacity_bytes": self.max_bytes}


# -- reading corpora from files --------------------------------------------------------

# Suffixes of the files a directory corpus reads (source code, markup, text).
TEXT_SUFFIXES = frozenset("""
.txt .md .rst .py .pyi .c .h .cc .cpp .hpp .cu .java .js .ts .tsx .jsx .go .rs .rb .php .cs .kt .swift .scala
.sh .bash .zsh .sql .html .htm .css .xml .json .yaml .yml .toml .ini .cfg .conf .tex .lua .r .m .pl .hs .ml
.ex .exs .erl .clj .vue .svelte .proto .cmake .mk .dockerfile .adoc .org .csv .tsv
""".split())
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox", "build",
                          "dist", ".mypy_cache", ".pytest_cache"})
MAX_FILE_BYTES = 16 << 20


@dataclass
class ReadReport:
    """What a reader took and what it skipped, by reason."""

    documents: int = 0
    tokens: int = 0
    skipped: dict = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def take(self, chunks: list, ids: list) -> None:
        """Append one document's ids to ``chunks``, behind a separator from
        the one before (SGLang's corpus layout), and count it."""
        if chunks:
            chunks.append([SGLANG_SEPARATOR])
        chunks.append(ids)
        self.documents += 1
        self.tokens += len(ids)

    def __str__(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        return f"{self.documents} documents, {self.tokens:,} tokens" + (f"; skipped: {skipped}" if skipped else "")


def _is_text(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def iter_documents(path: str, report: ReadReport) -> Iterator[Any]:
    """The documents of the corpus at ``path``: ``str`` (text to tokenize)
    or ``list`` of ids (already tokenized), skipping what cannot be read
    (counted in ``report`` by reason).

    * a directory: every text file under it (by suffix, or a file without
      one that decodes as UTF-8 and holds no NUL byte); binary, unreadable,
      empty and larger-than-16-MiB files are skipped;
    * a ``.jsonl`` / ``.json`` file, one document per line: a JSON string
      (SGLang's NGRAM corpus format), ``{"text": ...}`` or ``{"input_ids": [...]}``;
    * any other file: its whole text, one document.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
            for name in sorted(files):
                full = os.path.join(root, name)
                suffix = os.path.splitext(name)[1].lower()
                if suffix and suffix not in TEXT_SUFFIXES:
                    report.skip("binary or non-text files")
                    continue
                try:
                    if os.path.getsize(full) > MAX_FILE_BYTES:
                        report.skip("files over 16 MiB")
                        continue
                    with open(full, "rb") as f:
                        data = f.read()
                except OSError:
                    report.skip("unreadable files")
                    continue
                if not _is_text(data):
                    report.skip("binary or non-text files")
                    continue
                if not data.strip():
                    report.skip("empty files")
                    continue
                yield data.decode("utf-8")
        return
    if not os.path.isfile(path):
        raise FileNotFoundError(f"corpus path {path!r} is neither a file nor a directory")
    if path.endswith((".jsonl", ".json")):
        with open(path, "rb") as f:
            for raw in f:
                if not raw.strip():
                    continue
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    report.skip("lines that are not JSON")
                    continue
                if isinstance(record, dict):
                    if isinstance(record.get("text"), str):
                        record = record["text"]
                    elif isinstance(record.get("input_ids"), list):
                        ids = record["input_ids"]
                        if ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
                            yield ids
                        else:
                            report.skip("input_ids lines that are not lists of ids >= 0")
                        continue
                    else:
                        report.skip('lines without a "text" string or "input_ids" list')
                        continue
                if not isinstance(record, str):
                    report.skip('lines that are not a string, {"text"} or {"input_ids"}')
                    continue
                if not record:
                    report.skip("empty documents")
                    continue
                yield record
        return
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise FileNotFoundError(f"cannot read corpus file {path!r}: {exc}") from None
    if not _is_text(data):
        raise ValueError(f"corpus file {path!r} is not UTF-8 text")
    yield data.decode("utf-8")


def read_corpus(path: str, encode: Optional[Callable[[str], list]], max_id: int,
                report: Optional[ReadReport] = None) -> list:
    """The corpus at ``path`` as SGLang-style token chunks (one per
    document, separated by ``SGLANG_SEPARATOR``), text tokenized by
    ``encode`` (without special tokens).  Documents with ids above
    ``max_id`` are skipped and counted."""
    report = report if report is not None else ReadReport()
    chunks: list = []
    for doc in iter_documents(path, report):
        if isinstance(doc, str):
            if encode is None:
                raise ValueError(f"corpus {path!r} holds text but no tokenizer is available")
            ids = list(encode(doc))
        else:
            ids = doc
        if not ids:
            report.skip("documents with no tokens")
            continue
        if max(ids) > max_id:
            report.skip("documents with ids outside the vocabulary")
            continue
        report.take(chunks, ids)
    return chunks


def corpus_id_of(path: str) -> str:
    """The id a corpus loaded from ``path`` at start-up gets: the path as given,
    as SGLang's NGRAM names its start-up corpus."""
    return os.fspath(path)
