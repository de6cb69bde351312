"""The trie and its cache: what drafts, with no SGLang and no torch.

``LookaheadCache`` (``cache``) is the public face: histories per scope fed
by every request's prompt and output, external corpora beside them
(``corpora``), scopes and their memory budget (``scopes``), and the options
(``config``, ``_tuning``). The native modules (``_tokens``, ``_store``,
``_inserter``, ``_draft_tree``, ``_matching``, ``_drafting``) hold the token
streams, the index, its writer thread and the drafting itself, with the GIL
released. ``tests/unit/test_package_layout.py`` keeps this package free of
sglang and torch.
"""
