"""The hybrid's decision rule (``lookahead.plugin.hybrid``), without a model."""

from __future__ import annotations

import random

import pytest

from lookahead.plugin.hybrid import (EAGLE, MERGED, TRIE, HybridPolicy, Tree, geometric_values, match_length)


@pytest.mark.parametrize("expected,n", [(0.5, 1), (2.3, 7), (6.9, 7), (0.01, 15), (7.0, 7), (9.0, 7)])
def test_geometric_values_sum_and_order(expected, n):
    v = geometric_values(expected, n)
    assert len(v) == n
    assert sum(v) == pytest.approx(min(expected, n), rel=1e-6)
    assert all(a >= b for a, b in zip(v, v[1:])) and all(0 <= x <= 1 for x in v)


def test_match_length_follows_one_path():
    tree = Tree([5, 6, 7, 8, 9], [-1, 0, -1, 2, 3])  # 5-6 and 7-8-9
    assert match_length(tree, [7, 8, 9, 1]) == 3
    assert match_length(tree, [5, 6, 1]) == 2
    assert match_length(tree, [7, 8]) == 2  # cut at what was committed
    assert match_length(tree, [1, 2]) == 0
    assert match_length(Tree([], []), [1]) == 0


def test_chains_pick_the_larger_expected_sum():
    p = HybridPolicy(width=5, chains=True)
    eagle = p.eagle_tree([1, 2, 3, 4], [-1, 0, 1, 2])
    assert eagle.values == pytest.approx([0.6, 0.36, 0.216, 0.1296])
    strong = p.trie_tree([9, 9, 9, 9], [-1, 0, 1, 2], expected=3.9)
    weak = p.trie_tree([9, 9, 9, 9], [-1, 0, 1, 2], expected=0.3)
    assert p.choose(strong, eagle).source == TRIE and p.trie_suffices(strong)
    c = p.choose(weak, eagle)
    assert c.source == EAGLE and c.unchanged_eagle and not p.trie_suffices(weak)
    assert p.choose(Tree([], []), eagle).tokens == [1, 2, 3, 4]
    # Chains never merge.
    assert p.choose(strong, eagle).parents == [-1, 0, 1, 2]


def test_tree_union_takes_the_best_nodes_of_both():
    p = HybridPolicy(width=6, chains=False)
    # EAGLE: 1 (0.8) -> 2 (0.5), 3 (0.1); trie: 7 (0.9) -> 8 (0.85) -> 9 (0.8) by its own scores.
    eagle = Tree([1, 2, 3], [-1, 0, -1], [0.8, 0.5, 0.1])
    trie = Tree([7, 8, 9], [-1, 0, 1], [0.9, 0.85, 0.8])
    c = p.choose(trie, eagle)
    assert c.source == MERGED
    chosen = set(zip(c.tokens, [c.tokens[q] if q >= 0 else None for q in c.parents]))
    assert chosen == {(7, None), (8, 7), (9, 8), (1, None), (2, 1)}
    assert c.expected == pytest.approx(0.9 + 0.85 + 0.8 + 0.8 + 0.5)
    # Parents come before children.
    assert all(q < i for i, q in enumerate(c.parents))


def test_tree_union_merges_shared_paths():
    p = HybridPolicy(width=4, chains=False)
    eagle = Tree([1, 2, 3], [-1, 0, 1], [0.5, 0.4, 0.3])
    trie = Tree([1, 2, 5], [-1, 0, 1], [0.9, 0.9, 0.9])
    c = p.choose(trie, eagle)
    assert c.tokens == [1, 2, 5] and c.parents == [-1, 0, 1]
    assert c.source == TRIE
    c = p.choose(Tree([1, 2], [-1, 0], [0.1, 0.05]), eagle)
    assert c.source == EAGLE and c.unchanged_eagle


