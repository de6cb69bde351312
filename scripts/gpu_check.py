"""GPU check of the verify graph runner (run by scripts/gpu_check.sh on a CUDA machine).

The GPU machine has torch and transformers but no sglang, so the runner is
driven with a small random Llama from transformers.  The verify forward is
the model over each request's context (a static, right-padded buffer with a
per-request length) followed by its draft tree, under a 4-D mask: causal over
the context, ancestors-or-self over the tree.  Plain decoding is the same
function with a tree of width 1, so both see exactly the same context.

Prints:
1. graph replay vs eager, bit for bit, at batch sizes 1..4 x widths 2, 4, 8;
2. greedy decoding with LOOKAHEAD (trie drafts, verified through graph
   replay) token-identical to plain greedy decoding;
3. the time of one step (ms): plain decode (width 1, eager), LOOKAHEAD verify
   replayed from a graph and LOOKAHEAD verify eager, at batch sizes 1, 2, 4, 8.
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

DEV = "cuda" if "--cpu-dry-run" not in sys.argv else "cpu"
CTX = 256  # static context buffer per request
VOCAB = 4096


def build_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    cfg._attn_implementation = "eager"
    return LlamaForCausalLM(cfg).to(DEV, torch.float32).eval()


class VerifyForward:
    """forward(buffers, bs, width) -> logits [bs*width, V] of the tree rows."""

    def __init__(self, model, max_bs):
        self.model = model
        self.context = torch.zeros((max_bs, CTX), dtype=torch.int64, device=DEV)
        self.ar = torch.arange(CTX, device=DEV)

    @torch.no_grad()
    def __call__(self, buffers, bs, width):
        lens = buffers["seq_lens"][:bs].view(bs, 1)  # real context length per request
        ids = torch.cat([self.context[:bs], buffers["input_ids"].view(bs, width)], dim=1)
        pos = torch.cat([self.ar.expand(bs, CTX), lens + buffers["positions"].view(bs, width)], dim=1)
        n = CTX + width
        real = self.ar.view(1, CTX) < lens  # [bs, CTX]
        allowed = torch.zeros((bs, n, n), dtype=torch.bool, device=DEV)
        causal = torch.tril(torch.ones(CTX, CTX, dtype=torch.bool, device=DEV))
        allowed[:, :CTX, :CTX] = causal & real.unsqueeze(1)
        allowed[:, :CTX, :CTX] |= torch.eye(CTX, dtype=torch.bool, device=DEV)  # padding rows see themselves
        allowed[:, CTX:, :CTX] = real.unsqueeze(1)
        allowed[:, CTX:, CTX:] = buffers["tree_mask"].view(bs, width, width)
        mask = torch.zeros((bs, 1, n, n), dtype=torch.float32, device=DEV)
        mask.masked_fill_(~allowed.unsqueeze(1), torch.finfo(torch.float32).min)
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False)
        return out.logits[:, CTX:].reshape(bs * width, -1)

    def load_context(self, b, tokens):
        self.context[b].zero_()
        self.context[b, : len(tokens)] = torch.tensor(tokens, device=DEV)


class _Replayer:
    """For --cpu-dry-run only: stands in for a CUDA graph by re-running the call."""

    def __init__(self, pool):
        self.fn = None

    def capture(self, fn):
        self.fn = fn
        self.out = fn()
        return self.out

    def replay(self):
        self.out.copy_(self.fn())


def make_runner(plan, fwd):
    if DEV == "cuda":
        return VerifyGraphRunner(plan, fwd)
    return VerifyGraphRunner(plan, fwd, device="cpu", graph_factory=_Replayer, warmup_runs=0)


class _D:
    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents


def tree_inputs(drafts, roots, width, lens):
    bs = len(drafts)
    trees = pack_drafts(drafts, roots, width)
    mask = torch.from_numpy(trees.mask).view(bs, width, width)
    depth = mask.sum(-1) - 1  # a node's position is its depth below the root
    inputs = {"input_ids": torch.from_numpy(trees.tokens).to(DEV), "positions": depth.flatten().to(DEV),
              "out_cache_loc": torch.zeros(bs * width, dtype=torch.int64, device=DEV),
              "seq_lens": torch.tensor(lens, dtype=torch.int64, device=DEV),
              "req_pool_indices": torch.arange(bs, device=DEV), "tree_mask": torch.from_numpy(trees.mask).to(DEV)}
    return inputs, trees


def check_bit_identical(model):
    print("== 1. graph replay vs eager (bit for bit)")
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=4, num_draft_tokens=8,
                                widths=(2, 4, 8))
    fwd = VerifyForward(model, 4)
    fwd.context.copy_(torch.randint(0, VOCAB, fwd.context.shape, device=DEV))
    runner = make_runner(plan, fwd)
    t0 = time.time()
    runner.capture()
    print(f"captured {len(runner.graphs)} graphs in {time.time() - t0:.1f} s")
    ok = True
    for bs in (1, 2, 3, 4):
        for width in (2, 4, 8):
            drafts = [_D(list(range(10 + b, 9 + b + width)), list(range(-1, width - 2))) for b in range(bs)]
            inputs, _ = tree_inputs(drafts, [7] * bs, width, [100 + 10 * b for b in range(bs)])
            got = runner.replay(inputs, bs, width)
            want = fwd(inputs, bs, width)
            same = torch.equal(got, want)
            ok &= same
            print(f"  bs={bs} width={width}: " + ("identical" if same else f"DIFFERENT (max abs {(got - want).abs().max():.3g})"))
    print("RESULT graph replay bit-identical:", ok)
    return runner, fwd


def greedy_check(model, runner, fwd, steps=48, bs=2, width=8):
    print("== 2. greedy LOOKAHEAD vs plain decoding")
    torch.manual_seed(1)
    prompt = torch.randint(0, VOCAB, (bs, 120)).tolist()
    for p in prompt:
        p[40:80] = p[:40]  # copy-heavy: a repeated block
    root_only = _D([], [])

    plain = [list(p) for p in prompt]
    for _ in range(steps):
        for b in range(bs):
            fwd.load_context(b, plain[b][:-1])
        inputs, _ = tree_inputs([root_only] * bs, [s[-1] for s in plain], 1, [len(s) - 1 for s in plain])
        nxt = fwd(inputs, bs, 1).argmax(-1).tolist()
        for b in range(bs):
            plain[b].append(nxt[b])

    cache = LookaheadCache()
    seqs = [list(p) for p in prompt]
    for b in range(bs):
        cache.put_prompt(b, seqs[b])
    cache.synchronize()
    verify_steps = 0
    while min(len(s) for s in seqs) < len(prompt[0]) + steps:
        drafts = cache.batch_draft(list(range(bs)), seqs, width - 1)
        for b in range(bs):
            fwd.load_context(b, seqs[b][:-1])
        inputs, trees = tree_inputs(drafts, [s[-1] for s in seqs], width, [len(s) - 1 for s in seqs])
        target = runner.replay(inputs, bs, width).view(bs, width, -1).argmax(-1).tolist()
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
            accepted = accepted[: len(prompt[0]) + steps - len(seqs[b])]
            seqs[b] += accepted
            cache.put_output(b, accepted)
        verify_steps += 1
    same = seqs == plain
    print(f"RESULT greedy identical: {same}; {bs * steps} tokens in {verify_steps} verify steps "
          f"(tokens per request-step {steps / verify_steps:.2f})")


def timing(model):
    print("== 3. per-step time (ms): plain decode | verify graph | verify eager (width 8)")
    plan = GraphPlan.for_server(device="cuda", disable_cuda_graph=False, max_batch_size=8, num_draft_tokens=8)
    fwd = VerifyForward(model, 8)
    runner = make_runner(plan, fwd)
    runner.capture()

    def timed(fn, n=20):
        for _ in range(3):
            fn()
        torch.cuda.synchronize() if DEV == "cuda" else None
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize() if DEV == "cuda" else None
        return 1e3 * (time.perf_counter() - t0) / n

    for bs in (1, 2, 4, 8):
        drafts = [_D(list(range(20, 27)), list(range(-1, 6))) for _ in range(bs)]
        inputs, _ = tree_inputs(drafts, [5] * bs, 8, [200] * bs)
        one, _ = tree_inputs([_D([], [])] * bs, [5] * bs, 1, [200] * bs)
        plain_ms = timed(lambda: fwd(one, bs, 1))
        graph_ms = timed(lambda: runner.replay(inputs, bs, 8))
        eager_ms = timed(lambda: fwd(inputs, bs, 8))
        print(f"  bs={bs}: {plain_ms:.2f} | {graph_ms:.2f} | {eager_ms:.2f}")


def main():
    if DEV == "cuda":
        assert torch.cuda.is_available(), "no CUDA device"
        print(torch.__version__, torch.cuda.get_device_name())
    else:
        print("CPU dry run of the script's logic (no CUDA graphs, timings meaningless)")
    model = build_model()
    runner, fwd = check_bit_identical(model)
    greedy_check(model, runner, fwd)
    timing(model)


if __name__ == "__main__":
    main()
