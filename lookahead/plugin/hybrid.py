"""LOOKAHEAD + EAGLE: which draft tree each request verifies, from measured acceptance.

Pure Python, no SGLang: ``lookahead.plugin.hybrid_worker`` drives it step by step,
and the unit tests drive it directly.

Every node of either drafter's tree gets a *value*: the estimated probability
that the target accepts the path to it. For a tree, the sum of its nodes'
values is its expected number of accepted draft tokens (at most one child of
a node can be accepted, so those events add up exactly). The values:

* **trie nodes**: the trie's own estimate (``Draft.expected``, the sum of its
  node scores), calibrated by what drafts of that confidence were measured
  to accept (the ratio of accepted to predicted tokens, kept per tenth of
  the predicted per-node probability ``expected / nodes``: how far the
  trie's scores can be trusted differs between a long verbatim match and a
  single short one), then spread over the draft's nodes in their best-first
  order as a geometric sequence ``q, q^2, ...`` with that sum (the trie
  exposes the sum and the order, not each score);
* **EAGLE nodes**: its parent's value times the measured probability that,
  the parent accepted, one of its children is (``P(depth d | depth d - 1)``,
  measured per depth over the steps where the accepted node at ``d - 1`` had
  children in EAGLE's tree), shared among the children in proportion to the
  draft model's own path probabilities (the scores EAGLE ranks its
  candidates by, top-k > 1; a chain has one child per node). Measured rates,
  not the raw scores, set the level: a draft model's probabilities can be
  far from calibrated (the test heads' are nearly flat), and a product of
  them along a path shrinks at every step.

**The rule.** A request verifies, within the verify width, the nodes with the
highest values from both trees together: the best-first selection of
``width - 1`` nodes of their union (shared paths merged), which maximises the
expected accepted tokens under these estimates. What it picks is the trie's
tree where the text repeats (its values are near 1 there), EAGLE's tree on
fresh text (the trie's values are near 0), and a merge of both where each has
nodes worth more than the other's weakest. At top-k 1 the server's attention
backends verify chains causally (FlashAttention-3 ignores the tree mask
there), so the choice is between two chains: the one with the larger sum.

**Skipping EAGLE.** The values tell, before EAGLE drafts, when its tree cannot
change the choice: at top-k 1 exactly (EAGLE's chain values do not depend on
what it drafts), at top-k > 1 when every trie node is worth at least what
EAGLE's best node has been worth (a moving average over its recent trees).
When that holds for every request of the batch, EAGLE's draft model steps
are skipped.

**Measured acceptance.** After each step the committed tokens are known, and
both trees of every request (the verified one and the other) are scored
against them: the longest path each matches. The other tree's figure is cut
at the committed length (it might have gone further), which is why EAGLE's
rates are conditional per depth, each measured only where it is observable.
All estimates are exponential moving averages over request-steps (``DECAY``),
started from weak priors; every rank of a tensor-parallel group sees the same
tokens, so every rank decides the same.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Optional, Sequence

# Per request-step: an estimate forgets about 1% of its history (a window of
# about a hundred request-steps).
DECAY = 0.99
PRIOR_WEIGHT = 2.0
# Before anything is measured: the trie's scores are taken at face value, and
# EAGLE's chain is accepted a step further with probability 0.6.
TRIE_PRIOR = 1.0
EAGLE_RATE_PRIOR = 0.6
MAX_VALUE = 0.999
TRIE_BINS = 10

TRIE, EAGLE, MERGED = "trie", "eagle", "merged"
SOURCES = (TRIE, EAGLE, MERGED)


@dataclass
class Tree:
    """A draft tree below the request's last committed token: ``parents[i] == -1``
    for a child of that token, else an earlier index; ``values[i]`` is the
    estimated probability that the target accepts the path to node ``i``."""

    tokens: list
    parents: list
    values: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))


EMPTY = Tree([], [], [])


@dataclass
class Choice:
    """A request's verify tree for one step, and where it came from."""

    tokens: list
    parents: list
    source: str  # TRIE, EAGLE or MERGED
    expected: float  # sum of the chosen nodes' values
    unchanged_eagle: bool = False  # exactly EAGLE's own tree


def geometric_values(expected: float, n: int) -> list:
    """``n`` values ``q, q^2, ..., q^n`` summing to ``expected`` (q <= 1)."""
    if n <= 0 or expected <= 0.0:
        return [0.0] * max(n, 0)
    if expected >= n:
        return [1.0] * n
    # Newton on the convex, increasing sum(q^i) - expected, from the root of
    # the infinite series (below the root: one step overshoots it, and from
    # above Newton converges monotonically).
    q = expected / (1.0 + expected)
    for _ in range(50):
        total, slope, power = 0.0, 0.0, 1.0
        for i in range(1, n + 1):
            slope += i * power
            power *= q
            total += power
        step = (total - expected) / slope
        q = min(1.0, q - step)
        if abs(step) < 1e-9:
            break
    out, v = [], 1.0
    for _ in range(n):
        v *= q
        out.append(v)
    return out


