"""Weight "packing" and the packed linear layer, as plain torch.

On an AMX CPU sglang repacks every eligible bf16/fp16 linear weight once with
``convert_weight_packed`` (into the VNNI layout of the real kernel) and later
multiplies with ``weight_packed_linear(x, packed, bias, is_vnni=True)``. Here
packing is the identity, so the "packed" weight is the ordinary
``[out_features, in_features]`` matrix and the linear is ``F.linear``.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    """Identity packing; returns a copy so the op's output never aliases its input."""
    return weight.detach().clone()


def weight_packed_linear(
    mat1: torch.Tensor, mat2: torch.Tensor, bias: Optional[torch.Tensor], is_vnni: bool
) -> torch.Tensor:
    """``mat1 @ mat2.T + bias`` in ``mat1``'s dtype (sglang keeps bias in fp32)."""
    out = F.linear(mat1, mat2.to(mat1.dtype))
    if bias is not None:
        out = (out.to(torch.float32) + bias.to(torch.float32)).to(mat1.dtype)
    return out
