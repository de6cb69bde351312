"""Validation of token-id inputs at the public API boundary.

The native trie trusts its inputs (int32, in range, contiguous) so that its
hot loops carry no checks.  Everything that reaches it from outside passes
through :func:`as_token_array` first, which either returns such an array
without copying when it can, or raises a ``TypeError``/``ValueError`` that
names the problem, before anything has been changed.
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np

# Token ids are stored as int32; ids above this cannot be represented.
MAX_TOKEN_ID = np.iinfo(np.int32).max
# A draft never exceeds this many tokens; larger budgets mean "no limit" and are clamped.
MAX_BUDGET = 512


def as_token_array(tokens: Any, what: str = "tokens", vocab_size: int | None = None) -> np.ndarray:
    """Return ``tokens`` as a contiguous 1-D int32 array of valid ids.

    Accepts Python sequences of ints, ``array.array`` of an integer type and
    integer numpy arrays (and anything else exposing ``__array__``, such as a
    CPU tensor).  Floats, bools, strings, nested sequences and out-of-range
    ids are rejected.
    """
    if isinstance(tokens, np.ndarray):
        arr = tokens
    elif isinstance(tokens, array.array):
        if tokens.typecode not in "bBhHiIlLqQ":
            raise TypeError(f"{what}: array.array of typecode {tokens.typecode!r} does not hold integer token ids")
        arr = np.frombuffer(tokens, dtype=tokens.typecode) if len(tokens) else np.empty(0, np.int32)
    elif isinstance(tokens, (str, bytes)):
        raise TypeError(f"{what}: expected a sequence of integer token ids, got {type(tokens).__name__}")
    else:
        try:
            arr = np.asarray(tokens)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{what}: expected a sequence of integer token ids ({exc})") from None
        if arr.dtype == object or (arr.size == 0 and arr.dtype.kind == "f"):
            if arr.size == 0:
                arr = np.empty(0, np.int32)
            else:
                raise TypeError(f"{what}: expected integer token ids, got a mix of {type(tokens).__name__} items")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size:
        limit = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
        lo, hi = arr.min(), arr.max()
        if lo < 0 or hi > limit:
            bad_index = int(np.flatnonzero((arr < 0) | (arr > limit))[0])
            bound = f"vocab_size {vocab_size}" if vocab_size is not None else "the int32 range"
            raise ValueError(f"{what}: token id {int(arr[bad_index])} at index {bad_index} is outside [0, {limit}] ({bound})")
    if arr.dtype != np.int32 or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr, dtype=np.int32)
    return arr


def check_budget(budget: Any) -> int:
    """Draft budgets are non-negative Python or numpy integers."""
    if type(budget) is int and 0 <= budget <= MAX_BUDGET:  # every decode step: skip the general checks
        return budget
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise TypeError(f"budget must be an integer, got {type(budget).__name__}")
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    return min(int(budget), MAX_BUDGET)
