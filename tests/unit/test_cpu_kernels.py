"""The pure-torch ``sgl_kernel`` shim against independent references.

Every op is checked against a straightforward re-derivation of what sglang
expects of it: attention against dense softmax attention with an explicit
mask, tree links against sglang's own host reference ``_derive_tree_links``
(read from the installed sglang source, without importing sglang), greedy
verification against a parent-based walk, and speculative sampling
statistically against the target distribution.

The shim is imported as ``sgl_kernel`` for the duration of this module (see
the ``shim`` fixture); the module is skipped where a real sgl_kernel is
already imported.
"""

from __future__ import annotations

import ast
import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cpu_env import cpu_sgl_kernel_path


@pytest.fixture(scope="module", autouse=True)
def shim(sgl_kernel_shim):
    return sgl_kernel_shim


ops = torch.ops.sgl_kernel


# ---------------------------------------------------------------- registration


def test_registered_ops_and_stubs(shim):
    for name in [
        "convert_weight_packed", "weight_packed_linear", "rmsnorm_cpu",
        "fused_add_rmsnorm_cpu", "silu_and_mul_cpu", "rotary_embedding_cpu",
        "decode_attention_cpu", "extend_attention_cpu", "store_cache_cpu",
        "initialize", "init_cpu_threads_env", "verify_tree_greedy_cpu",
        "reconstruct_indices_from_tree_mask", "tree_speculative_sampling_target_only",
        "murmur_hash32_cpu",
    ]:
        assert hasattr(ops, name), name
    for name in shim.stubs.OP_STUBS:
        with pytest.raises(NotImplementedError, match=name):
            getattr(ops, name)(torch.zeros(1))
    assert not set(shim.stubs.OP_STUBS) & set(shim.stubs.CAPABILITY_PROBES)
    for name in shim.stubs.CAPABILITY_PROBES:
        assert not hasattr(ops, name), f"{name} must stay absent (sglang probes it)"
    from sgl_kernel.mamba import causal_conv1d_fn_cpu

    with pytest.raises(NotImplementedError):
        causal_conv1d_fn_cpu()
    with pytest.raises(NotImplementedError):
        shim.rotate_input_ids_cpu()
    ops.initialize(1, 0)
    assert isinstance(ops.init_cpu_threads_env("0"), str)


# ---------------------------------------------------------------- dense layers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_and_fused_add(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 64).to(dtype)
    res = torch.randn(5, 64).to(dtype)
    w = torch.rand(64).to(dtype) + 0.5
    eps = 1e-6

    def ref(v):
        v = v.double()
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(ops.rmsnorm_cpu(x, w, eps).double(), ref(x), **tol)

    x2, res2 = x.clone(), res.clone()
    assert ops.fused_add_rmsnorm_cpu(x2, res2, w, eps) is None
    summed = x.double() + res.double()
    torch.testing.assert_close(res2.double(), summed, **tol)
    torch.testing.assert_close(x2.double(), ref(summed), **tol)


def test_gated_activations():
    x = torch.randn(3, 2, 16)
    a, b = x[..., :8], x[..., 8:]
    torch.testing.assert_close(ops.silu_and_mul_cpu(x), a * torch.sigmoid(a) * b)
    torch.testing.assert_close(ops.gelu_and_mul_cpu(x), F.gelu(a) * b)
    torch.testing.assert_close(ops.gelu_tanh_and_mul_cpu(x), F.gelu(a, approximate="tanh") * b)


def _cos_sin_cache(max_pos, rot_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2).double() / rot_dim)
    freqs = torch.outer(torch.arange(max_pos).double(), inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _rope_reference(x, pos, head_size, rot_dim, is_neox, base=10000.0):
    """Rotate each (pair of) dims by angle pos * base^(-2i/rot_dim), per token."""
    out = x.double().view(x.shape[0], -1, head_size).clone()
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2).double() / rot_dim)
    for t in range(x.shape[0]):
        for i, f in enumerate(inv_freq.tolist()):
            ang = pos[t].item() * f
            c, s = np.cos(ang), np.sin(ang)
            a, b = (i, i + rot_dim // 2) if is_neox else (2 * i, 2 * i + 1)
            xa, xb = out[t, :, a].clone(), out[t, :, b].clone()
            out[t, :, a] = xa * c - xb * s
            out[t, :, b] = xb * c + xa * s
    return out.view(x.shape)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [32, 16])
