"""Keeps the trie in step with the scheduler's requests.

The scheduler owns the requests; the trie needs to hear of three events per
request: its prompt (when its prefill is scheduled), its accepted tokens (as
they are committed) and its end (completion, abort, or the server going
idle).  SGLang gives a speculative worker no single hook for all three, so
this class derives them from what the worker does see:

* prompts: the requests of every prefill batch;
* output: ``req.output_ids`` grows by the committed tokens after each step;
  only the new tail is read. Under overlap scheduling the previous step's
  tokens reach ``output_ids`` one step late: the worker passes them as
  ``pending``, and since the feed counts what it gave, each token enters the
  trie once, whichever of the two carried it;
* ends: ``note_request_finished`` when SGLang calls it, and otherwise a
  sweep for finished requests at every step, plus ``finish_all`` when the
  scheduler clears the cache pool on going idle.

It also decides each request's scope, the shared history it drafts from and
feeds (``--speculative-lookahead-isolation``, see ``lookahead.trie.config.ISOLATION_MODES``): a
request whose drafts are accepted decodes faster, so drafting one tenant's
request from another's text would let the second read the first's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Hashable, Iterable, Optional

from lookahead.trie.config import DEFAULT_ISOLATION, check_isolation

logger = logging.getLogger(__name__)

# The key of ``sampling_params.custom_params`` that names a request's corpora.
CORPORA_PARAM = "lookahead_corpora"


def _server_isolation() -> str:
    # The mode SGLang published for this scheduler process, or the default
    # outside a server (the worker may not pass it explicitly).
    try:
        from lookahead.plugin.server_args import get_lookahead_args

        return get_lookahead_args().isolation
    except Exception:
        return DEFAULT_ISOLATION


@dataclass
class _Live:
    req: Any  # sglang Req
    fed: int  # output tokens already given to the trie


class RequestFeed:
    """``isolation``: one of ``lookahead.trie.config.ISOLATION_MODES``; None reads the server's
    ``--speculative-lookahead-isolation`` (as SGLang published it in this
    process), or takes the default outside a server."""

    def __init__(self, cache, on_finish=None, isolation: Optional[str] = None):
        self.cache = cache
        self.on_finish = on_finish  # called after each request is finished
        self.isolation = check_isolation(_server_isolation() if isolation is None else isolation)
        self._live: dict[Hashable, _Live] = {}
        # Called with (prompt, output, scope) of each finished request that
        # shares its text (the fleet's history, lookahead.plugin.share).
        self.on_text = None

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._live

    @staticmethod
    def prompt_of(req) -> Any:
        # Multimodal prompts carry padding ids in origin_input_ids.
        ids = getattr(req, "origin_input_ids_unpadded", None)
        return req.origin_input_ids if ids is None else ids

    @classmethod
    def context_of(cls, req, pending, n: int) -> list:
        """The last ``n`` tokens of the request's prompt + output + ``pending``
        (committed tokens not in ``output_ids`` yet): what a draft reads."""
        tail = list(req.output_ids[-n:]) + list(pending)
        if len(tail) < n:
            tail = list(cls.prompt_of(req)[-(n - len(tail)):]) + tail
        return tail[-n:]

    def scope_of(self, req) -> tuple[Optional[str], bool]:
        """The request's (scope, share) for ``LookaheadCache.put_prompt``.

        A salted request's scope is ``"cache_salt:" + salt``, one with only
        an extra_key ``"extra_key:" + key``: a salt and an extra_key that
        happen to be equal strings stay apart, as in SGLang's radix cache."""
        if self.isolation == "request":
            return None, False
        if self.isolation == "salt":
            salt = getattr(req, "cache_salt", None)
            if salt:
                return f"cache_salt:{salt}", True
            key = getattr(req, "extra_key", None)
            if key:
                return f"extra_key:{key}", True
        return None, True

    @staticmethod
    def corpora_of(req) -> Optional[list]:
        """The external corpora the request chose, or None (all it may see).

        Carried as SGLang carries its own per-request extras to the
        scheduler: in ``sampling_params.custom_params``, under
        ``CORPORA_PARAM`` (a corpus id or a list of them; ``[]``: none),
        or ``"ngram_corpus_id"`` (one id, the name SGLang's PR #35102
        proposes for NGRAM).  A malformed value is ignored with a warning."""
        params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
        if not isinstance(params, dict):
            return None
        choice = params.get(CORPORA_PARAM, params.get("ngram_corpus_id"))
        if choice is None:
            return None
        if isinstance(choice, str):
            return [choice]
        if isinstance(choice, list) and all(isinstance(c, str) for c in choice):
            return choice
        logger.warning("lookahead: request %s: custom_params[%r] must be a corpus id or a list of them, got %r; "
                       "ignored", getattr(req, "rid", None), CORPORA_PARAM, choice)
        return None

    def start(self, reqs: Iterable) -> None:
        """Index the prompts of requests seen for the first time."""
        for req in reqs:
            if req.rid in self._live:
                continue  # a later chunk of a chunked prefill, or a retracted request
            scope, share = self.scope_of(req)
            try:
                self.cache.put_prompt(req.rid, self.prompt_of(req), scope=scope, share=share,
                                      corpora=self.corpora_of(req))
            except (ValueError, TypeError) as exc:
                # Never fail the batch over drafting: this request just gets no drafts.
                logger.warning("lookahead: not indexing request %s: %s", req.rid, exc)
                continue
            self._live[req.rid] = _Live(req, 0)

    def sync(self, reqs: Iterable, pending=None) -> list:
        """Give the trie each request's new output tokens; returns the requests
        that can be drafted for (those known to the trie).

        ``pending[i]``: tokens request ``i`` committed that are not in its
        ``output_ids`` yet (overlap scheduling), or None.
        """
        ready = []
        for i, req in enumerate(reqs):
            live = self._live.get(req.rid)
            if live is None:
                self.start((req,))
                live = self._live.get(req.rid)
                if live is None:
                    continue
            out = req.output_ids
            tail = pending[i] if pending is not None else ()
            total = len(out) + len(tail)
            if total > live.fed:
                new = tail[live.fed - len(out):] if live.fed >= len(out) else list(out[live.fed:]) + list(tail)
                try:
                    self.cache.put_output(req.rid, new)
                except (ValueError, TypeError) as exc:
                    logger.warning("lookahead: dropping output of request %s: %s", req.rid, exc)
                live.fed = total
            elif total < live.fed:  # output rewound (retraction): keep what was fed
                live.fed = total
            ready.append(req)
        return ready

    def erase_match_state(self, rids) -> None:
        """NGRAMWorker's verify flow names the requests that left the decode
        batch; those that have ended are finished now, the others keep their
        state (a request may rejoin after a prefill batch)."""
        for rid in rids:
            live = self._live.get(rid)
            if live is not None and live.req.finished():
                self.finish(rid)

    def finish(self, rid: Hashable) -> None:
        """The request ended: give its last tokens, then free its state."""
        live = self._live.pop(rid, None)
        if live is None:
            return
        out = live.req.output_ids
        if len(out) > live.fed:
            try:
                self.cache.put_output(rid, out[live.fed:])
            except (ValueError, TypeError):
                pass
        self.cache.finish(rid)
        if self.on_text is not None:
            scope, share = self.scope_of(live.req)
            if share:
                self.on_text(self.prompt_of(live.req), list(out), scope)
        if self.on_finish is not None:
            self.on_finish(rid)

    def sweep(self) -> None:
        """Finish every tracked request that SGLang has marked finished."""
        done = [rid for rid, live in self._live.items() if live.req.finished()]
        for rid in done:
            self.finish(rid)

    def finish_all(self) -> None:
        for rid in list(self._live):
            self.finish(rid)
