"""Memory stays within its budget, and running out of it is an error, not a crash.

Eviction from the shared history, flat memory over 100k requests, the
history on huge pages, and allocations the process cannot make.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

from trie_helpers import SMALL_MEMORY, open_cache  # noqa: E402


def test_eviction_keeps_memory_bounded_and_drafts_recent_history():
    with open_cache(max_memory_bytes=SMALL_MEMORY) as cache:
        capacity = cache.config.shared_capacity
        # Request i outputs 64 tokens nobody else uses: 100*i ... 100*i + 63.
        last = 12 * capacity // 64
        for i in range(1, last + 1):
            cache.put_prompt(i, [1, 2, 3, 4])
            cache.put_output(i, list(range(100 * i, 100 * i + 64)))
            cache.finish(i)
        cache.synchronize()
        stats = cache.stats()
        assert stats["shared_tokens_seen"] > 10 * capacity
        assert stats["shared_tokens"] <= stats["shared_capacity"] == capacity
        assert stats["shared_bytes"] <= cache.config.max_memory_bytes
        assert stats["active_requests"] == 0 and stats["local_bytes"] == 0

        def continuation_after(first_tokens):
            cache.put_prompt("probe", first_tokens)
            cache.synchronize()
            d = cache.draft("probe", first_tokens, 8, one_branch=True)
            cache.finish("probe")
            return d.tokens

        # The most recent request's output is still there, verbatim...
        top = 100 * last
        assert continuation_after(list(range(top, top + 10))) == list(range(top + 10, top + 18))
        assert continuation_after(list(range(top - 100, top - 95))) == list(range(top - 95, top - 87))
        # ... the oldest ones are gone.
        for old in (1, 2, 50):
            assert continuation_after(list(range(100 * old, 100 * old + 10))) == []


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_flat_over_request_churn():
    """100k requests come and go: every request's state is freed at finish and
    the shared history stays within its budget, so memory does not grow."""
    rng = np.random.default_rng(0)
    with open_cache(max_memory_bytes=1 << 20, flush_tokens=16) as cache:
        checkpoints = {}  # requests done -> (cache bytes, process RSS)
        for i in range(100_000):
            prompt = rng.integers(0, 5000, size=int(rng.integers(1, 64)))
            cache.put_prompt(i, prompt)
            cache.put_output(i, prompt[:3])
            cache.put_output(i, rng.integers(0, 5000, size=20))
            if i % 7 == 0:
                cache.draft(i, prompt, 4)
            cache.finish(i)
            if i + 1 in (500, 50_000):
                cache.synchronize()
                checkpoints[i + 1] = (cache.stats()["total_bytes"], _rss_bytes())
        cache.synchronize()
        stats = cache.stats()
        assert stats["active_requests"] == 0 and stats["local_bytes"] == 0
        assert stats["prompts"] == stats["finished"] == 100_000
        assert stats["total_bytes"] == checkpoints[500][0] == checkpoints[50_000][0] == stats["shared_bytes"]
        assert stats["shared_bytes"] <= cache.config.max_memory_bytes
        assert stats["failed_inserts"] == 0
        # Process memory: the bounds leave room for allocator noise yet catch
        # a leak of 160 bytes per request over the second half (one leaked
        # request store would be tens of kB).
        rss = _rss_bytes()
        assert rss - checkpoints[500][1] < 16 << 20
        assert rss - checkpoints[50_000][1] < 8 << 20


def _anon_huge_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) << 10
    return 0


def _thp_mode() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "unavailable"


@pytest.mark.skipif(_thp_mode() not in ("always", "madvise"),
                    reason=f"the kernel offers no transparent huge pages ({_thp_mode()})")
def test_shared_history_lives_on_huge_pages():
    """The shared history's arrays (read at random by every draft) are
    advised onto 2 MiB pages; a request store's small arrays are not."""
    gc.collect()  # no earlier test's cache is freed while this one measures
    before = _anon_huge_bytes()
    with open_cache(max_memory_bytes=64 << 20) as cache:
        shared = cache.stats()["shared_bytes"]
        assert _anon_huge_bytes() - before >= shared // 2, (before, _anon_huge_bytes(), shared)
        cache.put_prompt("r", list(range(1000)))
        cache.synchronize()
        huge = _anon_huge_bytes()
        assert cache.draft("r", list(range(10)), 4).tokens == list(range(10, 14))
        for i in range(20):
            cache.put_prompt(i, list(range(2000)))
        cache.synchronize()
        if _thp_mode() == "madvise":  # ("always" may put any large malloc arena on huge pages)
            assert _anon_huge_bytes() <= huge  # 20 request stores: small arrays, plain pages


def test_what_the_process_cannot_allocate_is_a_memory_error():
    """Within the machine's memory but beyond what the process may map: a
    request's output that its store cannot grow to hold, or a scope's
    history that cannot grow: a MemoryError that says so (a failed insert,
    when it is the insert thread's), nothing changed, and the process goes
    on (the first used to wrap the request's stream)."""
    script = textwrap.dedent("""
        import resource, sys
        import numpy as np
        sys.path.insert(0, sys.argv[1])
        from lookahead import LookaheadCache
        from lookahead.trie._inserter import Inserter
        from lookahead.trie._store import TokenStore
        huge_output = np.ones(60_000_000, dtype=np.int32)
        cache = LookaheadCache(max_memory_bytes=1 << 30)  # histories are allocated as they grow
        cache.put_prompt("r", [1, 2, 3, 1, 2])
        cache.synchronize()  # the insert thread's stack and arena are mapped by now
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) << 10
        # Room to read the output (up to 384 MB while its buffer grows), not
        # for a store of 64M tokens (2.3 GB) or a history of 32M (1.2 GB).
        resource.setrlimit(resource.RLIMIT_AS, (vm + (600 << 20), resource.RLIM_INFINITY))
        history = TokenStore(0, True, (1, 2, 4, 8), 24)
        try:
            history.resize(1 << 25)
        except MemoryError as exc:
            print("MemoryError:", exc)
        inserter = Inserter()
        inserter.resize(history, 1 << 25)
        inserter.synchronize()
        print("queued resize:", inserter.failures, "failed, capacity", history.capacity)
        inserter.resize(history, 1 << 10)
        inserter.synchronize()
        print("then:", inserter.failures, "failed, capacity", history.capacity)
        try:
            cache.put_output("r", huge_output)
        except MemoryError as exc:
            print("MemoryError:", exc)
        cache.put_output("r", [3])
        print("draft:", cache.draft("r", [3, 1], 3).tokens, cache.stats()["output_tokens"])
    """)
    out = subprocess.run([sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "MemoryError: out of memory resizing a scope's history to 33,554,432 tokens; it is unchanged" \
        in out.stdout, out.stdout
    assert "queued resize: 1 failed, capacity 0" in out.stdout, out.stdout
    assert "then: 1 failed, capacity 1024" in out.stdout, out.stdout
    assert "MemoryError: out of memory growing a token store of 5 tokens by 60,000,000" in out.stdout, out.stdout
    assert "Exception ignored" not in out.stderr, out.stderr
    assert "draft: [2, 3, 1] 1" in out.stdout, out.stdout  # the store holds [1, 2, 3, 1, 2, 3]