def test_rotary_embedding(is_neox, rot_dim):
    head, tokens = 32, 6
    pos = torch.tensor([0, 1, 5, 17, 100, 3])
    q = torch.randn(tokens, 4 * head)
    k = torch.randn(tokens, 2, head)
    cache = _cos_sin_cache(128, rot_dim)
    q_out, k_out = ops.rotary_embedding_cpu(pos, q, k, head, cache, is_neox)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    torch.testing.assert_close(q_out.double(), _rope_reference(q, pos, head, rot_dim, is_neox), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out.double(), _rope_reference(k, pos, head, rot_dim, is_neox), atol=1e-5, rtol=1e-5)


def test_weight_packed_linear():
    w = torch.randn(48, 32)
    packed = ops.convert_weight_packed(w)
    assert torch.equal(packed, w) and packed.data_ptr() != w.data_ptr()
    x, bias = torch.randn(7, 32), torch.randn(48)
    torch.testing.assert_close(ops.weight_packed_linear(x, packed, bias, True), x @ w.T + bias)
    torch.testing.assert_close(ops.weight_packed_linear(x, packed, None, True), x @ w.T)
    xb = x.bfloat16()
    out = ops.weight_packed_linear(xb, w.bfloat16(), bias, True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), x @ w.T + bias, atol=0.3, rtol=0.05)


# ---------------------------------------------------------------- attention


