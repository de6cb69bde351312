"""``sgl_kernel.mamba``: Mamba/GDN kernels, not implemented by this shim.

sglang's CPU branches of ``gdn_backend``/``kda_backend``/``gdn_triton`` import
these at module level; the raising stubs let those modules load.
"""

from .stubs import module_stubs

globals().update(module_stubs(__name__))
