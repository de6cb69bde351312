"""Functions that stand for kernels this stand-in does not implement."""


def stub(qualname: str):
    def _not_implemented(*args, **kwargs):
        raise NotImplementedError(f"{qualname} is not provided by the bare-GPU sgl_kernel stand-in")

    _not_implemented.__name__ = qualname.rsplit(".", 1)[-1]
    _not_implemented.__qualname__ = qualname
    return _not_implemented
