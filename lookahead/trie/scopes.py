"""How much history each scope keeps, within one memory budget.

A *scope* (a tenant: SGLang's ``cache_salt`` or ``extra_key``, or ``None``)
has its own shared history, so that no request drafts from another scope's
text (see docs/isolation.md).  Histories start empty and grow
as their scope is used: a thousand scopes with a few requests each cost what
their text costs, not a thousand full rings.  ``max_memory_bytes`` bounds
them all together; when it is reached, the least recently used scope's
oldest text goes first.

This module is the policy alone, in plain Python: which history grows,
shrinks or is dropped, and when.  It decides from the calls it is given
(never from timing or the insert thread's progress), so the same calls size
every history the same way on every run and every TP rank.  The cache
applies its decisions to the native stores, in order, ahead of the share
that needed them; ``tests/support/trie_reference.py`` applies them to its model.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Hashable, NamedTuple, Optional

# The scope of a request that shares no history (put_prompt(share=False)):
# no scope is ever keyed by it, so its drafts find no shared history.
PRIVATE = object()

# The smallest history a scope gets (tokens): about one request's first share
# (a separator, 24 prompt tokens and 128 of output), 21 kB with the default orders.
MIN_CAPACITY = 256


def check_scope(scope: Any) -> Optional[str]:
    """``scope`` if it is a valid scope (a ``str``, or ``None`` for the
    default scope); a clear ``TypeError`` otherwise."""
    if scope is None or type(scope) is str:
        return scope
    if isinstance(scope, str):
        return str(scope)  # a str subclass: its plain value
    raise TypeError(f"scope must be a str or None, got {type(scope).__name__} {scope!r}")


class Scope:
    """One scope's history as the budget sees it.

    Positions are absolute: ``n`` tokens were ever appended, the history has
    room for ``cap`` (0: none yet), and nothing below ``lo`` is live (a
    shrink dropped it), so the live positions are ``[base, n)``.
    ``store`` is whatever holds the text (the cache's native store)."""

    __slots__ = ("key", "cap", "n", "lo", "store")

    def __init__(self, key: Optional[str]):
        self.key = key
        self.cap = 0
        self.n = 0
        self.lo = 0
        self.store: Any = None

    @property
    def base(self) -> int:
        return max(self.lo, self.n - self.cap)

    @property
    def held(self) -> int:
        return self.n - self.base


class Resize(NamedTuple):
    """Give ``scope``'s history room for ``capacity`` tokens, keeping its
    newest ones (fewer than before: its oldest text goes)."""

    scope: Scope
    capacity: int


class Drop(NamedTuple):
    """Free ``scope``'s history: all of its text goes."""

    scope: Scope


class ScopeBudget:
    """Sizes the scopes' histories within ``max_bytes``.

    ``full_capacity`` tokens is the most one history holds (the shared ring
    of an unscoped cache: its stream and index fit the budget alone); its
    chain keys have ``log2(full_capacity / 2)`` bits whatever its size
    (see resize_store in ``_native.hpp``).  A history's size is a power of
    two from ``MIN_CAPACITY`` up; ``bytes_for`` is exactly what the native
    store of that size holds.
    """

    def __init__(self, max_bytes: int, full_capacity: int, norders: int):
        if full_capacity & (full_capacity - 1) or full_capacity < 2 * MIN_CAPACITY:
            raise ValueError(f"full_capacity must be a power of two >= {2 * MIN_CAPACITY}, got {full_capacity}")
        self.max_bytes = max_bytes
        self.full_capacity = full_capacity
        self.key_bits = full_capacity.bit_length() - 2  # 2**key_bits slots: half as many as tokens
        if self.key_bits > 32:  # chain heads and links are 32-bit
            raise ValueError(f"a history of {full_capacity:,} tokens is more than the 2**33 supported")
        self.norders = norders
        if self.bytes_for(full_capacity) > max_bytes:
            raise ValueError(f"a full history ({self.bytes_for(full_capacity):,} bytes) exceeds "
                             f"the budget ({max_bytes:,} bytes)")
        # Least recently used first.  Only scopes that hold a history are here:
        # a scope's state is freed with its text.
        self.scopes: OrderedDict[Optional[str], Scope] = OrderedDict()
        self.bytes = 0  # what the histories hold together
        self.tokens = 0  # live tokens, all histories
        self.appended = 0  # tokens ever appended, all histories

    def bytes_for(self, capacity: int) -> int:
        """Bytes of a history with room for ``capacity`` tokens: the stream
        and its links (4 bytes per token, and per token and order), and the
        chain heads, as the full table (2**key_bits slots of 4 bytes per
        order) or, below 1/8 of the full size where that costs less, a map of
        2 * capacity 8-byte buckets per order."""
        if capacity == 0:
            return 0
        per_token = 4 + 4 * self.norders
        if capacity < (1 << self.key_bits) // 4:
            return capacity * (per_token + 16 * self.norders)
        return capacity * per_token + 4 * self.norders * (1 << self.key_bits)

    def touch(self, key: Optional[str]) -> None:
        """``key``'s scope was just used (a request of it started)."""
        if key in self.scopes:
            self.scopes.move_to_end(key)

    def share(self, key: Optional[str], count: int) -> tuple[Scope, list]:
        """Plan the append of ``count`` tokens to ``key``'s history.

        Returns the scope and the ``Resize`` / ``Drop`` steps to apply, in
        order, before appending (the scope's own growth last).  The scope
        grows (by powers of two, up to ``full_capacity``) to hold its text
        and the new tokens; the room comes from the other scopes, least
        recently used first, each giving up its oldest text (its history
        halved, as often as needed) or, once down to ``MIN_CAPACITY``, all
        of it.  When even that is not enough the history stays as it is and
        drops its own oldest tokens as a ring."""
        scope = self.scopes.get(key)
        if scope is None:
            scope = self.scopes[key] = Scope(key)
        else:
            self.scopes.move_to_end(key)
        steps: list = []
        need = scope.held + count
        if scope.cap < need and scope.cap < self.full_capacity:
            target = min(self.full_capacity, max(MIN_CAPACITY, 1 << (need - 1).bit_length()))
            grow = self.bytes_for(target) - self.bytes_for(scope.cap)
            while self.bytes + grow > self.max_bytes and len(self.scopes) > 1:
                victim = next(iter(self.scopes.values()))  # never ``scope``: it is the most recent
                steps.append(self._evict(victim, self.bytes + grow - self.max_bytes))
            cap = target
            while cap > scope.cap and self.bytes + self.bytes_for(cap) - self.bytes_for(scope.cap) > self.max_bytes:
                cap //= 2
            if cap > scope.cap:
                steps.append(self._resize(scope, cap))
        self._account(scope, count)
        return scope, steps

    def _evict(self, victim: Scope, excess: int):
        # Free ``excess`` bytes from ``victim``'s oldest text.
        cap = victim.cap
        while cap > MIN_CAPACITY and self.bytes_for(victim.cap) - self.bytes_for(cap) < excess:
            cap //= 2
        if self.bytes_for(victim.cap) - self.bytes_for(cap) >= excess:
            return self._resize(victim, cap)
        return self.drop(victim)

    def drop(self, victim: Scope) -> "Drop":
        """Plan the removal of ``victim``'s whole history."""
        self.bytes -= self.bytes_for(victim.cap)
        self.tokens -= victim.held
        del self.scopes[victim.key]
        victim.cap = victim.n = victim.lo = 0
        return Drop(victim)

    def _resize(self, scope: Scope, capacity: int) -> Resize:
        # As resize_store: the newest min(held, capacity) positions stay.
        self.bytes += self.bytes_for(capacity) - self.bytes_for(scope.cap)
        self.tokens -= scope.held
        scope.lo = max(scope.base, scope.n - capacity)
        scope.cap = capacity
        self.tokens += scope.held
        return Resize(scope, capacity)

    def _account(self, scope: Scope, count: int) -> None:
        self.tokens -= scope.held
        scope.n += count
        self.tokens += scope.held
        self.appended += count

    def summary(self) -> dict[Hashable, dict]:
        """Per scope, least recently used first: live tokens, room and bytes."""
        return {s.key: {"tokens": s.held, "capacity": s.cap, "bytes": self.bytes_for(s.cap)}
                for s in self.scopes.values()}
