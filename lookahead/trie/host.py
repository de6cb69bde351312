"""Facts about the machine that a memory budget is checked against.

Kept apart from the cache so that the server-argument checks, which run in
the launcher before any trie exists, can use them without loading the
native module.
"""

from __future__ import annotations

import os


def physical_memory_bytes() -> int:
    """RAM of this machine, 0 where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def memory_short_of(nbytes: int) -> int:
    """This machine's RAM when ``nbytes`` is more than it, else 0 (also
    where the OS does not say how much it has)."""
    physical = physical_memory_bytes()
    return physical if physical and nbytes > physical else 0