def tree_from_links(first_child: Sequence[int], next_sibling: Sequence[int]) -> tuple:
    """A verify tree's nodes below its root (node 0) from SGLang's links
    (``retrieve_next_token`` / ``retrieve_next_sibling`` of one request):
    ``(nodes, parents)``, nodes in index order (parents before children, as
    EAGLE lays them out), ``parents[k]`` an index into ``nodes`` or -1 for
    the root. Nodes not linked to the root are left out."""
    width = len(first_child)
    parent = [-2] * width
    stack = [0]
    while stack:
        node = stack.pop()
        child = first_child[node]
        while child != -1:
            parent[child] = node
            stack.append(child)
            child = next_sibling[child]
    nodes = [i for i in range(1, width) if parent[i] != -2]
    slot = {i: k for k, i in enumerate(nodes)}
    return nodes, [-1 if parent[i] == 0 else slot[parent[i]] for i in nodes]


def match_path(tree: Tree, committed: Sequence[int]) -> list:
    """The tree's nodes along the longest path that drafts a prefix of
    ``committed`` (the step's accepted tokens then the bonus)."""
    children: dict = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    node, path = -1, []
    for token in committed:
        node = next((c for c in children.get(node, ()) if tree.tokens[c] == token), None)
        if node is None:
            break
        path.append(node)
    return path


def match_length(tree: Tree, committed: Sequence[int]) -> int:
    """How many of ``committed`` the tree drafts along one path from its root."""
    return len(match_path(tree, committed))


class _Ratio:
    """An exponentially weighted ratio ``sum(measured) / sum(predicted)``."""

    def __init__(self, prior: float, weight: float = PRIOR_WEIGHT):
        self.num = prior * weight
        self.den = weight

    def add(self, measured: float, predicted: float) -> None:
        self.num = DECAY * self.num + measured
        self.den = DECAY * self.den + predicted

    @property
    def value(self) -> float:
        return self.num / self.den if self.den > 0 else 0.0


class HybridPolicy:
    """Per-step choice of each request's verify tree (see the module docstring).

    ``width``: the verify width N (root included), so trees have at most
    ``width - 1`` nodes; ``chains``: top-k 1 (chains only).
    """

    def __init__(self, width: int, chains: bool):
        self.width = width
        self.chains = chains
        # measured / predicted trie tokens, per tenth of the predicted per-node probability
        self.trie_bins = [_Ratio(TRIE_PRIOR) for _ in range(TRIE_BINS)]
        # P(EAGLE's tree accepted to depth d | to depth d - 1), d = 1..width-1
        self.eagle_depth = [_Ratio(EAGLE_RATE_PRIOR) for _ in range(max(width - 1, 0))]
        self.eagle_best = _Ratio(EAGLE_RATE_PRIOR)  # the value of EAGLE's best node, on average

    def resize(self, width: int) -> None:
        """The verify width changed (adaptive EAGLE steps): keep what was measured."""
        while len(self.eagle_depth) < width - 1:
            self.eagle_depth.append(_Ratio(EAGLE_RATE_PRIOR))
        self.width = width

    # -- values ---------------------------------------------------------------

    def trie_tree(self, tokens: Sequence[int], parents: Sequence[int], expected: float) -> Tree:
        """The trie's draft with its nodes' calibrated values."""
        n = len(tokens)
        calibrated = self._trie_bin(expected, n).value * expected if n else 0.0
        values = [min(MAX_VALUE, v) for v in geometric_values(calibrated, n)]
        return Tree(list(tokens), list(parents), values)

    def _trie_bin(self, expected: float, n: int) -> _Ratio:
        return self.trie_bins[min(TRIE_BINS - 1, int(TRIE_BINS * expected / max(n, 1)))]

    def eagle_chain_values(self, n: int) -> list:
        """P(EAGLE's tree is accepted to depth d), d = 1..n."""
        out, p = [], 1.0
        for d in range(n):
            p *= self.eagle_depth[d].value if d < len(self.eagle_depth) else 0.0
            out.append(min(MAX_VALUE, p))
        return out

    def eagle_tree(self, tokens: Sequence[int], parents: Sequence[int], scores: Optional[Sequence[float]] = None) -> Tree:
        """EAGLE's draft with its nodes' values: the parent's value times the
        measured rate at the node's depth, shared among siblings by the draft
        model's ``scores`` (equally without them)."""
        n = len(tokens)
        weight = [float(x) for x in scores] if scores is not None else [1.0] * n
        siblings: dict = {}
        for i, p in enumerate(parents):
            siblings[p] = siblings.get(p, 0.0) + weight[i]
        values, depth = [], []
        for i, p in enumerate(parents):
            d = 1 if p < 0 else depth[p] + 1
            depth.append(d)
            up = 1.0 if p < 0 else values[p]
            rate = self.eagle_depth[d - 1].value if d - 1 < len(self.eagle_depth) else 0.0
            total = siblings[p]
            values.append(min(MAX_VALUE, up * rate * (weight[i] / total if total > 0 else 1.0 / parents.count(p))))
        if values:
            self.eagle_best.add(max(values), 1.0)
        return Tree(list(tokens), list(parents), values)

    def eagle_expected(self) -> float:
        """Expected accepted tokens of an EAGLE chain of the full width."""
        return sum(self.eagle_chain_values(self.width - 1))

    # -- decisions --------------------------------------------------------------

    def trie_suffices(self, trie: Tree) -> bool:
        """Whether EAGLE's tree could not change this request's choice (then
        its draft may be skipped)."""
        if not len(trie):
            return False
        if self.chains:
            return sum(trie.values) > self.eagle_expected()
        return len(trie) >= self.width - 1 and min(trie.values) >= self.eagle_best.value

    def choose(self, trie: Tree, eagle: Optional[Tree]) -> Choice:
        """This step's tree of one request; ``eagle`` is None when EAGLE did not draft."""
        budget = self.width - 1
        if eagle is None or not len(eagle):
            return Choice(trie.tokens[:budget], trie.parents[:budget], TRIE, sum(trie.values[:budget]))
        if self.chains:
            t, e = sum(trie.values[:budget]), sum(eagle.values[:budget])
            if len(trie) and t > e:
                return Choice(trie.tokens[:budget], trie.parents[:budget], TRIE, t)
            return Choice(eagle.tokens[:budget], eagle.parents[:budget], EAGLE, e, unchanged_eagle=True)
        return _best_of_union(trie, eagle, budget)

    # -- measurement -------------------------------------------------------------

    def observe(self, committed: Sequence[int], trie: Optional[Tree], trie_expected: float,
                eagle: Optional[Tree]) -> tuple:
        """Score both trees of one request-step against its committed tokens
        (accepted drafts then the bonus); returns ``(trie match, EAGLE match)``
        (None for a tree that was not drafted). ``trie_expected``: the trie's
        own estimate for its draft."""
        m_t = m_e = None
        if trie is not None and len(trie):
            m_t = match_length(trie, committed)
            self._trie_bin(trie_expected, len(trie)).add(m_t, trie_expected)
        if eagle is not None and len(eagle):
            path = match_path(eagle, committed)
            m_e = len(path)
            # Depth d is observed where the tree's accepted node at d - 1 has
            # children and the committed tokens go that far.
            has_children = set(eagle.parents)
            for d in range(1, min(len(committed), len(self.eagle_depth)) + 1):
                if m_e < d - 1 or (-1 if d == 1 else path[d - 2]) not in has_children:
                    break
                self.eagle_depth[d - 1].add(1.0 if m_e >= d else 0.0, 1.0)
        return m_t, m_e

    def snapshot(self) -> dict:
        return {
            "trie_calibration": [round(r.value, 3) for r in self.trie_bins],
            "eagle_depth_rates": [round(r.value, 4) for r in self.eagle_depth],
            "eagle_best_node_value": round(self.eagle_best.value, 4),
            "eagle_chain_expected": round(self.eagle_expected(), 4),
        }


