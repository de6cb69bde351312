"""sglang-lookahead: trie-based lookahead speculative decoding for SGLang.

Public API::

    from lookahead import LookaheadCache, LookaheadConfig, Draft

The SGLang plugin (``lookahead.plugin:register``) is found through the
``sglang.srt.plugins`` entry point; nothing here imports SGLang, and the
native trie is only loaded when one of the names below is first used, so that
loading the plugin in a process that never uses LOOKAHEAD costs nothing.
"""

__version__ = "0.1.0"
__all__ = ["Draft", "LookaheadCache", "LookaheadConfig", "__version__"]


def __getattr__(name):
    if name in ("Draft", "LookaheadCache", "LookaheadConfig"):
        from lookahead import cache

        return getattr(cache, name)
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")