def _dense_attention(q, k, v, mask, scale, logit_cap=0.0, sinks=None):
    """Reference: per head, softmax(q k^T * scale, masked) v, GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    for h in range(q.shape[1]):
        s = q[:, h].double() @ k[:, h].T * scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        s = s.masked_fill(~mask, float("-inf"))
        if sinks is not None:  # the sink logit joins the denominator only
            e = torch.exp(s)
            p = e / (e.sum(-1, keepdim=True) + torch.exp(sinks[h].double()))
        else:
            p = torch.softmax(s, -1)
        out[:, h] = p @ v[:, h]
    return out


class _Paged:
    """A paged KV cache with scattered slots for ``bs`` requests."""

    def __init__(self, seq_lens, heads_kv=2, dim=16, slots=256, pool_len=64, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.k = torch.randn(slots, heads_kv, dim, generator=g)
        self.v = torch.randn(slots, heads_kv, dim, generator=g)
        self.req_to_token = torch.zeros(len(seq_lens) + 2, pool_len, dtype=torch.int32)
        self.pool_idx = torch.tensor([2, 0, 3][: len(seq_lens)], dtype=torch.int64)
        perm = torch.randperm(slots - 1, generator=g) + 1  # slot 0 is sglang's pad slot
        used = 0
        for r, n in zip(self.pool_idx.tolist(), seq_lens):
            self.req_to_token[r, :n] = perm[used : used + n].to(torch.int32)
            used += n

    def dense(self, b, n):
        rows = self.req_to_token[self.pool_idx[b], :n].long()
        return self.k[rows], self.v[rows]


@pytest.mark.parametrize("window,logit_cap,with_sinks", [(0, 0.0, False), (3, 0.0, False), (0, 5.0, True)])
def test_decode_attention(window, logit_cap, with_sinks):
    seq_lens = [5, 9, 1]
    heads, heads_kv, dim = 4, 2, 16
    cache = _Paged(seq_lens, heads_kv, dim)
    bs = len(seq_lens)
    q = torch.randn(bs, heads, dim)
    new_k, new_v = torch.randn(bs, heads_kv, dim), torch.randn(bs, heads_kv, dim)
    loc = torch.stack([cache.req_to_token[cache.pool_idx[b], n - 1].long() for b, n in enumerate(seq_lens)])
    sinks = torch.randn(heads) if with_sinks else None
    out = torch.empty(bs, heads, dim)
    k_buf, v_buf = cache.k.clone(), cache.v.clone()
    ops.decode_attention_cpu(
        q, k_buf, v_buf, 1.0, 1.0, out, new_k, new_v, loc, torch.empty(bs, heads, 8, dim + 1),
        cache.req_to_token, cache.pool_idx, torch.tensor(seq_lens), 0.25, logit_cap, False,
        window, None, sinks,
    )
    assert torch.equal(k_buf[loc], new_k) and torch.equal(v_buf[loc], new_v)
    cache.k, cache.v = k_buf, v_buf
    for b, n in enumerate(seq_lens):
        k, v = cache.dense(b, n)
        mask = torch.ones(1, n, dtype=torch.bool)
        if window > 0:
            mask &= (n - 1 - torch.arange(n)) < window
        ref = _dense_attention(q[b : b + 1], k, v, mask, 0.25, logit_cap, sinks)
        torch.testing.assert_close(out[b : b + 1].double(), ref, atol=1e-5, rtol=1e-5)


def _random_tree(n, rng):
    """Parents in topological order (parent < child), root 0."""
    return [-1] + [rng.randrange(0, i) for i in range(1, n)]


def _ancestor_mask(parents):
    n = len(parents)
    m = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j != -1:
            m[i, j] = True
            j = parents[j]
    return m


@pytest.mark.parametrize("mode", ["causal", "tree_qlen", "tree_full", "window"])
def test_extend_attention(mode):
    rng = random.Random(1)
    prefix = [3, 0, 6]
    ext = [4, 3, 4]
    seq_lens = [p + e for p, e in zip(prefix, ext)]
    heads, heads_kv, dim = 4, 2, 16
    cache = _Paged(seq_lens, heads_kv, dim, seed=1)
    starts = np.cumsum([0] + ext[:-1]).tolist()
    total = sum(ext)
    q = torch.randn(total, heads, dim)
    k_ext = torch.cat([cache.dense(b, s)[0][p:] for b, (p, s) in enumerate(zip(prefix, seq_lens))])
    v_ext = torch.cat([cache.dense(b, s)[1][p:] for b, (p, s) in enumerate(zip(prefix, seq_lens))])

    trees = [_ancestor_mask(_random_tree(e, rng)) for e in ext]
    tree_mask, window = None, 0
    if mode == "tree_qlen":
        tree_mask = torch.from_numpy(np.concatenate([t.reshape(-1) for t in trees]))
    elif mode == "tree_full":
        rows = [np.concatenate([np.ones((e, p), bool), t], 1).reshape(-1) for p, e, t in zip(prefix, ext, trees)]
        tree_mask = torch.from_numpy(np.concatenate(rows))
    elif mode == "window":
        window = 3

    out = torch.empty(total, heads, dim)
    ops.extend_attention_cpu(
        q, k_ext, v_ext, out, cache.k, cache.v, 1.0, 1.0, cache.req_to_token, cache.pool_idx,
        torch.tensor(seq_lens), torch.tensor(ext, dtype=torch.int32),
        torch.tensor(starts, dtype=torch.int32), max(ext), 0.3, 0.0, False, window, None,
        None, tree_mask, True,
    )
    for b, (p, e, s) in enumerate(zip(prefix, ext, seq_lens)):
        k, v = cache.dense(b, s)
        qpos = torch.arange(p, s)[:, None]
        kpos = torch.arange(s)[None, :]
        mask = kpos <= qpos
        if mode.startswith("tree"):
            mask[:, p:] = torch.from_numpy(trees[b])
        if window:
            mask &= (qpos - kpos) < window
        ref = _dense_attention(q[starts[b] : starts[b] + e], k, v, mask, 0.3)
        torch.testing.assert_close(out[starts[b] : starts[b] + e].double(), ref, atol=1e-5, rtol=1e-5)


def test_extend_equals_decode_steps():
    """Prefill then decode must match one extend over the same tokens (causal)."""
    heads, heads_kv, dim, n = 4, 2, 8, 6
    cache = _Paged([n], heads_kv, dim, seed=3)
    q = torch.randn(n, heads, dim)
    k, v = cache.dense(0, n)
    out_ext = torch.empty(n, heads, dim)
    ops.extend_attention_cpu(
        q, k, v, out_ext, cache.k, cache.v, 1.0, 1.0, cache.req_to_token, cache.pool_idx,
        torch.tensor([n]), torch.tensor([n]), torch.tensor([0]), n, 0.5, 0.0, False, 0, None, None, None, True,
    )
    for t in range(n):
        out = torch.empty(1, heads, dim)
        ops.decode_attention_cpu(
            q[t : t + 1], cache.k, cache.v, 1.0, 1.0, out, None, None, torch.tensor([0]),
            torch.empty(1), cache.req_to_token, cache.pool_idx, torch.tensor([t + 1]), 0.5, 0.0,
            False, 0, None, None,
        )
        torch.testing.assert_close(out, out_ext[t : t + 1], atol=1e-6, rtol=1e-6)


def test_width_one_verify_equals_decode():
    """A width-1 TARGET_VERIFY (one query per request, NGRAM's one-node tree
    mask) attends exactly as the decode op does at the same lengths."""
    seq_lens = [5, 9, 1]
    heads, heads_kv, dim = 4, 2, 16
    cache = _Paged(seq_lens, heads_kv, dim, seed=4)
    bs = len(seq_lens)
    q = torch.randn(bs, heads, dim)
    out_verify, out_decode = torch.empty(bs, heads, dim), torch.empty(bs, heads, dim)
    ops.extend_attention_cpu(
        q, None, None, out_verify, cache.k, cache.v, 1.0, 1.0, cache.req_to_token, cache.pool_idx,
        torch.tensor(seq_lens), torch.ones(bs, dtype=torch.int64), torch.arange(bs), 1, 0.25, 0.0,
        False, 0, None, None, torch.ones(bs, dtype=torch.bool), True,
    )
    ops.decode_attention_cpu(
        q, cache.k, cache.v, 1.0, 1.0, out_decode, None, None, torch.tensor([0]), torch.empty(1),
        cache.req_to_token, cache.pool_idx, torch.tensor(seq_lens), 0.25, 0.0, False, 0, None, None,
    )
    torch.testing.assert_close(out_verify, out_decode, atol=0, rtol=0)
    for b, n in enumerate(seq_lens):
        k, v = cache.dense(b, n)
        ref = _dense_attention(q[b : b + 1], k, v, torch.ones(1, n, dtype=torch.bool), 0.25)
        torch.testing.assert_close(out_verify[b : b + 1].double(), ref, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- KV bookkeeping


def test_store_cache_and_copy_all_layers(shim):
    k_cache, v_cache = torch.zeros(10, 2, 4), torch.zeros(10, 2, 4)
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    idx = torch.tensor([7, 1, 4])
    ops.store_cache_cpu(k, v, k_cache, v_cache, idx, 8)
    assert torch.equal(k_cache[idx], k) and torch.equal(v_cache[idx], v)

    layers = [torch.randn(12, 2, 4) for _ in range(3)] + [torch.randn(12, 3).bfloat16()]
    before = [t.clone() for t in layers]
    ptrs = torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64)
    strides = torch.tensor([t[0].numel() * t.element_size() for t in layers])
    tgt, src = torch.tensor([2, 3, 9]), torch.tensor([3, 5, 2])  # 3 is both read and written
    shim.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for t, old in zip(layers, before):
        expect = old.clone()
        expect[tgt] = old[src]
        assert torch.equal(t, expect)


def test_assign_slot_tables(shim):
    req_to_token = torch.arange(40, dtype=torch.int32).view(4, 10) + 100
    pool = torch.tensor([2, 0, 3])
    start, end = torch.tensor([1, 4, 0]), torch.tensor([4, 4, 2])
    out = torch.full((5,), -1, dtype=torch.int64)
    shim.assign_extend_cache_locs_cpu(pool, req_to_token, start, end, out, 10)
    assert out.tolist() == [121, 122, 123, 130, 131]

    table = req_to_token.clone()
    shim.assign_req_to_token_pool_cpu(
        pool, table, start.int(), end.int(), torch.tensor([1, 2, 3, 4, 5]), 10
    )
    assert table[2, 1:4].tolist() == [1, 2, 3] and table[3, :2].tolist() == [4, 5]
    assert torch.equal(table[0], req_to_token[0]) and torch.equal(table[1], req_to_token[1])

    out = torch.empty(3 * 4, dtype=torch.int64)
    shim.assign_draft_cache_locs_contiguous_cpu(pool, req_to_token, torch.tensor([1, 2, 5]), out, 10, 2, 2)
    assert out.view(3, 4).tolist() == [[121, 122, 123, 124], [102, 103, 104, 105], [135, 136, 137, 138]]

    meta = shim.build_draft_decode_metadata_cpu(req_to_token, pool, torch.tensor([2, 3, 1]), 2, 2, 10)
    assert meta.shape == (6, 10)
    assert meta[1, :4].tolist() == [120, 121, 124, 125]  # request 0, candidate 1


# ---------------------------------------------------------------- trees


def _load_derive_tree_links():
    """``_derive_tree_links`` from the installed sglang, without importing sglang."""
    spec = importlib.util.find_spec("sglang")  # a dependency of the package: always installed
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    path = Path(spec.submodule_search_locations[0]) / "srt" / "speculative" / "ngram_worker.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_derive_tree_links")
    namespace = {"np": np, "torch": torch}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace["_derive_tree_links"]


def _links_from_parents(parents):
    n = len(parents)
    nxt, sib = [-1] * n, [-1] * n
    for i in range(n):
        kids = [c for c in range(n) if parents[c] == i]
        nxt[i] = kids[0] if kids else -1
    for i in range(n):
        if parents[i] >= 0:
            later = [c for c in range(i + 1, n) if parents[c] == parents[i]]
            sib[i] = later[0] if later else -1
    return nxt, sib


@pytest.mark.parametrize("seed", range(5))
def test_reconstruct_indices_from_tree_mask(shim, seed):
    rng = random.Random(seed)
    bs, n = 3, rng.choice([1, 4, 8])
    parents = [_random_tree(n, rng) for _ in range(bs)]
    mask = np.stack([_ancestor_mask(p) for p in parents])
    seq = torch.tensor([5, 0, 17])
    pos = torch.empty(bs * n, dtype=torch.int64)
    ri, nt, ns = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    shim.reconstruct_indices_from_tree_mask(torch.from_numpy(mask.reshape(-1)), seq, pos, ri, nt, ns, bs, n)

    derive = _load_derive_tree_links()
    ref_nt, ref_ns = derive(mask.reshape(-1), bs, n)
    assert torch.equal(nt, ref_nt) and torch.equal(ns, ref_ns)
    for b, p in enumerate(parents):
        assert (nt[b].tolist(), ns[b].tolist()) == _links_from_parents(p)
    depth = torch.from_numpy(mask.sum(-1) - 1)
    assert torch.equal(pos.view(bs, n), depth + seq[:, None])
    assert torch.equal(ri, torch.arange(bs * n).view(bs, n))


def _verify_greedy_reference(parents, cand, target, steps):
    """Follow the child whose token equals the target argmax at the current node."""
    node, path = 0, [0]
    while len(path) < steps:
        kids = [c for c in range(len(parents)) if parents[c] == node and cand[c] == target[node]]
        if not kids:
            break
        node = kids[0]
        path.append(node)
    return path


@pytest.mark.parametrize("seed", range(8))
def test_verify_tree_greedy(shim, seed):
    rng = random.Random(seed)
    bs, n, steps = 4, 8, rng.choice([2, 4, 8])
    parents = [_random_tree(n, rng) for _ in range(bs)]
    cand = torch.tensor([[rng.randrange(3) for _ in range(n)] for _ in range(bs)])
    target = torch.tensor([[rng.randrange(3) for _ in range(n)] for _ in range(bs)])
    links = [_links_from_parents(p) for p in parents]
    ri = torch.arange(bs * n).view(bs, n)
    nt = torch.tensor([lk[0] for lk in links])
    ns = torch.tensor([lk[1] for lk in links])
    predicts = torch.full((bs * n,), -7, dtype=torch.int32)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    shim.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=cand, retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
        target_predict=target,
    )
    for b in range(bs):
        path = _verify_greedy_reference(parents[b], cand[b].tolist(), target[b].tolist(), steps)
        glob = [b * n + i for i in path]
        assert accept_index[b].tolist() == glob + [-1] * (steps - len(path))
        assert accept_num[b].item() == len(path) - 1
        for i in range(n):
            expect = target[b, i].item() if i in path else -7
            assert predicts[b * n + i].item() == expect


def test_verify_tree_greedy_roots_only(shim):
    """Width-1 trees (the fallback tier): every request accepts its root alone,
    and the target's token there is the step's token."""
    bs = 5
    target = torch.tensor([[3], [1], [4], [1], [5]])
    predicts = torch.full((bs,), -7, dtype=torch.int32)
    accept_index = torch.full((bs, 3), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), 9, dtype=torch.int32)
    shim.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=torch.tensor([[7]] * bs), retrive_index=torch.arange(bs).view(bs, 1),
        retrive_next_token=torch.full((bs, 1), -1), retrive_next_sibling=torch.full((bs, 1), -1),
        target_predict=target,
    )
    assert predicts.tolist() == [3, 1, 4, 1, 5]
    assert accept_index.tolist() == [[b, -1, -1] for b in range(bs)]
    assert accept_num.tolist() == [0] * bs


def _eagle_draft_tree(bs, topk, steps, n, gen):
    """EAGLE's candidate bookkeeping (``select_top_k_tokens`` and
    ``organize_draft_results`` in sglang) on random draft probabilities:
    ``(parent_list, top_scores_index, parent candidate of every candidate)``."""
    p = torch.rand(bs, topk, generator=gen)
    scores, score_list, parents_list = p, [p.unsqueeze(1)], [torch.arange(-1, topk).expand(bs, -1)]
    owner = {c: -1 for c in range(topk)}  # candidate -> its parent candidate (-1: the root)
    for i in range(1, steps):
        expand = scores.unsqueeze(2) * torch.rand(bs, topk, topk, generator=gen)
        scores, cs = torch.topk(expand.flatten(1), topk, dim=-1)
        score_list.append(expand)
        parents_list.append(cs + topk * topk * (i - 1) + topk)
    flat = torch.cat(score_list, dim=1).flatten(1)
    top = torch.sort(torch.topk(flat, n - 1, dim=-1).indices).values
    parent_list = torch.cat(parents_list[:-1], dim=1) if steps > 1 else torch.empty(bs, 0, dtype=torch.long)
    return parent_list.contiguous(), top, owner


def _triton_build_tree():
    """SGLang's Triton ``sgl_build_tree_kernel_triton`` from the installed
    source, compiled for the Triton interpreter (CPU), or None without triton."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    import enum
    import os

    spec = importlib.util.find_spec("sglang")
    src = Path(spec.submodule_search_locations[0]) / "kernels" / "ops" / "speculative" / "spec_tree.py"
    tree = ast.parse(src.read_text())
    wanted = {"TreeMaskMode", "sgl_build_tree_kernel_efficient_triton", "sgl_build_tree_kernel_triton"}
    body = [node for node in tree.body if getattr(node, "name", None) in wanted]
    assert len(body) == 3, "sglang's Triton tree kernel moved"
    import triton
    import triton.language as tl

    namespace = {"torch": torch, "triton": triton, "tl": tl, "IntEnum": enum.IntEnum}
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        exec(compile(ast.Module(body=body, type_ignores=[]), str(src), "exec"), namespace)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    return namespace["sgl_build_tree_kernel_triton"]


