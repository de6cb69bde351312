"""Drive every native path of the cache from several threads at once.

Run by ``test_sanitizers.py`` against a sanitizer build of the extension
(ThreadSanitizer, AddressSanitizer): the sanitizers judge the native code, so
this script only has to reach it all while the background inserter works —
prompt indexing in chunks (32k-token prompts among them), output shares into
scopes' histories that grow, shrink, are dropped and wrap, within a small
budget, and are saved in the background meanwhile, a small history whose map
of heads fills and is purged while it is drafted, local stores that grow and
rehash, drafts of both shapes, batch drafts, ``stats()``, a ``finish()``
racing a draft of the same request, and requests aborted while their prompt
is still being indexed.  It exits non-zero if the cache misbehaves.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import threading

import numpy as np

import lookahead.trie._drafting
import lookahead.trie._store
from lookahead import LookaheadCache

VOCAB = 24


def main(requests_per_worker: int = 12, workers: int = 3) -> int:
    cache = LookaheadCache(max_memory_bytes=1 << 17, flush_tokens=16)  # room for five small histories
    scopes = [None, "a", "b", "c", "d", "e"]
    errors: list = []
    live: dict = {}
    live_lock = threading.Lock()
    done = threading.Event()

    def worker(w: int) -> None:
        rng = random.Random(w)
        try:
            for i in range(requests_per_worker):
                rid = (w, i)
                size = 32_768 if i % 6 == 0 else rng.randint(0, 600)
                prompt = np.asarray([rng.randrange(VOCAB) for _ in range(size)], np.int32)
                cache.put_prompt(rid, prompt, scope=rng.choice(scopes), share=i % 5 != 4)
                stream = list(prompt)
                with live_lock:
                    live[rid] = stream
                for step in range(rng.randint(5, 40)):
                    out = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
                    cache.put_output(rid, out)
                    stream.extend(out)
                    draft = cache.draft(rid, stream, rng.randint(0, 12), one_branch=step % 3 == 0)
                    if len(draft.tokens) != len(draft.parents):
                        raise AssertionError("draft tokens and parents differ in length")
                    if step % 8 == 0:
                        cache.stats()
                with live_lock:
                    del live[rid]
                cache.finish(rid)
                # A request aborted right after arriving: its store is dropped
                # while the inserter may still be indexing (or has yet to start
                # on) its prompt.
                gone = ("aborted", w, i)
                cache.put_prompt(gone, prompt[: rng.randint(0, len(prompt))])
                if i % 2:
                    cache.put_output(gone, [rng.randrange(VOCAB)])
                cache.finish(gone)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    def racer() -> None:
        # Drafts (single and batched) of whatever is live, finish included.
        rng = random.Random(99)
        try:
            while not done.is_set():
                with live_lock:
                    picked = rng.sample(sorted(live), min(len(live), 3))
                    contexts = [list(live[r][-64:]) for r in picked]
                if not picked:
                    continue
                try:
                    cache.batch_draft(picked, contexts, rng.randint(1, 8), one_branch=rng.random() < 0.5)
                except ValueError:
                    pass  # a request finished between the pick and the draft
        except Exception as exc:
            errors.append(exc)

    def saver(path: str) -> None:
        # Snapshots read the histories while shares and resizes change them.
        try:
            while not done.is_set():
                cache.save(path, background=True).result()
        except Exception as exc:
            errors.append(exc)

    def small_history() -> None:
        # A history kept at 256 tokens wraps: its map of heads fills with
        # evicted keys and is purged, under the lock, while it is drafted.
        rng = random.Random(7)
        store = lookahead.trie._store.TokenStore(0, True, (1, 2, 4, 8), 14)
        store.resize(256)
        drafter = lookahead.trie._drafting.Drafter(tuple)
        config = cache._draft_config
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                drafter.draft_context(None, store, [rng.randrange(400) for _ in range(8)], 6, False, config, 2**31 - 1)

        t = threading.Thread(target=reader)
        t.start()
        try:
            for _ in range(300):
                store.append_indexed(np.asarray([-1] + [rng.randrange(400) for _ in range(60)], np.int32))
        except Exception as exc:
            errors.append(exc)
        finally:
            stop.set()
            t.join()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
    tmp = tempfile.mkdtemp()
    extra = [threading.Thread(target=racer), threading.Thread(target=saver, args=(os.path.join(tmp, "t.npz"),)),
             threading.Thread(target=small_history)]
    for t in extra + threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in extra:
        t.join()
    cache.synchronize()
    stats = cache.stats()
    cache.close()
    expected = 2 * workers * requests_per_worker
    if errors:
        print(f"errors: {errors!r}", file=sys.stderr)
        return 1
    if stats["finished"] != expected or stats["active_requests"] != 0 or stats["failed_inserts"]:
        print(f"inconsistent stats: {stats}", file=sys.stderr)
        return 1
    if stats["shared_bytes"] > cache.config.max_memory_bytes:
        print(f"shared history over budget: {stats}", file=sys.stderr)
        return 1
    print(f"ok: {expected} requests, {stats['shared_tokens_seen']} tokens shared, "
          f"extensions {lookahead.trie._store.__file__}, {lookahead.trie._drafting.__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
