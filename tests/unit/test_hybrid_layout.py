"""The hybrid's verify layout against EAGLE's, without a model.

``LookaheadHybridWorker`` reads EAGLE's tree back from its links
(``tree_from_links``) and lays trees out itself: an ancestor mask
(``ancestor_mask``), SGLang's ``reconstruct_indices_from_tree_mask`` for
positions and links, and on GPUs the FULL_MASK layout (``full_verify_mask``).
For EAGLE's own trees every piece must equal what EAGLE's
``build_tree_kernel_efficient`` writes (the CPU stand-in, itself checked
against SGLang's Triton kernel in ``test_cpu_kernels.py``): then a step
that verifies EAGLE's tree through the hybrid's layout verifies exactly
what EAGLE would have, and the GPU-only FULL_MASK path is checked here too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead.plugin.hybrid import tree_from_links
from lookahead.plugin.verify import ancestor_mask, full_verify_mask
from test_cpu_kernels import _eagle_draft_tree, shim  # noqa: F401  (the sgl_kernel stand-in fixture)


@pytest.mark.parametrize("topk,steps,n", [(1, 3, 4), (2, 3, 6), (4, 3, 8), (4, 5, 16), (8, 2, 8)])
def test_hybrid_layout_of_eagles_tree_is_eagles(shim, topk, steps, n):  # noqa: F811
    gen = torch.Generator().manual_seed(7 * topk + n)
    bs = 3
    seq = torch.tensor([5, 1, 9])
    parent_list, top, _ = _eagle_draft_tree(bs, topk, steps, n, gen)
    ref = {}
    for mode in (0, 1):  # FULL_MASK, QLEN_ONLY
        size = int(seq.sum()) * n + n * n * bs if mode == 0 else n * n * bs
        mask = torch.full((size,), True)
        links = torch.full((3, bs, n), -1, dtype=torch.long)
        pos = torch.empty(bs * n, dtype=torch.long)
        shim.build_tree_kernel_efficient_cpu(parent_list, top, seq, mask, pos, links[0], links[1], links[2],
                                             topk, steps, n, mode)
        ref[mode] = (mask, pos, links)
    _, pos_ref, links_ref = ref[1]

    # EAGLE's tree read back from its links, as the worker reads it ...
    parent = np.zeros((bs, n), dtype=np.int64)
    for b in range(bs):
        nodes, parents = tree_from_links(links_ref[1, b].tolist(), links_ref[2, b].tolist())
        assert nodes == list(range(1, n)), "every EAGLE node hangs below the root"
        parent[b, 1:] = [0 if p < 0 else nodes[p] for p in parents]
    # ... and laid out again as the hybrid lays out its trees.
    tree_mask = torch.from_numpy(ancestor_mask(parent).reshape(-1))
    assert torch.equal(tree_mask, ref[1][0])
    pos = torch.empty(bs * n, dtype=torch.long)
    links = torch.full((3, bs, n), -1, dtype=torch.long)
    shim.reconstruct_indices_from_tree_mask(tree_mask, seq, pos, links[0], links[1], links[2], bs, n)
    assert torch.equal(pos, pos_ref) and torch.equal(links, links_ref)
    full = full_verify_mask(tree_mask, seq, int(seq.sum()), n, torch.empty(ref[0][0].numel(), dtype=torch.bool))
    assert torch.equal(full, ref[0][0])


def test_tree_from_links_skips_unlinked_nodes():
    # Root 0 -> 1 -> 3, root -> 2; node 4 linked to nothing.
    first = [1, 3, -1, -1, -1]
    sibling = [-1, 2, -1, -1, -1]
    assert tree_from_links(first, sibling) == ([1, 2, 3], [-1, -1, 0])
