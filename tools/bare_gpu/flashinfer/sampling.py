"""``flashinfer.sampling`` renormalisations, in torch, on the probabilities' device."""

from lookahead_bare_gpu_ops import top_k_renorm_prob as top_k_renorm_probs
from lookahead_bare_gpu_ops import top_p_renorm_prob as top_p_renorm_probs

__all__ = ["top_k_renorm_probs", "top_p_renorm_probs"]
