"""The saved file of a cache (``LookaheadCache.save``/``load``): its format,
its checks on load, and the thread that writes it.

Saving must never hold up the caller (a server's scheduler), so snapshots
are written from a thread of their own; loading must never trust the file,
so every length and name is checked before a token is indexed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future

import numpy as np

logger = logging.getLogger(__name__)

# 1: one shared history ("shared"); 2: one per scope ("tokens" split by
# "lengths", the scopes named in the meta, least recently used first).
FORMAT_VERSION = 2


def split_scopes(meta: dict, tokens: np.ndarray, lengths: np.ndarray) -> tuple[list, list]:
    # A format-2 file's histories, checked for consistency.
    keys = meta["scopes"]
    if not isinstance(keys, list) or any(k is not None and type(k) is not str for k in keys):
        raise ValueError("the scopes are not a list of names")
    if len(set(keys)) != len(keys):
        raise ValueError("a scope is saved twice")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or len(lengths) != len(keys) or (lengths < 0).any() or lengths.sum() != len(tokens):
        raise ValueError("the histories' lengths do not match the tokens saved")
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    ends = np.cumsum(lengths)
    return keys, [tokens[end - n: end] for n, end in zip(lengths.tolist(), ends.tolist())]


def split_corpora(meta: dict, data) -> list:
    # A format-2 file's corpora ((id, scope), tokens), checked; none in files saved before them.
    entries = meta.get("corpora", [])
    if not entries:
        return []
    if not isinstance(entries, list) or any(
            not isinstance(e, dict) or type(e.get("id")) is not str or
            (e.get("scope") is not None and type(e.get("scope")) is not str) for e in entries):
        raise ValueError("the corpora are not a list of {id, scope}")
    keys, chunks = split_scopes({"scopes": [e["id"] for e in entries]}, data["corpus_tokens"],
                                 data["corpus_lengths"])
    return [((cid, e["scope"]), tokens) for cid, e, tokens in zip(keys, entries, chunks)]


class Saver:
    """Writes a cache's snapshots from a thread of its own, so that saving
    never holds up the caller (a server's scheduler): one save at a time,
    and any asked for meanwhile become a single save after it (of the
    newest state).  The thread exits when there is nothing to save; it is
    not a daemon, so a save in progress completes before the process exits."""

    def __init__(self, cache):  # a LookaheadCache: its _write(path) writes the file
        self._cache = cache
        self._cond = threading.Condition()
        self._queued: dict[str, Future] = {}  # path -> the future of its next save
        self._running = False

    def submit(self, path: str) -> Future:
        with self._cond:
            future = self._queued.get(path)
            if future is None:
                future = self._queued[path] = Future()
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="lookahead-save", daemon=False).start()
            return future

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queued:
                    self._running = False
                    self._cond.notify_all()
                    return
                path = next(iter(self._queued))
                future = self._queued.pop(path)
            future.set_running_or_notify_cancel()
            t0 = time.monotonic()
            try:
                self._cache._write(path)
            except BaseException as exc:
                logger.warning("LOOKAHEAD: could not save the trie to %s: %s", path, exc)
                future.set_exception(exc)
            else:
                future.set_result(time.monotonic() - t0)

    def wait(self) -> None:
        """Until no save is queued or in progress."""
        with self._cond:
            while self._running:
                self._cond.wait()
