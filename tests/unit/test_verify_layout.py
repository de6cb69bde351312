"""The verify step's layout: widths per batch size, the device-built GPU mask,
and the shape-only verify input SGLang's graph capture and warm-up get."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lookahead.plugin.verify import FALLBACK_WIDTH, WidthPlan
from lookahead.plugin.verify import ancestor_mask, full_verify_mask


def test_width_is_full_up_to_the_max_batch_size_and_one_above():
    plan = WidthPlan(num_draft_tokens=8, max_batch_size=4, free_width=False)
    assert [plan.width(bs, longest_draft=2) for bs in (1, 2, 4)] == [8, 8, 8]
    assert plan.width(2, longest_draft=0) == FALLBACK_WIDTH  # nothing drafted: the root alone
    assert [plan.width(bs, longest_draft=7) for bs in (5, 16, 256)] == [FALLBACK_WIDTH] * 3
    assert plan.widths == (1, 8)
    assert plan.graph_batch_sizes(8, [1, 2, 4, 8, 16]) == [1, 2, 3, 4]
    assert plan.graph_batch_sizes(1, [1, 2, 4, 8, 16]) == [1, 2, 4, 8, 16]


def test_free_width_follows_the_longest_draft():
    plan = WidthPlan(num_draft_tokens=8, max_batch_size=4, free_width=True)
    assert [plan.width(2, n) for n in (0, 1, 3, 7, 20)] == [1, 2, 4, 8, 8]
    assert plan.width(5, 7) == 1


def test_no_speculation_without_draft_room_or_batch_budget():
    assert not WidthPlan(1, 4, False).speculates(1)
    assert not WidthPlan(8, 0, False).speculates(1)
    assert WidthPlan(8, 0, False).widths == (1,)
    assert WidthPlan(8, 0, False).width(1, 7) == 1


def _host_full_mask(tree: np.ndarray, seq_lens: list, width: int) -> np.ndarray:
    """The layout NGRAM builds on the host: per request, seq_len ones then its tree rows."""
    tree = tree.reshape(len(seq_lens), width, width)
    rows = [np.concatenate([np.ones((width, n), dtype=bool), tree[i]], axis=1).reshape(-1)
            for i, n in enumerate(seq_lens)]
    return np.concatenate(rows)


@pytest.mark.parametrize("width", [1, 3, 8])
def test_device_mask_equals_the_host_layout(width):
    rng = np.random.default_rng(width)
    seq_lens = [5, 1, 37, 12]
    parent = np.zeros((len(seq_lens), width), dtype=np.int64)
    for i in range(1, width):
        parent[:, i] = rng.integers(0, i, size=len(seq_lens))
    tree = ancestor_mask(parent).reshape(-1)
    buffer = torch.zeros(10_000, dtype=torch.bool)
    got = full_verify_mask(torch.from_numpy(tree), torch.tensor(seq_lens), sum(seq_lens), width, buffer)
    expected = _host_full_mask(tree, seq_lens, width)
    assert got.numel() == expected.size
    assert np.array_equal(got.numpy(), expected)
    # The tree part really is in it (not just ones): some entries are False.
    assert width == 1 or not expected.all()


@pytest.fixture
def published(plugin, model_dir):
    """A LOOKAHEAD server's published config, active in this process."""
    from sglang.srt.runtime_context import create_context, use_context

    from sglang_args import _engine_args, _resolve

    record = _resolve(_engine_args(model_dir, speculative_num_draft_tokens=6))
    with use_context(create_context(record, role="scheduler")):
        yield record


def test_capture_and_warmup_inputs_exist_for_lookahead(published):
    """SGLang builds shape-only verify inputs for its own algorithms only; with
    the hooks, graph capture and the autotune warm-up get LOOKAHEAD's."""
    from lookahead.plugin import hooks as sglang_hooks
    from lookahead.plugin.verify import LookaheadVerifyInput

    sglang_hooks.install()
    from sglang.srt.speculative import spec_info
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algo = SpeculativeAlgorithm.from_string("LOOKAHEAD")
    mask = torch.ones(64, dtype=torch.bool)
    dummy = spec_info.create_dummy_verify_input(algo, mask, 4, False)
    assert isinstance(dummy, LookaheadVerifyInput)
    assert dummy.draft_token_num == 4 and dummy.custom_mask is mask
    # Other algorithms are untouched.
    assert spec_info.create_dummy_verify_input(SpeculativeAlgorithm.NONE, mask, 4, False) is None


