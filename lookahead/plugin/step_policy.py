"""Whether a decode step speculates: measured, not guessed
(``--speculative-lookahead-max-batch-size auto``).

A step of ``bs`` requests either verifies their drafts (``bs`` committed
tokens plus the drafts accepted) or verifies the roots alone (``bs`` tokens,
the width-1 tier). Which yields more tokens per second depends on the model,
the hardware, the batch and the text: verification is nearly free while the
forward is memory-bound and costs once it is compute-bound, and drafts pay
only where the text repeats. ``StepPolicy`` decides each step from

* the cost of a step, measured online per batch size and kind (speculating
  or not) as a moving average of the time from one decode step to the next,
  which holds everything the step costs: drafting, the forward, sampling and
  the scheduler's own work;
* the tokens a speculating step commits: ``bs`` plus the drafts' expected
  acceptance (their node scores summed: each is the trie's estimate of the
  probability that the target accepts the path to the node), scaled by how
  well those estimates have matched measured acceptance (``calibration``).

It speculates when ``(bs + expected) / cost(speculate) > bs / cost(single)``.
Each option is measured at a batch size before it is trusted there, and the
one not taken is tried again once every ``explore_every`` steps of that size,
so estimates follow drift while exploration costs at most
``1 / explore_every`` of the steps. Drafting itself is skipped where the
recent drafts say speculation would not pay (``wants_drafts``).

Every input is identical on all tensor-parallel ranks except the measured
times. With ``local_costs=False`` (tensor parallelism) a rank's measurements
wait in ``measured`` and decisions read only ``costs``, which every rank
replaces at the same step with rank 0's table (``measured_table`` /
``adopt``), so every rank takes the same decisions. Pure Python,
unit-tested on recorded step costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SPECULATE, SINGLE = "speculate", "single"
GREEDY, SAMPLED = "greedy", "sampled"  # kinds of batch, calibrated apart


@dataclass
class _Cost:
    seconds: float = 0.0  # moving average of the step's cost
    samples: int = 0
    last_step: int = -(1 << 30)  # the batch size's step count when last measured


def batch_kind(sampling_info) -> str:
    """GREEDY or SAMPLED: which calibration a batch's drafts are read with."""
    return GREEDY if sampling_info.is_all_greedy else SAMPLED


def new_calibration() -> dict:
    """Accepted drafts over the trie's expectation, per kind of batch (1: as scored)."""
    return {GREEDY: 1.0, SAMPLED: 1.0}


def calibrate(calibration: dict, kind: str, accepted_drafts: int, expected_drafts: float,
              smoothing: float = 0.05) -> None:
    """Move ``calibration[kind]`` towards a verify's accepted / expected drafts."""
    if expected_drafts > 0:
        ratio = min(4.0, accepted_drafts / expected_drafts)
        calibration[kind] += smoothing * (ratio - calibration[kind])


@dataclass(frozen=True)
class Decision:
    speculate: bool
    reason: str  # "pays", "does_not_pay", "explore" (measuring an option), "no_draft", "too_large"


