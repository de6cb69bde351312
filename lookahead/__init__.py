"""sglang-lookahead: trie-based lookahead speculative decoding for SGLang.

Public API::

    from lookahead import LookaheadCache, LookaheadConfig, Draft

The SGLang plugin (``lookahead.plugin:register``) is found through the
``sglang.srt.plugins`` entry point; nothing here imports SGLang, and the
native trie is only loaded when ``LookaheadCache`` or ``Draft`` is first
used, so that loading the plugin in a process that never uses LOOKAHEAD
costs nothing.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Draft", "LookaheadCache", "LookaheadConfig", "__version__"]

# The SGLang release whose internals the plugin follows (worker interface,
# ServerArgs assembly, CUDA-graph runner, the CPU call sites that the test
# stand-in for sgl_kernel mirrors); another release may differ.
SUPPORTED_SGLANG_VERSION = "0.5.23"


def check_sglang_version(installed: str | None = None, *, consequence: str = "LOOKAHEAD is not registered") -> None:
    """Raise a clear error unless the installed sglang (or ``installed``) is
    the supported release; ``consequence`` says what therefore does not happen."""
    if installed is None:
        import sys
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("sglang")
        except PackageNotFoundError:  # a source tree on sys.path, if it is imported already
            installed = getattr(sys.modules.get("sglang"), "__version__", None)
    if installed != SUPPORTED_SGLANG_VERSION:
        found = f"sglang {installed} is installed" if installed else "sglang is not installed"
        raise RuntimeError(
            f"sglang-lookahead supports sglang=={SUPPORTED_SGLANG_VERSION} only, but {found}; install "
            f"sglang=={SUPPORTED_SGLANG_VERSION} (pip install 'sglang=={SUPPORTED_SGLANG_VERSION}'). "
            f"{consequence}."
        )


def __getattr__(name):
    if name == "LookaheadConfig":
        from lookahead.trie.config import LookaheadConfig

        return LookaheadConfig
    if name in ("Draft", "LookaheadCache"):
        from lookahead.trie import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