def test_a_tier_sees_its_own_width_and_batch_sizes_then_restores(published):
    """How each GPU tier's backend and graphs are sized: SGLang's own readers
    see the tier's width and batch sizes inside the override, the server's after."""
    from sglang.srt.runtime_context import get_exec, get_spec

    from lookahead.plugin.verify import width_override

    graph = get_exec().graph.cuda_graph_config
    before = (get_spec().speculative_num_draft_tokens, get_spec().speculative_eagle_topk, list(graph.decode.bs))
    assert before[0] == 6
    with width_override(6, [1, 2, 3]):
        assert get_spec().speculative_num_draft_tokens == 6
        decode = get_exec().graph.cuda_graph_config.decode
        assert list(decode.bs) == [1, 2, 3] and decode.max_bs == 3
    with width_override(FALLBACK_WIDTH):
        assert get_spec().speculative_num_draft_tokens == 1
        assert get_spec().speculative_eagle_topk == 1
        assert list(get_exec().graph.cuda_graph_config.decode.bs) == before[2]
    after = get_exec().graph.cuda_graph_config
    assert (get_spec().speculative_num_draft_tokens, get_spec().speculative_eagle_topk, list(after.decode.bs)) == before


class _BanTokens:
    """A grammar mask (``GrammarMask.apply``'s contract) that forbids some tokens."""

    def __init__(self, tokens):
        self.tokens = tokens

    def apply(self, logits):
        logits[:, self.tokens] = float("-inf")


@pytest.fixture
def cpu_tree_walk(published, monkeypatch):
    """SGLang's greedy tree walk as its CPU engine runs it, with the CPU
    stand-in's ``verify_tree_greedy_cpu`` (``published`` resolved a server
    record, which imports the stand-in from the path ``sglang_args`` set)."""
    import sgl_kernel
    from sglang.kernels.ops.speculative import spec_tree

    if not getattr(sgl_kernel, "IS_CPU_SHIM", False):
        pytest.skip("a real sgl_kernel is imported in this process")
    # This process is not SGLang's CPU engine: spec_tree took no CPU branch at import.
    monkeypatch.setattr(spec_tree, "_is_cpu", True)
    monkeypatch.setattr(spec_tree, "sgl_verify_tree_greedy_cpu", sgl_kernel.verify_tree_greedy_cpu, raising=False)


