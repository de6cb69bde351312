"""What one more verified token costs, measured: the score a drafted node must clear.

Where a step's verify width follows its drafts (no graph tiers: a CPU),
the forward is compute-bound and its cost grows with every token it
verifies. A draft node the target will likely reject then costs more than
it brings: on a real chat model, open chat accepts 1.7 tokens per step, so
most of a full-width draft is paid for and thrown away.

A node is worth drafting when the tokens it is expected to bring (its
score: the trie's estimate that the target accepts the path to it) exceed
what the time it costs would bring at the current pace:

    score >= c1 * R

with ``c1`` the seconds one more verified token adds to a step and ``R``
the tokens committed per second. ``c1`` is read at a given batch size: a
step's time is regressed on its verified tokens and its batch size
together, since each request of a batch costs time of its own (its
attention, sampling, bookkeeping) whatever it verifies, and batch size and
verified tokens rise and fall together as requests join and finish. On
the tokens alone, that per-request cost (about 20 ms a request against
about 1.3 ms a verified token, for SmolLM2-135M on 2 CPU cores) would be
charged to the tokens, a slope about three times too steep at batch 4,
where it cut drafts of requests answered before. Both are moving
estimates over decode steps, so the floor follows the hardware, the batch
and the text. Before enough steps
with varied widths are seen, nothing is pruned. In a batch, every request
verifies at the batch's width, so the floor applies to a width's nodes
together (``batch_draft_width``). Pure Python; the worker feeds it and trims
its drafts by it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The floor never exceeds this: a node scoring above it is worth verifying
# whatever the estimates say (noise must not stop speculation altogether).
MAX_MIN_SCORE = 0.5


@dataclass
class VerifyCost:
    smoothing: float = 0.02  # weight of a new step in the moving averages
    min_samples: int = 32  # steps seen before the floor is trusted
    samples: int = 0
    mean_tokens: float = 0.0  # verified tokens per step
    mean_seconds: float = 0.0
    mean_tokens_sq: float = 0.0
    mean_cross: float = 0.0  # tokens x seconds
    mean_committed: float = 0.0  # committed tokens per step
    mean_bs: float = 0.0  # batch size
    mean_bs_sq: float = 0.0
    mean_bs_tokens: float = 0.0  # batch size x tokens
    mean_bs_seconds: float = 0.0  # batch size x seconds

    def record(self, verified: int, committed: int, seconds: float, bs: int = 1) -> None:
        """One decode step of ``bs`` requests: ``verified`` tokens through
        the forward (all requests' widths), ``committed`` tokens accepted,
        ``seconds`` from its start to the next step's."""
        if seconds <= 0 or verified <= 0:
            return
        a = 1.0 if self.samples == 0 else max(self.smoothing, 1.0 / (self.samples + 1))
        self.samples += 1
        self.mean_tokens += a * (verified - self.mean_tokens)
        self.mean_seconds += a * (seconds - self.mean_seconds)
        self.mean_tokens_sq += a * (verified * verified - self.mean_tokens_sq)
        self.mean_cross += a * (verified * seconds - self.mean_cross)
        self.mean_committed += a * (committed - self.mean_committed)
        self.mean_bs += a * (bs - self.mean_bs)
        self.mean_bs_sq += a * (bs * bs - self.mean_bs_sq)
        self.mean_bs_tokens += a * (bs * verified - self.mean_bs_tokens)
        self.mean_bs_seconds += a * (bs * seconds - self.mean_bs_seconds)

    @property
    def seconds_per_token(self) -> float:
        """``c1``: the slope of step time against verified tokens at a given
        batch size (0 unknown): the tokens' coefficient when step time is
        regressed on them and the batch size together."""
        var = self.mean_tokens_sq - self.mean_tokens ** 2
        cov = self.mean_cross - self.mean_tokens * self.mean_seconds
        var_bs = self.mean_bs_sq - self.mean_bs ** 2
        if var_bs > 1e-6:
            # What the batch size explains is taken out of both first.
            cov_bt = self.mean_bs_tokens - self.mean_bs * self.mean_tokens
            cov_bs = self.mean_bs_seconds - self.mean_bs * self.mean_seconds
            var -= cov_bt * cov_bt / var_bs
            cov -= cov_bt * cov_bs / var_bs
        if var <= 0.25:  # widths barely vary at a given batch size: no slope to read
            return 0.0
        return max(0.0, cov / var)

    def min_score(self, calibration: float = 1.0) -> float:
        """The score below which a node costs more than it is expected to
        bring, for nodes accepted ``calibration`` times as often as scored
        (sampled batches accept less of the same drafts than greedy ones)."""
        if self.samples < self.min_samples or self.mean_seconds <= 0:
            return 0.0
        rate = self.mean_committed / self.mean_seconds
        return min(MAX_MIN_SCORE, self.seconds_per_token * rate / max(0.1, calibration))


def batch_draft_width(scores: list, floor: float) -> int:
    """Draft tokens per request worth a batch's verify: the largest ``k`` whose
    ``k``-th nodes, over the batch's drafts, score at least ``floor`` a request.

    Every request of a batch verifies at the batch's width, so widening it
    by one costs one more verified token for each request, and brings each
    request's next-best node (its ``k``-th, scoring 0 where its draft is
    shorter). Taking the longest draft's width instead lets one request with
    a good draft make the whole batch pay for slots the others fill with
    nodes they will likely reject: at batch 16 under sampling that verify
    cost more than it brought. At batch 1 this is the floor itself.
    ``scores``: each request's node scores, best first (``Draft.scores``).
    """
    if not scores:
        return 0
    need = floor * len(scores)
    width = 0
    for k in range(max(len(s) for s in scores)):
        # Each draft's scores fall with k, so the column sums do too.
        if sum(s[k] for s in scores if len(s) > k) < need:
            break
        width = k + 1
    return width
