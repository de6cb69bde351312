"""Draft batches laid out as SGLang verify trees (``lookahead.plugin.verify``)."""

from __future__ import annotations

import numpy as np
import pytest

from lookahead.trie.cache import Draft
from lookahead.plugin.verify import ancestor_mask, pack_drafts, verify_width


def _parents_from_mask(mask, width):
    m = mask.reshape(-1, width, width)
    out = []
    for b in range(m.shape[0]):
        row = [-1]
        for i in range(1, width):
            anc = np.flatnonzero(m[b, i, :i])
            row.append(int(anc[-1]))
        out.append(row)
    return out


def test_width_is_longest_draft_plus_root_capped():
    drafts = [Draft([1, 2], [-1, 0]), Draft([], []), Draft([5, 6, 7], [-1, -1, 1])]
    assert verify_width(drafts, 8) == 4
    assert verify_width(drafts, 3) == 3
    assert verify_width([Draft([], [])], 8) == 1


def test_tree_layout_matches_ngram_convention():
    drafts = [Draft([7, 8, 9], [-1, -1, 0]), Draft([4], [-1])]
    trees = pack_drafts(drafts, roots=[100, 200], width=4)
    assert not trees.is_chain
    assert trees.tokens.tolist() == [100, 7, 8, 9, 200, 4, 0, 0]
    assert _parents_from_mask(trees.mask, 4) == [[-1, 0, 0, 1], [-1, 0, 0, 0]]
    m = trees.mask.reshape(2, 4, 4)
    assert m[0, 3].tolist() == [True, True, False, True]  # 9 sees root, 7 and itself
    assert trees.draft_lens == [3, 1]


def test_chains_stay_chains_when_padded():
    drafts = [Draft([7, 8], [-1, 0]), Draft([], [])]
    trees = pack_drafts(drafts, roots=[1, 2], width=4)
    assert trees.is_chain
    assert _parents_from_mask(trees.mask, 4) == [[-1, 0, 1, 2], [-1, 0, 1, 2]]
    # A chain's ancestor mask is exactly causal.
    causal = np.tril(np.ones((4, 4), dtype=bool))
    assert (trees.mask.reshape(2, 4, 4) == causal).all()


def test_long_drafts_are_cut_to_width():
    trees = pack_drafts([Draft([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3])], [9], 3)
    assert trees.tokens.tolist() == [9, 1, 2]
    assert trees.draft_lens == [2]


def test_width_one_is_the_roots_alone():
    # The fallback tier: drafts (if any) are cut away, each root sees itself.
    trees = pack_drafts([Draft([1, 2], [-1, 0]), Draft([], [])], roots=[9, 8], width=1)
    assert trees.tokens.tolist() == [9, 8]
    assert trees.mask.tolist() == [True, True]
    assert trees.is_chain and trees.width == 1 and trees.draft_lens == [0, 0]


def test_ancestor_mask_of_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(50):
        width = int(rng.integers(1, 9))
        parent = np.zeros((1, width), dtype=np.int64)
        for i in range(1, width):
            parent[0, i] = rng.integers(0, i)
        mask = ancestor_mask(parent)[0]
        for i in range(width):
            anc, node = {i}, i
            while node:
                node = int(parent[0, node])
                anc.add(node)
            assert set(np.flatnonzero(mask[i]).tolist()) == anc


def test_bad_arguments():
    with pytest.raises(ValueError):
        pack_drafts([Draft([1], [-1])], [1, 2], 2)
    with pytest.raises(ValueError):
        pack_drafts([Draft([1], [-1])], [1], 0)