@pytest.mark.parametrize("mode", [0, 1])  # TreeMaskMode.FULL_MASK, QLEN_ONLY
@pytest.mark.parametrize("topk,steps,n", [(1, 3, 4), (1, 1, 2), (2, 3, 5), (4, 3, 8), (4, 5, 16), (8, 2, 8)])
def test_build_tree_kernel_matches_sglang_triton_kernel(shim, mode, topk, steps, n):
    """EAGLE's tree building against SGLang's own Triton kernel, run on CPU
    by the Triton interpreter, on EAGLE-shaped candidate trees."""
    reference = _triton_build_tree()
    if reference is None:
        pytest.skip("triton is not importable")
    gen = torch.Generator().manual_seed(100 * topk + 10 * steps + n + mode)
    bs = 3
    seq = torch.tensor([5, 1, 9])
    parent_list, top, _ = _eagle_draft_tree(bs, topk, steps, n, gen)
    outs = []
    for fn in (reference, shim.build_tree_kernel_efficient_cpu):
        size = int(seq.sum()) * n + n * n * bs if mode == 0 else n * n * bs
        mask = torch.full((size,), True)
        links = torch.full((3, bs, n), -1, dtype=torch.long)
        pos = torch.empty(bs * n, dtype=torch.long)
        fn(parent_list, top, seq, mask, pos, links[0], links[1], links[2], topk, steps, n, mode)
        outs.append((mask, pos, links))
    (m_ref, p_ref, l_ref), (m_cpu, p_cpu, l_cpu) = outs
    assert torch.equal(l_cpu, l_ref)
    assert torch.equal(p_cpu, p_ref)
    assert torch.equal(m_cpu, m_ref)
    # And what the layout means: the QLEN_ONLY rows are each node's ancestor set.
    if mode == 1:
        anc = m_cpu.view(bs, n, n)
        depth = anc.sum(-1) - 1
        assert torch.equal(p_cpu.view(bs, n), depth + seq[:, None])
        for b in range(bs):
            for i in range(1, n):
                kids = [k for k in range(1, n) if anc[b, k].sum() == anc[b, i].sum() + 1 and anc[b, k, i]]
                assert (l_cpu[1, b, i].item() == -1) == (not kids)
                if kids:
                    assert l_cpu[1, b, i].item() == min(kids)


