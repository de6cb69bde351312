"""Under overlap scheduling each committed token reaches the trie once.

The worker drafts before the scheduler has processed the previous step, so
that step's accepted tokens come as ``pending`` while ``output_ids`` lags;
one step later the same tokens are in ``output_ids``. The feed counts what it
gave, so whichever of the two carries a token, the request's store gets it
once and in order (checked through the store's size and the drafts it gives).
"""

from __future__ import annotations

from types import SimpleNamespace

from lookahead import LookaheadCache
from lookahead.plugin.request_feed import RequestFeed


def _req(rid, prompt):
    return SimpleNamespace(rid=rid, origin_input_ids=list(prompt), origin_input_ids_unpadded=None,
                           output_ids=[], finished=lambda: False)


def test_pending_tokens_are_fed_once():
    cache = LookaheadCache(background=False)
    given = []
    put_output = cache.put_output

    def record(rid, tokens):
        given.extend(tokens)
        put_output(rid, tokens)

    cache.put_output = record
    feed = RequestFeed(cache)
    req = _req("r", [5, 6, 7])
    feed.start([req])
    stream = [11, 12, 13, 14, 15, 16, 17]
    # Step 1: the prefill's token is pending; step 2: it is in output_ids and
    # two more are pending; step 3: those two have landed, three more pending.
    for landed, pending in ((0, [11]), (1, [12, 13]), (3, [14, 15, 16]), (6, [17])):
        req.output_ids = stream[:landed]
        feed.sync([req], [pending])
    req.output_ids = stream
    feed.sync([req], None)  # overlap off again (a grammar batch): output_ids complete
    assert given == stream
    feed.finish("r")
    cache.close()


def test_a_rewound_output_is_not_fed_again():
    cache = LookaheadCache(background=False)
    given = []
    put_output = cache.put_output
    cache.put_output = lambda rid, tokens: (given.extend(tokens), put_output(rid, tokens))
    feed = RequestFeed(cache)
    req = _req("r", [1, 2])
    feed.start([req])
    req.output_ids = [3, 4, 5]
    feed.sync([req])
    req.output_ids = [3, 4]  # retraction rewound the output
    feed.sync([req])
    req.output_ids = [3, 4, 9]
    feed.sync([req])
    assert given == [3, 4, 5, 9]
    feed.finish("r")
    cache.close()


def test_late_roots_on_the_device_are_the_last_pending_tokens():
    """A width-1 step under overlap reads each request's root on the device;
    it is the last of the tokens a drafting step reads back to the host."""
    import sglang_args  # noqa: F401  (the worker imports sgl_kernel: the CPU stand-in on sys.path)
    import torch

    from lookahead.plugin.worker import LookaheadWorker

    gen = torch.Generator().manual_seed(0)
    for bs, stride in ((1, 1), (3, 4), (9, 8)):
        tokens = torch.randint(0, 50_000, (bs * stride,), generator=gen, dtype=torch.int32)
        lens = torch.randint(1, stride + 1, (bs,), generator=gen, dtype=torch.int32)
        late = (tokens, lens)
        roots = LookaheadWorker._late_roots(late)
        assert roots.dtype == torch.int64 and roots.shape == (bs,)
        assert roots.tolist() == [rows[-1] for rows in LookaheadWorker._pending_tokens(late)]
