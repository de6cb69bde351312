"""A single background thread that applies trie inserts.

Indexing a long prompt takes milliseconds; a decode step has tens of
microseconds to spare.  Inserts are therefore queued here and applied by one
daemon thread, in submission order, so the shared history evolves the same way
on every run (and every tensor-parallel rank) given the same calls.  The jobs
themselves release the GIL, so the caller's thread keeps running Python.

The queue is bounded: a caller that runs Python flat out never hands the GIL
over except at the interpreter's switch interval, so the thread can fall
behind by thousands of jobs, each holding a prompt or a request's store.
Past ``max_pending`` jobs a submitter waits (GIL released) until the backlog
is half gone.  In a server the scheduler spends its time in forward passes,
which release the GIL, and never gets there.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

logger = logging.getLogger(__name__)


class BackgroundInserter:
    def __init__(self, name: str = "lookahead-inserter", max_pending: int = 256):
        self._name = name
        self.max_pending = max_pending
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
        if self._queue.unfinished_tasks >= self.max_pending:
            with self._queue.all_tasks_done:
                while self._queue.unfinished_tasks > self.max_pending // 2:
                    self._queue.all_tasks_done.wait(0.01)
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
