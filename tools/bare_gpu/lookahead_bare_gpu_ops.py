"""The CPU stand-in's pure-torch kernels, loaded without its package.

``cpu_sgl_kernel/sgl_kernel/{norm_act,speculative,sampling}.py`` compute the
norms and gated activations, greedy and sampled tree acceptance and the
top-k / top-p renormalisations with plain tensor ops on the tensors' own
device. Its package ``__init__`` registers CPU ops (AMX probes among them)
that must not exist on a GPU host, so the modules are loaded here under a
private package name that never runs it.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

_PACKAGE = "_lookahead_torch_tree_ops"
_SOURCE = Path(__file__).resolve().parents[2] / "cpu" / "cpu_sgl_kernel" / "sgl_kernel"

if _PACKAGE not in sys.modules:
    package = types.ModuleType(_PACKAGE)
    package.__path__ = [str(_SOURCE)]
    sys.modules[_PACKAGE] = package

from _lookahead_torch_tree_ops.norm_act import (  # noqa: E402
    fused_add_rmsnorm_cpu,
    gelu_and_mul_cpu,
    gelu_tanh_and_mul_cpu,
    rmsnorm_cpu,
    silu_and_mul_cpu,
)
from _lookahead_torch_tree_ops.sampling import (  # noqa: E402
    top_k_renorm_prob,
    top_p_renorm_prob,
    tree_speculative_sampling_target_only,
)
from _lookahead_torch_tree_ops.speculative import (  # noqa: E402
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu as verify_tree_greedy,
)

__all__ = ["fused_add_rmsnorm_cpu", "gelu_and_mul_cpu", "gelu_tanh_and_mul_cpu", "reconstruct_indices_from_tree_mask",
           "rmsnorm_cpu", "silu_and_mul_cpu", "top_k_renorm_prob", "top_p_renorm_prob",
           "tree_speculative_sampling_target_only", "verify_tree_greedy"]