def test_skip_needs_every_trie_node_above_eagles_best_node():
    p = HybridPolicy(width=4, chains=False)
    assert p.trie_suffices(Tree([1, 2, 3], [-1, 0, 1], [0.9, 0.8, 0.7]))
    assert not p.trie_suffices(Tree([1, 2, 3], [-1, 0, 1], [0.9, 0.8, 0.5]))
    assert not p.trie_suffices(Tree([1, 2], [-1, 0], [0.9, 0.8]))  # not the full width
    # Above what EAGLE's best node has been worth only: here two equal depth-1
    # candidates accepted half the time, a quarter each.
    for _ in range(200):
        p.observe([7], None, 0.0, Tree([7, 8, 9], [-1, -1, 0]))
        p.observe([5], None, 0.0, Tree([7, 8, 9], [-1, -1, 0]))
        p.eagle_tree([7, 8, 9], [-1, -1, 0], scores=[0.5, 0.5, 0.1])
    assert p.eagle_best.value == pytest.approx(0.25, abs=0.03)
    assert p.trie_suffices(Tree([1, 2, 3], [-1, 0, 1], [0.4, 0.35, 0.3]))
    assert not p.trie_suffices(Tree([1, 2, 3], [-1, 0, 1], [0.4, 0.35, 0.2]))


def test_measurement_moves_the_estimates():
    p = HybridPolicy(width=5, chains=True)
    rng = random.Random(0)
    for _ in range(400):
        # EAGLE's chain: right with probability 0.9 per token; the trie says 3.0 but gets 1.
        truth = [rng.randrange(100) for _ in range(5)]
        chain = [t if rng.random() < 0.9 else -1 for t in truth[:4]]
        trie = Tree([truth[0], 7, 7, 7], [-1, 0, 1, 2])
        p.observe(truth, trie, 3.0, Tree(chain, [-1, 0, 1, 2]))
    assert p._trie_bin(3.0, 4).value == pytest.approx(1 / 3, abs=0.05)
    assert p._trie_bin(1.0, 4).value == 1.0  # another confidence: not measured yet
    assert p.eagle_depth[0].value == pytest.approx(0.9, abs=0.06)
    assert p.eagle_depth[3].value == pytest.approx(0.9, abs=0.08)


def test_censored_depths_are_not_counted():
    p = HybridPolicy(width=5, chains=True)
    before = [r.value for r in p.eagle_depth]
    # Only one token committed: EAGLE's first token is judged, its deeper ones cannot be.
    p.observe([4], None, 0.0, Tree([4, 5, 6, 7], [-1, 0, 1, 2]))
    after = [r.value for r in p.eagle_depth]
    assert after[0] > before[0] and after[1:] == before[1:]


def test_trie_calibration_depends_on_the_drafts_confidence():
    p = HybridPolicy(width=4, chains=True)
    for _ in range(300):
        # Weak drafts (0.7 of 3 predicted) are right; strong ones (2.7) half right.
        p.observe([1, 2, 3, 4], Tree([1, 2, 3], [-1, 0, 1]), 0.7, None)
        p.observe([1, 2, 9, 9], Tree([1, 2, 3], [-1, 0, 1]), 2.7, None)
    weak = p.trie_tree([1, 2, 3], [-1, 0, 1], 0.7)
    strong = p.trie_tree([1, 2, 3], [-1, 0, 1], 2.7)
    assert sum(weak.values) > 2.5 and sum(strong.values) == pytest.approx(2.0, abs=0.1)


def test_eagle_tree_values_share_the_measured_depth_rate_by_score():
    p = HybridPolicy(width=5, chains=False)
    for _ in range(300):
        # EAGLE's tree accepts its first level half of the time, never deeper.
        p.observe([1, 9], None, 0.0, Tree([1, 2, 3, 4], [-1, -1, 0, 1]))
        p.observe([5, 9], None, 0.0, Tree([1, 2, 3, 4], [-1, -1, 0, 1]))
    assert p.eagle_depth[0].value == pytest.approx(0.5, abs=0.03)
    assert p.eagle_depth[1].value < 0.05
    # Nearly flat draft probabilities (tiny scores) still get the measured level.
    tree = p.eagle_tree([1, 2, 3, 4], [-1, -1, 0, 1], scores=[3e-4, 1e-4, 1e-7, 1e-8])
    assert tree.values[0] == pytest.approx(0.5 * 0.75, abs=0.02)
    assert tree.values[1] == pytest.approx(0.5 * 0.25, abs=0.02)
    assert sum(tree.values[:2]) == pytest.approx(p.eagle_depth[0].value)
    assert tree.values[2] + tree.values[3] < 0.03
