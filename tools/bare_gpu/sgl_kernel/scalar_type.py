"""``sgl_kernel.scalar_type``: only the name is bound at import time."""


class ScalarType:
    pass
