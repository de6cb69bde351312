"""A fleet of replicas in the model-free replay: what one history per replica
costs, and what sharing it (``--speculative-lookahead-share``) gets back.

The trace's requests are dealt round robin to ``replicas`` replicas, each
with its own ``LookaheadCache`` (its own shared history, answers and memory
budget).  Without sharing a request drafts only from what its own replica
served.  With sharing, every finished request's prompt and output reach the
other replicas as the share module delivers them (``LookaheadCache.put_finished``),
``lag`` finished requests later: with lag 1, request j's text is in the other
replicas' histories from request j + 2 on (request j + 1 ran beside it), as
when a request's text is still in flight on the stream while the next one
starts elsewhere.  Its own replica has it at once, as on one server.

One replica is one shared history: the anchor the fleet is compared with.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

import numpy as np

from lookahead.replay.baselines import LookaheadDrafter


class FleetDrafter:
    """The replay's drafter interface over ``replicas`` LOOKAHEAD replicas."""

    def __init__(self, replicas: int, share: bool = False, lag: int = 1, one_branch: bool = False, **config):
        if replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {replicas}")
        if lag < 0:
            raise ValueError(f"lag must be >= 0, got {lag}")
        self.name = "lookahead-1b" if one_branch else "lookahead"
        self.replicas = [LookaheadDrafter(one_branch=one_branch, **config) for _ in range(replicas)]
        self.share, self.lag = share, lag
        self._dealt = 0
        self._finished = 0
        self._where: dict = {}  # rid -> its replica's index
        self._texts: dict = {}  # rid -> (prompt, [output pieces], scope), while it runs (sharing only)
        self._pending: deque = deque()  # (due at this many finished requests, origin, prompt, output, scope)
        self.delivered = 0  # texts inserted on other replicas

    def start(self, rid, prompt, scope=None):
        r = self._where[rid] = self._dealt % len(self.replicas)
        self._dealt += 1
        self.replicas[r].start(rid, prompt, scope=scope)
        if self.share:
            self._texts[rid] = (prompt, [], scope)

    def draft(self, rid, context, budget):
        return self.replicas[self._where[rid]].draft(rid, context, budget)

    def accept(self, rid, context, new_tokens):
        self.replicas[self._where[rid]].accept(rid, context, new_tokens)
        if self.share:
            self._texts[rid][1].append(np.array(new_tokens, dtype=np.int32))

    def finish(self, rid):
        origin = self._where.pop(rid)
        self.replicas[origin].finish(rid)
        self._finished += 1
        if not self.share:
            return
        prompt, pieces, scope = self._texts.pop(rid)
        output = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
        self._pending.append((self._finished + self.lag, origin, prompt, output, scope))
        self._deliver()

    def _deliver(self):
        while self._pending and self._pending[0][0] <= self._finished:
            _, origin, prompt, output, scope = self._pending.popleft()
            for i, replica in enumerate(self.replicas):
                if i != origin:
                    replica.cache.put_finished(prompt, output, scope=scope)
                    replica.cache.synchronize()  # deterministic replays: no thread timing
                    self.delivered += 1

    def close(self):
        for replica in self.replicas:
            replica.cache.close()


def fleet_table(rows: Iterable[dict], lag: int) -> str:
    """``rows``: dicts with trace, budget, replicas, alone (AL, own history
    per replica), shared (AL with sharing, or None) and one (AL of one shared
    history)."""
    lines = ["| trace | budget | replicas | one history | own history each | % of one | "
             f"shared (lag {lag}) | % of one |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        one = r["one"]
        shared = "" if r["shared"] is None else f"{r['shared']:.3f} | {100 * r['shared'] / one:.1f} %"
        if not shared:
            shared = " | "
        lines.append(f"| {r['trace']} | {r['budget']} | {r['replicas']} | {one:.3f} | {r['alone']:.3f} | "
                     f"{100 * r['alone'] / one:.1f} % | {shared} |")
    return "\n".join(lines)
