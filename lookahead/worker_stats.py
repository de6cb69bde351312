"""What the worker did, step by step: for logs, ``stats()`` and metrics.

Every decode step is one TARGET_VERIFY forward, counted once by path: its
tier (``verify``: wider than one token; ``single``: the last committed token
alone, a plain decode step on the verify path) and how it ran (a CUDA-graph
replay or eagerly); and by reason (``verify``: drafted; ``no_draft``: nothing
matched; ``fallback``: the batch is larger than
``--speculative-lookahead-max-batch-size``, so nothing was drafted;
``custom_logit_processor``: a request of the batch has one; with
``auto``, the decision's reason: ``pays``, ``does_not_pay``, ``explore``,
``no_draft``, ``too_large``).
Under overlap scheduling a step that drafts (or counts penalties over its
tree) reads the previous step's accepted tokens back to the host first, and
so waits for that step's forward; such steps are counted by reason too
(``overlap_waits``). A step that drafts nothing takes its roots on the
device and reads nothing back.
Acceptance is recorded from the CPU copy the scheduler already makes, so
keeping these figures costs no device synchronisation.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

logger = logging.getLogger(__name__)

PATHS = ("verify-graph", "verify-eager", "single-graph", "single-eager")


class StepStats:
    def __init__(self, log_interval_s: float = 30.0):
        self.log_interval_s = log_interval_s
        self.paths: Counter = Counter()  # one of PATHS
        self.reasons: Counter = Counter()  # verify / fallback / no_draft
        self.overlap_waits: Counter = Counter()  # by reason: steps that waited for the previous forward
        self.verify_steps = 0
        self.accepted_tokens = 0  # committed tokens over all decode steps (drafts + bonus)
        self.decode_steps = 0  # decode steps whose acceptance was reported
        self.accept_hist: Counter = Counter()  # accepted drafts per request-step
        self.draft_seconds = 0.0
        self.drafted_tokens = 0
        self.draft_calls = 0
        self._last_log = time.monotonic()
        self._window = Counter()
        self.listeners = []  # callables(event, **fields), e.g. Prometheus metrics

    def record_step(self, width: int, graph: bool, reason: str, waited: bool = False) -> None:
        path = f"{'verify' if width > 1 else 'single'}-{'graph' if graph else 'eager'}"
        self.paths[path] += 1
        self.reasons[reason] += 1
        self._window[reason] += 1
        if waited:
            self.overlap_waits[reason] += 1
        for listener in self.listeners:
            listener("step", path=path, reason=reason, waited=waited)

    def record_draft(self, seconds: float, drafted: int, requests: int) -> None:
        self.draft_seconds += seconds
        self.drafted_tokens += drafted
        self.draft_calls += 1
        for listener in self.listeners:
            listener("draft", seconds=seconds, drafted=drafted, requests=requests)

    def record_accept(self, num_correct_drafts_per_req) -> None:
        requests = len(num_correct_drafts_per_req)
        committed = sum(num_correct_drafts_per_req) + requests  # each request-step adds its bonus token
        self.accept_hist.update(num_correct_drafts_per_req)
        self.accepted_tokens += committed
        self.decode_steps += requests
        self._window["accepted"] += committed
        self._window["req_steps"] += requests
        for listener in self.listeners:
            listener("accept", num_correct_drafts_per_req=list(num_correct_drafts_per_req))

    @property
    def accept_length(self) -> float:
        """Committed tokens per request-step (1.0 means no speculation gain)."""
        return self.accepted_tokens / self.decode_steps if self.decode_steps else 0.0

    def snapshot(self) -> dict:
        return {
            "steps": dict(self.paths),
            "step_reasons": dict(self.reasons),
            "overlap_waits": dict(self.overlap_waits),
            "accept_length": self.accept_length,
            "accepted_drafts_histogram": dict(sorted(self.accept_hist.items())),
            "draft_us_per_call": 1e6 * self.draft_seconds / self.draft_calls if self.draft_calls else 0.0,
            "drafted_tokens": self.drafted_tokens,
        }

    def maybe_log(self, cache_stats_fn, policy=None) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s or not self._window:
            return
        w, self._window = self._window, Counter()
        self._last_log = now
        trie = cache_stats_fn()
        accepted, req_steps = w.pop("accepted", 0), w.pop("req_steps", 0)
        window_al = accepted / req_steps if req_steps else 0.0
        logger.info(
            "LOOKAHEAD: steps by reason %s, accept len %.2f (overall %.2f), "
            "paths %s, draft %.1f us/call, trie %.1f MiB, %d shared tokens, %d live requests%s",
            dict(w), window_al, self.accept_length,
            dict(self.paths), 1e6 * self.draft_seconds / max(self.draft_calls, 1),
            trie["total_bytes"] / 2**20, trie["shared_tokens"], trie["active_requests"],
            "" if policy is None else f"; auto: {policy.summary()}",
        )
