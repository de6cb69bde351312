"""``sgl_kernel.quantization``: GGUF kernels, never run here."""

from ._stubs import stub

_NAMES = ["ggml_dequantize", "ggml_moe_a8", "ggml_moe_a8_vec", "ggml_mul_mat_a8", "ggml_mul_mat_vec_a8"]
globals().update({name: stub(f"sgl_kernel.quantization.{name}") for name in _NAMES})
