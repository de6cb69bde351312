"""``sgl_kernel.utils``: programmatic dependent launch is an optimisation; off is always correct."""


def is_arch_support_pdl() -> bool:
    return False
