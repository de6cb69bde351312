"""Prometheus metrics for LOOKAHEAD, exported next to SGLang's own.

With ``--enable-metrics`` SGLang's scheduler processes write their metrics
into ``PROMETHEUS_MULTIPROC_DIR`` and the HTTP server's ``/metrics`` merges
them; the metrics created here, in the scheduler that runs the worker, are
served the same way.  Names follow SGLang's ``sglang:`` prefix.

They are fed from ``worker_stats.StepStats`` events, so the worker's hot
path does not change when metrics are on, and from a trie snapshot taken at
most once a second.
"""

from __future__ import annotations

import time

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
    fed from ``lookahead.hybrid_stats.HybridStats`` events."""

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
