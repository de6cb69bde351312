"""``sgl_kernel.flash_attn``: FlashAttention-3, bound by its backend's module;
the bare-GPU runs use the Triton backend, so these only raise."""

from ._stubs import stub

flash_attn_varlen_func = stub("sgl_kernel.flash_attn.flash_attn_varlen_func")
flash_attn_with_kvcache = stub("sgl_kernel.flash_attn.flash_attn_with_kvcache")