def test_build_tree_kernel_rejects_bitpacking(shim):
    with pytest.raises(NotImplementedError):
        shim.build_tree_kernel_efficient_cpu(
            torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.tensor([3]),
            torch.zeros(2, dtype=torch.uint8), torch.empty(2, dtype=torch.long),
            *torch.full((3, 1, 2), -1, dtype=torch.long), 1, 1, 2, 2)


def test_fill_bonus_and_accept_out_cache_loc(shim):
    accept_tokens = torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int32)
    bonus = torch.empty(2, dtype=torch.int32)
    shim.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([2, 3], dtype=torch.int32), bonus, 3)
    assert bonus.tolist() == [6, 10]

    accept_index = torch.tensor([[0, 2, -1], [4, -1, -1]], dtype=torch.int32)
    out_cache_loc = torch.tensor([50, 51, 52, 53, 54, 55])
    dst = torch.full((6,), -1, dtype=torch.int64)
    shim.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    assert dst.tolist()[:3] == [50, 52, 54] and dst.tolist()[3:] == [-1, -1, -1]


# ---------------------------------------------------------------- sampling


def test_tree_speculative_sampling_preserves_distribution(shim):
    """The emitted tokens must follow the target model, whatever the drafts.

    Tree (n=4): root 0 with children 1 (token 0) and 2 (token 1); node 3
    (token 2) is a child of 1. Each request in the batch is one independent
    trial; check P(first token) = target at root and P(second | first = 0) =
    target at node 1.
    """
    n, vocab, trials = 4, 5, 20000
    target_rows = torch.tensor([
        [0.30, 0.25, 0.20, 0.15, 0.10],  # at root
        [0.05, 0.10, 0.60, 0.05, 0.20],  # after token 0 (node 1)
        [0.20, 0.20, 0.20, 0.20, 0.20],  # after token 1 (node 2)
        [0.50, 0.10, 0.10, 0.10, 0.20],  # after tokens 0, 2 (node 3)
    ])
    cand = torch.tensor([9, 0, 1, 2]).repeat(trials, 1)  # node 0's token is unused
    ri = torch.arange(trials * n).view(trials, n)
    nt = torch.tensor([1, 3, -1, -1]).repeat(trials, 1)
    ns = torch.tensor([-1, 2, -1, -1]).repeat(trials, 1)
    g = torch.Generator().manual_seed(0)
    coins = torch.rand(trials, n, generator=g)
    final_coins = torch.rand(trials, generator=g)
    target = target_rows.repeat(trials, 1, 1)
    draft = torch.zeros_like(target)
    predicts = torch.full((trials * n,), -1, dtype=torch.int32)
    accept_index = torch.full((trials, 3), -1, dtype=torch.int32)
    accept_num = torch.empty(trials, dtype=torch.int32)
    shim.tree_speculative_sampling_target_only(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=cand, retrive_index=ri, retrive_next_token=nt, retrive_next_sibling=ns,
        uniform_samples=coins, uniform_samples_for_final_sampling=final_coins,
        target_probs=target, draft_probs=draft,
    )
    emitted = []
    for t in range(trials):
        k = accept_num[t].item()
        idx = accept_index[t, : k + 1].tolist()
        emitted.append([predicts[i].item() for i in idx])
    first = torch.tensor([e[0] for e in emitted])
    freq = torch.bincount(first, minlength=vocab).double() / trials
    assert (freq - target_rows[0].double()).abs().max() < 0.015, freq

    second = torch.tensor([e[1] for e in emitted if e[0] == 0])
    freq2 = torch.bincount(second, minlength=vocab).double() / len(second)
    assert (freq2 - target_rows[1].double()).abs().max() < 0.035, freq2

    # Accepted drafts are exactly the emitted tokens that matched a child.
    assert all(len(e) == accept_num[t].item() + 1 for t, e in enumerate(emitted))
    assert accept_num.max().item() == 2


