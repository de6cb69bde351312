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

The hybrid (LOOKAHEAD + EAGLE) is counted the same way, by draft source:
per request and decode step, the tree it verified came from the trie, from
EAGLE, or from both (``lookahead.plugin.hybrid``); per decode step, EAGLE's
draft model ran or was skipped. ``HybridStats.snapshot()`` is what
``/get_server_info`` reports under ``internal_states[i]["lookahead_hybrid"]``.

With ``--enable-metrics`` both are exported as Prometheus metrics next to
SGLang's own (``LookaheadMetrics``, ``HybridMetrics``): SGLang's scheduler
processes write their metrics into ``PROMETHEUS_MULTIPROC_DIR`` and the HTTP
server's ``/metrics`` merges them; names follow SGLang's ``sglang:`` prefix.
They are fed from the stats' events, so the worker's hot path does not
change when metrics are on, and from a trie snapshot taken at most once a
second.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from lookahead.plugin.hybrid import SOURCES

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


ACCEPT_LENGTH_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 24.0, 32.0)
DRAFT_SECONDS_BUCKETS = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2)


class LookaheadMetrics:
    def __init__(self, labels: dict, cache_stats_fn):
        # Imported here: prometheus_client must be imported after SGLang has set
        # PROMETHEUS_MULTIPROC_DIR in this process.
        from prometheus_client import Counter, Gauge, Histogram

        names = list(labels)
        self._labels = labels
        self._cache_stats_fn = cache_stats_fn
        self._last_trie = 0.0
        self.accept_length = Histogram(
            "sglang:lookahead_accept_length",
            "Tokens committed per request per decode step (1 = no draft accepted).",
            names, buckets=ACCEPT_LENGTH_BUCKETS,
        )
        self.draft_seconds = Histogram(
            "sglang:lookahead_draft_seconds",
            "Host time spent drafting from the trie, per decode step (whole batch).",
            names, buckets=DRAFT_SECONDS_BUCKETS,
        )
        self.steps = Counter(
            "sglang:lookahead_steps",
            "Decode steps by path (verify-graph, verify-eager, single-graph, single-eager) "
            "and reason (verify, fallback: batch above the max batch size, no_draft, "
            "custom_logit_processor: a request of the batch has one).",
            names + ["path", "reason"],
        )
        self.overlap_waits = Counter(
            "sglang:lookahead_overlap_waits",
            "Decode steps, by reason, that read the previous step's accepted tokens back "
            "to the host under overlap scheduling, waiting for its forward (a step that "
            "drafts does; one that drafts nothing does not).",
            names + ["reason"],
        )
        self.prompt_tokens = Counter(
            "sglang:lookahead_prompt_tokens_indexed",
            "Prompt tokens indexed into the trie.",
            names,
        )
        self.trie_bytes = Gauge(
            "sglang:lookahead_trie_bytes",
            "Memory held by the trie (shared history, its index and live requests' stores).",
            names, multiprocess_mode="mostrecent",
        )
        self.trie_nodes = Gauge(
            "sglang:lookahead_trie_nodes",
            "Indexed positions in the trie (its implicit nodes): shared history plus live requests.",
            names, multiprocess_mode="mostrecent",
        )
        self.corpus_tokens = Gauge(
            "sglang:lookahead_corpus_tokens",
            "Tokens held by the external corpora (--speculative-lookahead-corpus, /add_external_corpus).",
            names, multiprocess_mode="mostrecent",
        )
        self.corpus_bytes = Gauge(
            "sglang:lookahead_corpus_bytes",
            "Memory held by the external corpora (tokens and index), within their own budget.",
            names, multiprocess_mode="mostrecent",
        )
        self._prompt_tokens_seen = 0
        # Events come every decode step: the labelled children are looked up once.
        self._draft_seconds = self.draft_seconds.labels(**labels)
        self._accept_length = self.accept_length.labels(**labels)
        self._steps = {}

    def __call__(self, event: str, **fields) -> None:
        if event == "step":
            key = (fields["path"], fields["reason"])
            child = self._steps.get(key)
            if child is None:
                child = self._steps[key] = self.steps.labels(**self._labels, path=key[0], reason=key[1])
            child.inc()
            if fields.get("waited"):
                self.overlap_waits.labels(**self._labels, reason=key[1]).inc()
            self._maybe_refresh_trie()
        elif event == "draft":
            self._draft_seconds.observe(fields["seconds"])
        elif event == "accept":
            observe = self._accept_length.observe
            for n in fields["num_correct_drafts_per_req"]:
                observe(n + 1)

    def _maybe_refresh_trie(self) -> None:
        now = time.monotonic()
        if now - self._last_trie < 1.0:
            return
        self._last_trie = now
        stats = self._cache_stats_fn()
        self.trie_bytes.labels(**self._labels).set(stats["total_bytes"])
        self.trie_nodes.labels(**self._labels).set(stats["shared_tokens"] + stats["local_tokens"])
        self.corpus_tokens.labels(**self._labels).set(stats.get("corpus_tokens", 0))
        self.corpus_bytes.labels(**self._labels).set(stats.get("corpus_bytes", 0))
        new = stats["prompt_tokens"] - self._prompt_tokens_seen
        if new > 0:
            self.prompt_tokens.labels(**self._labels).inc(new)
            self._prompt_tokens_seen = stats["prompt_tokens"]


class HybridMetrics:
    """Prometheus metrics of the hybrid (EAGLE + ``--speculative-lookahead-hybrid``),
    fed from ``lookahead.plugin.stats.HybridStats`` events."""

    def __init__(self, labels: dict):
        from prometheus_client import Counter, Histogram

        names = list(labels)
        self._labels = labels
        self.requests = Counter(
            "sglang:lookahead_hybrid_request_steps",
            "Request-steps by the source of the tree each verified (trie, eagle, merged).",
            names + ["source"],
        )
        self.accept_length = Histogram(
            "sglang:lookahead_hybrid_accept_length",
            "Tokens committed per request per decode step, by the source of its verified tree.",
            names + ["source"], buckets=ACCEPT_LENGTH_BUCKETS,
        )
        self.eagle_steps = Counter(
            "sglang:lookahead_hybrid_eagle_steps",
            "Decode steps on which EAGLE's draft model ran (drafted) or was skipped "
            "(every request of the batch had a strong trie draft).",
            names + ["action"],
        )
        self.trie_seconds = Histogram(
            "sglang:lookahead_hybrid_trie_draft_seconds",
            "Host time spent drafting from the trie, per decode step (whole batch).",
            names, buckets=DRAFT_SECONDS_BUCKETS,
        )

    def __call__(self, event: str, **fields) -> None:
        labels = self._labels
        if event == "step":
            self.eagle_steps.labels(**labels, action="drafted" if fields["eagle_ran"] else "skipped").inc()
            for source in fields["sources"]:
                self.requests.labels(**labels, source=source).inc()
        elif event == "accept":
            for source, n in zip(fields["sources"], fields["num_correct_drafts_per_req"]):
                self.accept_length.labels(**labels, source=source).observe(n + 1)
        elif event == "trie":
            self.trie_seconds.labels(**labels).observe(fields["seconds"])
