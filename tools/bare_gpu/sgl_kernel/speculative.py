"""``sgl_kernel.speculative``: the tree reconstruction, in torch."""

from lookahead_bare_gpu_ops import reconstruct_indices_from_tree_mask

__all__ = ["reconstruct_indices_from_tree_mask"]
