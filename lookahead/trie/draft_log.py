"""Every draft, with what it was drafted for, appended to a JSONL file: what
the end-to-end tests check isolation with, in a real server.

Set ``LOOKAHEAD_DRAFT_LOG`` to a file path and each draft becomes one line
(request, scope, its stream length, context tail, draft). Unset, drafting
is untouched.
"""

from __future__ import annotations

import json
import threading

from lookahead.trie.scopes import PRIVATE

DRAFT_LOG_ENV = "LOOKAHEAD_DRAFT_LOG"


class DraftLog:
    """Appends each draft, with what it was drafted for, to a JSONL file
    (see ``DRAFT_LOG_ENV``)."""

    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def record(self, cache, rid, context, draft) -> None:
        req = cache._requests.get(rid)
        if req is None:
            return
        tail = list(context[-cache.config.max_match_len:])
        line = json.dumps({
            "rid": rid if isinstance(rid, (str, int)) else repr(rid),
            "scope": None if req.scope is PRIVATE else req.scope,
            "share": req.scope is not PRIVATE,
            "stream": req.store.appended,
            "context": [int(t) for t in tail],
            "tokens": list(draft.tokens),
            "parents": list(draft.parents),
        })
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
