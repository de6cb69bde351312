"""A corpus added at run time under tensor parallelism: every rank drafts
from it from the same step.

Each rank loads the corpus on its own thread, and the loads end at different
times; were each rank to read it as soon as its own load went on, the ranks
would draft different trees for the same step.  So under TP the corpus is
published to drafts when the load is committed, and the corpus manager
commits it at the first poll where every rank's load has ended.  Here two
ranks (two processes, a gloo group, as SGLang's TP CPU group) run SGLang's
add-then-poll flow with LOOKAHEAD's manager; rank 1's load is slowed down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

RANK = r'''
import json, sys, time
import torch.distributed as dist
from lookahead import LookaheadCache
from lookahead.plugin.corpus_server import manager_class, request_type

rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
ANSWER = list(range(100, 160))
out = {}
for mode in ("alone", "tp"):
    tp = mode == "tp"
    cache = LookaheadCache(max_memory_bytes=1 << 20)

    class Worker:  # the LookaheadWorker methods the manager calls, over a real cache
        def add_external_corpus(self, corpus_id, chunks, scope=None):
            time.sleep(1.0 * rank)  # rank 1's load starts, and ends, later
            return cache.add_corpus(corpus_id, chunks, scope, publish=not tp)

        def commit_corpus_load(self, corpus_id, count):
            if tp:
                cache.publish_corpus(corpus_id)

    answers = []
    manager = manager_class()(Worker(), lambda res, req: answers.append(res.success),
                              dist.group.WORLD if tp else None)
    assert manager.add(request_type()(corpus_id="manual", token_chunks=[ANSWER])) is None
    cache.put_prompt("r", [7, 8] + ANSWER[:4])
    drafted = []  # per poll: does the draft come from the corpus
    for poll in range(25):
        manager.check_pending_load()
        drafted.append(cache.draft("r", [7, 8] + ANSWER[:4], 4).tokens == ANSWER[4:8])
        time.sleep(0.1)
    out[mode] = {"drafted": drafted, "answers": answers}
    dist.barrier()
print(json.dumps(out))
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks() -> list[dict]:
    port = str(_free_port())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env) for rank in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()[-3000:]
        outs.append(json.loads(out.decode().strip().splitlines()[-1]))
    return outs


def test_under_tp_every_rank_drafts_from_the_corpus_from_the_same_poll():
    ranks = _two_ranks()
    for r in ranks:
        tp = r["tp"]
        assert tp["answers"] == [True]  # the add answered once, successfully
        assert tp["drafted"][-1] and tp["drafted"] == sorted(tp["drafted"])  # once drafted from, always
    assert ranks[0]["tp"]["drafted"] == ranks[1]["tp"]["drafted"]
    first = ranks[0]["tp"]["drafted"].index(True)
    assert first >= 7, first  # not before the slow rank's load (1 s late, 0.1 s a poll) ended
    # Without a TP group each rank reads the corpus from the start of its own
    # load: the fast rank drafts from it long before the slow one.
    alone = [r["alone"]["drafted"].index(True) for r in ranks]
    assert alone[0] + 5 < alone[1], alone