def test_tree_speculative_sampling_edge_cases(shim):
    """Zero-probability drafts are never accepted; a one-hot target is followed."""
    n = 3
    target = torch.tensor([[[0.0, 0.0, 1.0, 0.0], [0.25] * 4, [0.0, 1.0, 0.0, 0.0]]])
    cand = torch.tensor([[0, 3, 2]])  # node 1 has token 3 (p=0), node 2 token 2 (p=1)
    predicts = torch.full((n,), -1, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.empty(1, dtype=torch.int32)
    shim.tree_speculative_sampling_target_only(
        predicts, accept_index, accept_num, cand, torch.arange(n).view(1, n),
        torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]]),
        torch.full((1, n), 0.999), torch.tensor([0.5]), target.clone(), torch.zeros_like(target),
    )
    assert accept_index.tolist() == [[0, 2, -1]] and accept_num.item() == 1
    assert predicts[0].item() == 2 and predicts[2].item() == 1


def test_renorm_probs(shim):
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    topk = shim.top_k_renorm_prob(probs, torch.tensor([2, 4]))
    torch.testing.assert_close(topk, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [0.25] * 4]))
    topp = shim.top_p_renorm_prob(probs, torch.tensor([0.6, 0.3]))
    # Ties at the cut are kept together (a pivot threshold cannot split them).
    torch.testing.assert_close(topp, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [0.25] * 4]))
    assert torch.equal(shim.top_p_renorm_prob(probs, 1.0), probs / probs.sum(-1, keepdim=True))
    torch.testing.assert_close(shim.top_p_renorm_prob(probs, 0.4)[0], torch.tensor([0.0, 1.0, 0.0, 0.0]))


def _murmur_reference(seed, pos, col):
    m = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m

    def mix(h, k):
        k = rotl((k * 0xCC9E2D51) & m, 15) * 0x1B873593 & m
        return (rotl(h ^ k, 13) * 5 + 0xE6546B64) & m

    h = 0
    for k in (seed & m, (seed >> 32) & m, pos & m, col & m):
        h = mix(h, k)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & m
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & m
    return h ^ (h >> 16)


def test_murmur_hash32():
    seeds = [0, 1, 2**40 + 3, 2**64 - 1]
    pos = [0, 7, 123456, 2**31]
    cols = [0, 1, 2, 1000]
    got = ops.murmur_hash32_cpu.default(
        torch.tensor(seeds, dtype=torch.uint64), torch.tensor(pos), torch.tensor(cols)
    )
    assert got.dtype == torch.uint32
    expect = [[_murmur_reference(s, p, c) for c in cols] for s, p in zip(seeds, pos)]
    assert got.to(torch.int64).tolist() == expect


def test_sampling_helper_is_the_op(shim):
    assert shim.sampling.tree_speculative_sampling_target_only is shim.tree_speculative_sampling_target_only
