"""A single background thread that applies trie inserts.

Indexing a long prompt takes milliseconds; a decode step has tens of
microseconds to spare.  Inserts are therefore queued here and applied by one
daemon thread, in submission order, so the shared history evolves the same way
on every run (and every tensor-parallel rank) given the same calls.  The jobs
themselves release the GIL, so the caller's thread keeps running Python.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

logger = logging.getLogger(__name__)


class BackgroundInserter:
    def __init__(self, name: str = "lookahead-inserter"):
        self._name = name
        self._queue: "queue.Queue[Callable[[], None] | None]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.failures = 0

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` to run on the inserter thread."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
        self._queue.put(job)

    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def synchronize(self) -> None:
        """Block until every job submitted so far has been applied."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Apply what is queued, then stop the thread."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job()
            except Exception:  # a bad job must not stop later inserts
                self.failures += 1
                logger.exception("lookahead: a background insert failed")
            finally:
                self._queue.task_done()