@dataclass
class StepPolicy:
    max_batch_size: int  # never speculate above this batch size (where no verify tier is captured)
    local_costs: bool = True  # decide from this process's own measurements (no tensor parallelism)
    explore_every: int = 64  # steps of a batch size between two tries of the option not taken
    smoothing: float = 0.2  # weight of a new cost sample
    max_jump: float = 2.0  # a sample counts as at most this factor off the current estimate
    calibration_smoothing: float = 0.05  # weight of a new acceptance ratio
    costs: dict = field(default_factory=dict)  # (bs, kind) -> _Cost: what decisions read
    measured: dict = field(default_factory=dict)  # (bs, kind) -> _Cost: this rank's samples
    steps_by_bs: dict = field(default_factory=dict)  # bs -> decode steps decided at that size
    # Per kind of batch (GREEDY, SAMPLED): measured accepted drafts / expected,
    # moving averages; and recent expected accepted drafts per drafted request.
    calibration: dict = field(default_factory=new_calibration)
    expected_per_request: dict = field(default_factory=new_calibration)
    decisions: dict = field(default_factory=dict)  # (kind, reason) -> steps

    def _cost(self, bs: int, kind: str) -> _Cost:
        return self.costs.setdefault((bs, kind), _Cost())

    def _pays(self, bs: int, expected_drafts: float, kind: str) -> bool:
        spec, single = self._cost(bs, SPECULATE).seconds, self._cost(bs, SINGLE).seconds
        return (bs + self.calibration[kind] * expected_drafts) * single > bs * spec

    def _exploring(self, bs: int, preferred: bool) -> bool:
        other = self._cost(bs, SINGLE if preferred else SPECULATE)
        return self.steps_by_bs.get(bs, 0) - other.last_step >= self.explore_every

    def _measured(self, bs: int) -> bool:
        return self._cost(bs, SPECULATE).samples > 0 and self._cost(bs, SINGLE).samples > 0

    def wants_drafts(self, bs: int, kind: str = GREEDY) -> bool:
        """Whether drafting this step can change the decision: not where
        recent drafts say speculation would not pay and no try is due."""
        if bs > self.max_batch_size:
            return False
        if not self._measured(bs):
            return True
        preferred = self._pays(bs, bs * self.expected_per_request[kind], kind)
        return preferred or self._exploring(bs, preferred)

    def decide(self, bs: int, expected_drafts, kind: str = GREEDY) -> Decision:
        """The choice for a step of ``bs`` requests whose drafts are expected to
        have ``expected_drafts`` accepted tokens in all: 0 when nothing matched,
        None when nothing was drafted because ``wants_drafts`` said no.
        ``kind``: GREEDY or SAMPLED, the batch's calibration."""
        step = self.steps_by_bs.get(bs, 0)
        self.steps_by_bs[bs] = step + 1
        if bs > self.max_batch_size:
            return self._count(Decision(False, "too_large"))
        if expected_drafts is None:
            return self._count(Decision(False, "does_not_pay"))
        if expected_drafts <= 0:
            return self._count(Decision(False, "no_draft"))
        self.expected_per_request[kind] += 0.1 * (expected_drafts / bs - self.expected_per_request[kind])
        for speculate, option in ((True, SPECULATE), (False, SINGLE)):
            if not self._cost(bs, option).samples:
                return self._count(Decision(speculate, "explore"))
        preferred = self._pays(bs, expected_drafts, kind)
        if self._exploring(bs, preferred):
            return self._count(Decision(not preferred, "explore"))
        return self._count(Decision(preferred, "pays" if preferred else "does_not_pay"))

    def _count(self, decision: Decision) -> Decision:
        key = (SPECULATE if decision.speculate else SINGLE, decision.reason)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        return decision

    def record_cost(self, bs: int, speculated: bool, seconds: float) -> None:
        """A step's measured cost (from its start to the next decode step's)."""
        table = self.costs if self.local_costs else self.measured
        cost = table.setdefault((bs, SPECULATE if speculated else SINGLE), _Cost())
        if cost.samples:
            # One stalled step (a page fault storm, another process, a GC
            # pause) can be many times the usual cost; taken whole, it would
            # flip the choice for every step until exploration re-measures it.
            # Clipped, a real change of cost still moves the estimate within
            # a few samples.
            seconds = min(max(seconds, cost.seconds / self.max_jump), cost.seconds * self.max_jump)
            cost.seconds += self.smoothing * (seconds - cost.seconds)
        else:
            cost.seconds = seconds
        cost.samples += 1
        cost.last_step = self.steps_by_bs.get(bs, 0)

    def record_acceptance(self, accepted_drafts: int, expected_drafts: float, kind: str = GREEDY) -> None:
        """A speculating step's accepted drafts against what the scores expected."""
        calibrate(self.calibration, kind, accepted_drafts, expected_drafts, self.calibration_smoothing)

    def summary(self) -> str:
        """Steps by decision, and the cost ratio (speculate / single) per batch size."""
        ratios = []
        for bs in sorted({b for b, _ in self.costs}):
            spec, single = self.costs.get((bs, SPECULATE)), self.costs.get((bs, SINGLE))
            if spec and single and spec.samples and single.samples:
                ratios.append(f"{bs}:{spec.seconds / single.seconds:.2f}")
        decisions = ", ".join(f"{k}/{r} {n}" for (k, r), n in sorted(self.decisions.items()))
        calibration = ", ".join(f"{kind} {value:.2f}" for kind, value in self.calibration.items())
        return f"decisions {decisions}; cost ratio by batch size {' '.join(ratios)}; calibration {calibration}"

    # -- tensor parallelism ---------------------------------------------------------

    def measured_table(self) -> list:
        """This rank's measurements, as ``[bs, speculated, seconds, samples, last_step]`` rows."""
        table = self.costs if self.local_costs else self.measured
        return [[b, int(k == SPECULATE), c.seconds, c.samples, c.last_step]
                for (b, k), c in sorted(table.items()) if c.samples]

    def adopt(self, table: list) -> None:
        """Decide from ``table`` (rank 0's ``measured_table``) from now on; every
        rank adopts the same table at the same step."""
        self.costs = {(int(b), SPECULATE if s else SINGLE): _Cost(float(sec), int(n), int(last))
                      for b, s, sec, n, last in table}
        if not self.local_costs:
            self.measured = {key: _Cost(c.seconds, c.samples, c.last_step) for key, c in self.costs.items()}
