"""GPU validation a user runs on their own model: ``python -m lookahead.validate``.

The SGLang feature matrix against plain decoding (``feature_matrix``), with
16-bit answers compared up to near ties (``numerics``), and
``sglang.bench_serving`` figures (``serving``), on servers started by
``server``. The CPU tests use the same matrix and rules, so what a user runs
on a GPU is what CI runs on a CPU.
"""