def _best_of_union(trie: Tree, eagle: Tree, budget: int) -> Choice:
    """The ``budget`` highest-valued nodes of both trees together, best first
    (values never grow along a path, so the selection is a connected tree)."""
    key_of: dict = {}
    tokens, parent, value, in_trie, in_eagle, children = [], [], [], [], [], {}

    def add(tree: Tree, from_trie: bool) -> None:
        local = []
        for i, (tok, p) in enumerate(zip(tree.tokens, tree.parents)):
            up = -1 if p < 0 else local[p]
            key = (up, tok)
            j = key_of.get(key)
            if j is None:
                j = key_of[key] = len(tokens)
                tokens.append(tok)
                parent.append(up)
                value.append(tree.values[i])
                in_trie.append(from_trie)
                in_eagle.append(not from_trie)
                children.setdefault(up, []).append(j)
            else:
                value[j] = max(value[j], tree.values[i])
                if from_trie:
                    in_trie[j] = True
                else:
                    in_eagle[j] = True
            local.append(j)

    add(eagle, False)
    add(trie, True)
    slot = {}
    out_tokens, out_parents, total = [], [], 0.0
    frontier = [(-value[j], j) for j in children.get(-1, ())]
    heapq.heapify(frontier)
    while frontier and len(out_tokens) < budget:
        neg, j = heapq.heappop(frontier)
        slot[j] = len(out_tokens)
        out_tokens.append(tokens[j])
        out_parents.append(-1 if parent[j] < 0 else slot[parent[j]])
        total -= neg
        for c in children.get(j, ()):
            heapq.heappush(frontier, (-value[c], c))
    chosen = list(slot)
    all_eagle = all(in_eagle[j] for j in chosen)
    all_trie = all(in_trie[j] for j in chosen)
    source = EAGLE if all_eagle else TRIE if all_trie else MERGED
    unchanged = all_eagle and len(chosen) == len(eagle)
    return Choice(out_tokens, out_parents, source, total, unchanged_eagle=unchanged)
