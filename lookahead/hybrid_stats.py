"""What the hybrid (LOOKAHEAD + EAGLE) did: steps and acceptance by draft source.

Per request and decode step, the tree it verified came from the trie, from
EAGLE, or from both (``lookahead.hybrid``); per decode step, EAGLE's draft
model ran or was skipped. Acceptance is recorded from the CPU copy the
scheduler already makes (``on_verify_complete_cpu``), so these figures cost
no device synchronisation. ``snapshot()`` is what ``/get_server_info``
reports under ``internal_states[i]["lookahead_hybrid"]``; listeners (the
Prometheus metrics of ``lookahead.metrics.HybridMetrics``) get every event.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from lookahead.hybrid import SOURCES

logger = logging.getLogger(__name__)


class HybridStats:
    def __init__(self, log_interval_s: float = 30.0):
        self.log_interval_s = log_interval_s
        self.request_steps: Counter = Counter()  # source -> request-steps verified
        self.accepted: Counter = Counter()  # source -> accepted draft tokens
        self.accept_hist = {s: Counter() for s in SOURCES}
        self.eagle_drafted = 0  # decode steps on which EAGLE's draft model ran
        self.eagle_skipped = 0  # ... on which it was skipped (every request had a strong trie draft)
        self.passthrough = 0  # decode steps that verified EAGLE's own verify input unchanged
        self.trie_seconds = 0.0
        self.trie_calls = 0
        self.host_seconds = 0.0  # the hybrid's own host work: planning, choosing, laying out, scoring
        self.host_steps = 0
        self.listeners = []
        self._last_log = time.monotonic()
        self._window = Counter()

    def record_step(self, sources: list, eagle_ran: bool, passthrough: bool) -> None:
        if eagle_ran:
            self.eagle_drafted += 1
        else:
            self.eagle_skipped += 1
        self.passthrough += int(passthrough)
        self.host_steps += 1
        for s in sources:
            self.request_steps[s] += 1
        self._window["steps"] += 1
        self._window["skipped"] += int(not eagle_ran)
        for listener in self.listeners:
            listener("step", sources=list(sources), eagle_ran=eagle_ran)

    def record_trie(self, seconds: float) -> None:
        self.trie_seconds += seconds
        self.trie_calls += 1
        for listener in self.listeners:
            listener("trie", seconds=seconds)

    def record_host(self, seconds: float) -> None:
        self.host_seconds += seconds

    def record_accept(self, sources: list, num_correct_drafts_per_req: list) -> None:
        for s, n in zip(sources, num_correct_drafts_per_req):
            self.accepted[s] += n
            self.accept_hist[s][n] += 1
            self._window[f"acc_{s}"] += n + 1
            self._window[f"n_{s}"] += 1
        for listener in self.listeners:
            listener("accept", sources=list(sources), num_correct_drafts_per_req=list(num_correct_drafts_per_req))

    def accept_length(self, source: str = None) -> float:
        """Committed tokens per request-step (drafts + the bonus token), by source or overall."""
        sources = SOURCES if source is None else (source,)
        steps = sum(sum(self.accept_hist[s].values()) for s in sources)
        accepted = sum(self.accepted[s] for s in sources)
        return (accepted + steps) / steps if steps else 0.0

    def snapshot(self, policy=None) -> dict:
        out = {
            "request_steps": {s: self.request_steps[s] for s in SOURCES},
            "accept_length": {s: round(self.accept_length(s), 4) for s in SOURCES},
            "accept_length_overall": round(self.accept_length(), 4),
            "accepted_drafts_histogram": {s: dict(sorted(self.accept_hist[s].items())) for s in SOURCES},
            "eagle_drafted_steps": self.eagle_drafted,
            "eagle_skipped_steps": self.eagle_skipped,
            "eagle_passthrough_steps": self.passthrough,
            "trie_draft_us_per_call": round(1e6 * self.trie_seconds / self.trie_calls, 2) if self.trie_calls else 0.0,
            # Includes the trie draft, not EAGLE's draft or the verify.
            "hybrid_host_us_per_step": round(1e6 * self.host_seconds / self.host_steps, 2) if self.host_steps else 0.0,
        }
        if policy is not None:
            out["policy"] = policy.snapshot()
        return out

    def maybe_log(self, policy=None) -> None:
        now = time.monotonic()
        if now - self._last_log < self.log_interval_s or not self._window:
            return
        w, self._window = self._window, Counter()
        self._last_log = now
        per_source = ", ".join(
            f"{s} {w[f'n_{s}']} req-steps AL {w[f'acc_{s}'] / w[f'n_{s}']:.2f}" if w[f"n_{s}"] else f"{s} 0"
            for s in SOURCES)
        logger.info("LOOKAHEAD+EAGLE: %d decode steps, EAGLE skipped on %d; %s; %s",
                    w["steps"], w["skipped"], per_source, "" if policy is None else policy.snapshot())
