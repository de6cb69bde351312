"""GPU check of the verify graph runner (run by scripts/gpu_check.sh on a CUDA machine).

The GPU machine has torch and transformers but no sglang, so the runner is
driven here with a small random Llama from transformers: the verify forward
is the model over each request's prefix plus its draft tree, with a 4-D
mask (causal over the prefix, the tree's ancestor mask over the drafts).

Prints:
1. graph replay vs eager, bit for bit, at batch sizes 1..4 x widths 2, 4, 8;
2. greedy decoding with LOOKAHEAD (trie drafts, verified through the runner)
   token-identical to plain greedy decoding;
3. the time of one step: plain decode, LOOKAHEAD verify replayed from a graph
   and LOOKAHEAD verify eager, at batch sizes 1, 2, 4, 8 on copy-heavy prompts.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lookahead import LookaheadCache  # noqa: E402
from lookahead.graph_runner import GraphPlan, VerifyGraphRunner  # noqa: E402
from lookahead.verify_tree import pack_drafts  # noqa: E402

DEV = "cuda"
PREFIX = 192  # tokens of context per request (static, so the graph sees fixed shapes)


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).to(DEV, torch.bfloat16).eval()


class VerifyForward:
    """forward(buffers, bs, width) -> logits [bs*width, V] over prefix + tree."""

    def __init__(self, model, max_bs):
        self.model = model
        self.prefix = torch.zeros((max_bs, PREFIX), dtype=torch.int64, device=DEV)

    @torch.no_grad()
    def __call__(self, buffers, bs, width):
        ids = torch.cat([self.prefix[:bs], buffers["input_ids"].view(bs, width)], dim=1)
        pos = torch.cat([torch.arange(PREFIX, device=DEV).expand(bs, PREFIX),
                         PREFIX + buffers["positions"].view(bs, width)], dim=1)
        n = PREFIX + width
        allowed = torch.zeros((bs, n, n), dtype=torch.bool, device=DEV)
        allowed[:, :, :PREFIX] = torch.tril(torch.ones(n, PREFIX, dtype=torch.bool, device=DEV))
        allowed[:, PREFIX:, PREFIX:] = buffers["tree_mask"].view(bs, width, width)
        mask = torch.zeros((bs, 1, n, n), dtype=torch.bfloat16, device=DEV)
        mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(torch.bfloat16).min)
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
        return out.logits[:, PREFIX:].reshape(bs * width, -1).float()


def tree_inputs(drafts, roots, width, bs):
    trees = pack_drafts(drafts, roots, width)
    mask = torch.from_numpy(trees.mask).view(bs, width, width)
    depth = mask.sum(-1) - 1  # position of each node = its depth below the root
    return {"input_ids": torch.from_numpy(trees.tokens).to(DEV), "positions": depth.flatten().to(DEV),
            "out_cache_loc": torch.zeros(bs * width, dtype=torch.int64, device=DEV),
            "seq_lens": torch.full((bs,), PREFIX, dtype=torch.int64, device=DEV),
            "req_pool_indices": torch.arange(bs, device=DEV),
            "tree_mask": torch.from_numpy(trees.mask).to(DEV)}, trees


class _D:
    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents


def check_bit_identical(model):
    print("== 1. graph replay vs eager (bit for bit)")
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8,
                                widths=(2, 4, 8))
    fwd = VerifyForward(model, 4)
    fwd.prefix.copy_(torch.randint(0, 4096, fwd.prefix.shape, device=DEV))
    runner = VerifyGraphRunner(plan, fwd)
    t0 = time.time()
    runner.capture()
    print(f"captured {len(runner.graphs)} graphs in {time.time() - t0:.1f} s")
    ok = True
    for bs in (1, 2, 3, 4):
        for width in (2, 4, 8):
            drafts = [_D(list(range(10 + b, 10 + b + width - 1)), list(range(-1, width - 2))) for b in range(bs)]
            inputs, _ = tree_inputs(drafts, [7] * bs, width, bs)
            got = runner.replay(inputs, bs, width)
            want = fwd(dict(inputs), bs, width)
            same = torch.equal(got, want)
            ok &= same
            print(f"  bs={bs} width={width}: {'identical' if same else 'DIFFERENT (max abs %.3g)' % (got - want).abs().max()}")
    print("RESULT graph replay bit-identical:", ok)
    return runner, fwd


def greedy_check(model, runner, fwd, steps=48):
    print("== 2. greedy LOOKAHEAD vs plain decoding")
    bs, width = 2, 8
    torch.manual_seed(1)
    prompt = torch.randint(0, 4096, (bs, PREFIX - steps - 1), device=DEV)
    prompt[:, 40:80] = prompt[:, :40]  # copy-heavy: a repeated block
    # Plain greedy.
    plain = prompt.clone()
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(input_ids=plain, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            plain = torch.cat([plain, nxt], 1)
    # LOOKAHEAD: trie drafts, verified by the graph runner over a fixed-size window.
    cache = LookaheadCache()
    seqs = [prompt[b].tolist() for b in range(bs)]
    for b in range(bs):
        cache.put_prompt(b, seqs[b])
    cache.synchronize()
    verify_steps = 0
    while min(len(s) for s in seqs) < prompt.shape[1] + steps:
        drafts = cache.batch_draft(list(range(bs)), seqs, width - 1)
        roots = [s[-1] for s in seqs]
        # The static prefix holds the PREFIX tokens before the root.
        for b in range(bs):
            ctx = seqs[b][:-1][-PREFIX:]
            fwd.prefix[b, :].fill_(0)
            fwd.prefix[b, PREFIX - len(ctx):] = torch.tensor(ctx, device=DEV)
        inputs, trees = tree_inputs(drafts, roots, width, bs)
        logits = runner.replay(inputs, bs, width).view(bs, width, -1)
        # NOTE: the left-padded prefix differs from plain decoding's context only
        # when a context is shorter than PREFIX; the prompt is sized so it never is.
        target = logits.argmax(-1).tolist()
        mask = trees.mask.reshape(bs, width, width)
        for b in range(bs):
            parent = [-1] + [int(mask[b, i, :i].nonzero()[0][-1]) for i in range(1, width)]
            tokens = trees.tokens[b * width:(b + 1) * width].tolist()
            node, accepted = 0, []
            while True:  # walk down while the target agrees with a drafted child
                tok = target[b][node]
                accepted.append(tok)
                child = next((i for i in range(1, width) if parent[i] == node and tokens[i] == tok), None)
                if child is None:
                    break
                node = child
            limit = prompt.shape[1] + steps - len(seqs[b])
            accepted = accepted[:limit]
            seqs[b] += accepted
            cache.put_output(b, accepted)
        verify_steps += 1
    same = all(seqs[b] == plain[b].tolist() for b in range(bs))
    print(f"RESULT greedy identical: {same}; {bs * steps} tokens in {verify_steps} verify steps "
          f"(accept length {bs * steps / (bs * verify_steps):.2f})")


def timing(model):
    print("== 3. per-step time (ms): plain decode | verify graph | verify eager, width 8")
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=8, num_draft_tokens=8)
    fwd = VerifyForward(model, 8)
    runner = VerifyGraphRunner(plan, fwd)
    runner.capture()

    def timed(fn, n=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return 1e3 * (time.perf_counter() - t0) / n

    for bs in (1, 2, 4, 8):
        drafts = [_D(list(range(20, 27)), list(range(-1, 6))) for _ in range(bs)]
        inputs, _ = tree_inputs(drafts, [5] * bs, 8, bs)
        one = {k: (v.view(bs, 8)[:, :1].flatten() if k in ("input_ids", "positions", "out_cache_loc") else
                   torch.ones(bs, dtype=torch.bool, device=DEV) if k == "tree_mask" else v) for k, v in inputs.items()}
        plain_ms = timed(lambda: fwd(one, bs, 1))
        graph_ms = timed(lambda: runner.replay(inputs, bs, 8))
        eager_ms = timed(lambda: fwd(inputs, bs, 8))
        print(f"  bs={bs}: {plain_ms:.2f} | {graph_ms:.2f} | {eager_ms:.2f}")


def main():
    assert torch.cuda.is_available(), "no CUDA device"
    print(torch.__version__, torch.cuda.get_device_name())
    model = build_model()
    runner, fwd = check_bit_identical(model)
    greedy_check(model, runner, fwd)
    timing(model)


if __name__ == "__main__":
    main()