@pytest.mark.parametrize("extra", ["none", "additive", "scaling", "logit_bias", "grammar"])
def test_greedy_width_one_verify_commits_what_eagle_sample_commits(cpu_tree_walk, extra):
    """The fallback tier's greedy shortcut in the ``eagle_sample`` hook: the same
    tokens, lengths and indices as SGLang's tree walk, with every logit change
    eagle_sample makes, and without calling it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.eagle_utils import eagle_sample

    from lookahead.plugin import hooks as sglang_hooks
    from lookahead.plugin.verify import LookaheadVerifyInput

    bs, vocab = 6, 50
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(bs, vocab, generator=gen)
    # Without a change the argmax would be token 3 for every request: each
    # change below must move it for the shortcut to match.
    logits[:, 3] += 10.0
    info = SimpleNamespace(is_all_greedy=True, has_watermark_candidates=False, acc_additive_penalties=None,
                           acc_scaling_penalties=None, logit_bias=None, has_custom_logit_processor=False)
    grammar = None
    if extra == "additive":
        info.acc_additive_penalties = torch.zeros(bs, vocab)
        info.acc_additive_penalties[:, 3] = -20.0
    elif extra == "scaling":
        info.acc_scaling_penalties = torch.ones(bs, vocab)
        info.acc_scaling_penalties[:, 3] = 1e6
    elif extra == "logit_bias":
        info.logit_bias = torch.zeros(bs, vocab)
        info.logit_bias[:, 3] = -30.0
    elif extra == "grammar":
        grammar = _BanTokens([3])
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=torch.full((bs,), 9),
                            sampling_info=info, device="cpu", return_logprob=False,
                            req_pool_indices=torch.arange(bs))

    def verify_input():
        return LookaheadVerifyInput(
            draft_token=torch.randint(0, vocab, (bs,), generator=gen), custom_mask=torch.ones(bs, dtype=torch.bool),
            positions=torch.full((bs,), 9), retrieve_index=torch.arange(bs).view(bs, 1),
            retrieve_next_token=torch.full((bs, 1), -1), retrieve_next_sibling=torch.full((bs, 1), -1),
            draft_token_num=1)

    want = eagle_sample(verify_input(), batch, SimpleNamespace(next_token_logits=logits.clone()), grammar,
                        watermark_state=None)
    calls = []

    def tree_walk(*args, **kwargs):
        calls.append(1)
        return eagle_sample(*args, **kwargs)

    got = sglang_hooks._sample_tree(tree_walk, verify_input(), batch, SimpleNamespace(next_token_logits=logits.clone()),
                                    grammar, watermark_state=None)
    assert not calls
    assert extra == "none" or not (want[0] == 3).all()
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


class _BanArgmax:
    """A custom logit processor whose effect depends on the logits it is
    given: it bans each row's current best token, so applying it before the
    logit bias instead of after gives another answer."""

    def __call__(self, logits, custom_param_list):
        assert len(custom_param_list) == logits.shape[0]
        logits[torch.arange(logits.shape[0]), logits.argmax(dim=-1)] = float("-inf")
        return logits


class _SamplingInfo(SimpleNamespace):
    def __len__(self):
        return len(self.temperatures)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_width_one_verify_applies_a_custom_logit_processor_as_plain_decoding(cpu_tree_walk, sampled):
    """A batch with a custom logit processor is verified at width 1: the
    rows are processed in plain decoding's order (logit bias and grammar mask
    first, then the processor, on the processor's rows only), which SGLang's
    own eagle_sample skips, and the result is restored for the next step."""
    from sglang.srt.layers.sampler import apply_custom_logit_processor
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_batch_info import ProcessorEntry

    from lookahead.plugin import hooks as sglang_hooks
    from lookahead.plugin.verify import LookaheadVerifyInput

    bs, vocab = 4, 50
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(bs, vocab, generator=gen)
    logits[:, 3] += 10.0
    logit_bias = torch.zeros(bs, vocab)
    logit_bias[:, 3] = -30.0  # the bias moves every row's best token away from 3
    rows = [0, 2]  # requests 1 and 3 have no processor
    info = _SamplingInfo(
        is_all_greedy=not sampled, has_watermark_candidates=False, acc_additive_penalties=None,
        acc_scaling_penalties=None, logit_bias=logit_bias, has_custom_logit_processor=True,
        custom_logit_processor={1: ProcessorEntry(_BanArgmax(), rows, torch.tensor(rows))},
        custom_params=[{}, None, {}, None],
        temperatures=torch.full((bs, 1), 0.7), top_ks=torch.ones(bs, dtype=torch.int32),
        top_ps=torch.ones(bs), min_ps=torch.zeros(bs), need_min_p_sampling=False, need_top_k_sampling=True,
        need_top_p_sampling=False, max_top_k=1, sampling_seed=None)
    grammar = _BanTokens([5])
    batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, seq_lens=torch.full((bs,), 9),
                            sampling_info=info, device="cpu", return_logprob=False,
                            req_pool_indices=torch.arange(bs))
    verify_input = LookaheadVerifyInput(
        draft_token=torch.randint(0, vocab, (bs,), generator=gen), custom_mask=torch.ones(bs, dtype=torch.bool),
        positions=torch.full((bs,), 9), retrieve_index=torch.arange(bs).view(bs, 1),
        retrieve_next_token=torch.full((bs, 1), -1), retrieve_next_sibling=torch.full((bs, 1), -1),
        draft_token_num=1)

    # Plain decoding: ModelRunner applies the bias and the grammar mask, then
    # the sampler the processor; top-k 1 makes the sampled case its argmax too.
    plain = logits.clone() + logit_bias
    grammar.apply(plain)
    apply_custom_logit_processor(plain, info)
    want = plain.argmax(dim=-1)
    biased_best = (logits + logit_bias).argmax(dim=-1)
    assert (want[rows] != biased_best[rows]).all() and torch.equal(want[[1, 3]], biased_best[[1, 3]])

    predict, accept_lens, accept_index = sglang_hooks._sample_tree(
        lambda *a, **k: pytest.fail("eagle_sample would skip the processor"), verify_input, batch,
        SimpleNamespace(next_token_logits=logits.clone()), grammar, watermark_state=None)
    assert torch.equal(predict.long(), want)
    assert accept_lens.tolist() == [1] * bs and accept_index.view(-1).tolist() == list(range(bs))
    # What the hook blanked while it ran is back for the step's other readers.
    assert info.logit_bias is logit_bias and info.acc_additive_penalties is None


class _PagedKV:
    """The two methods of a KV pool that ``IntelAMXAttnBackend`` calls, over one layer."""

    def __init__(self, slots, heads_kv, dim, gen):
        self.k = torch.randn(slots, heads_kv, dim, generator=gen)
        self.v = torch.randn(slots, heads_kv, dim, generator=gen)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v

    def set_kv_buffer(self, layer, loc, k, v, **scales):
        self.k[loc.loc] = k.view(-1, *self.k.shape[1:])
        self.v[loc.loc] = v.view(-1, *self.v.shape[1:])


def test_width_one_verify_attention_runs_the_decode_kernel(cpu_tree_walk):
    """On CPU the fallback tier's forward (a width-1 TARGET_VERIFY) takes the
    decode kernel, with the root counted in its lengths, and gives the output
    and the K/V writes of SGLang's own verify path, which takes the extend
    kernel."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.intel_amx_backend import IntelAMXAttnBackend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.ngram_info import NgramVerifyInput

    from lookahead.plugin import hooks as sglang_hooks
    from lookahead.plugin.verify import LookaheadVerifyInput

    sglang_hooks.install()
    heads, heads_kv, dim, slots = 4, 2, 16, 96
    committed = torch.tensor([5, 17, 1, 9])
    bs = committed.numel()
    gen = torch.Generator().manual_seed(11)
    req_to_token = torch.randperm(slots, generator=gen).view(bs, slots // bs).to(torch.int32)
    root_slots = req_to_token[torch.arange(bs), committed].to(torch.int64)
    q = torch.randn(bs, heads * dim, generator=gen)
    k = torch.randn(bs, heads_kv * dim, generator=gen)
    v = torch.randn(bs, heads_kv * dim, generator=gen)
    layer = SimpleNamespace(qk_head_dim=dim, v_head_dim=dim, tp_q_head_num=heads, layer_id=0, is_cross_attention=False,
                            attn_type=AttentionType.DECODER, k_scale_float=None, v_scale_float=None, scaling=0.25,
                            logit_cap=0.0, sliding_window_size=-1)

    def run(spec_info):
        pool = _PagedKV(slots, heads_kv, dim, torch.Generator().manual_seed(3))
        runner = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
                                 token_to_kv_pool=pool, use_mla_backend=False,
                                 model_config=SimpleNamespace(context_len=slots, num_attention_heads=heads))
        backend = IntelAMXAttnBackend(runner)
        calls = []
        for name in ("decode_attention_fwd", "extend_attention_fwd"):
            op = getattr(backend, name)
            setattr(backend, name, lambda *a, _op=op, _name=name: (calls.append(_name), _op(*a))[1])
        batch = SimpleNamespace(batch_size=bs, seq_lens=committed, forward_mode=ForwardMode.TARGET_VERIFY,
                                spec_info=spec_info, out_cache_loc=root_slots, req_pool_indices=torch.arange(bs),
                                encoder_lens=None)
        backend.init_forward_metadata(batch)
        out = backend.forward_extend(q, k, v, layer, batch)
        assert backend.draft_decode_metadata is None
        return out, pool, calls

    width_one = dict(draft_token=torch.zeros(bs, dtype=torch.int64), custom_mask=torch.ones(bs, dtype=torch.bool),
                     positions=committed.clone(), retrieve_index=torch.arange(bs).view(bs, 1),
                     retrieve_next_token=torch.full((bs, 1), -1), retrieve_next_sibling=torch.full((bs, 1), -1),
                     draft_token_num=1)
    got, got_pool, got_calls = run(LookaheadVerifyInput(**width_one))
    want, want_pool, want_calls = run(NgramVerifyInput(**width_one))
    assert got_calls == ["decode_attention_fwd"] and want_calls == ["extend_attention_fwd"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(got_pool.k, want_pool.k) and torch.equal(got_pool.v, want_pool.v)
    assert torch.equal(got_pool.k[root_slots], k.view(bs, heads_kv, dim))
