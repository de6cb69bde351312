"""External corpora on a real LLM: plain decoding, SGLang's NGRAM and LOOKAHEAD, each given the same corpus.

Two workloads, served at batch 1, one request at a time, each
request with its own ``cache_salt`` (a different user: LOOKAHEAD keeps
users' histories apart, so for it only the corpus and the request's own
prompt can help; NGRAM's history is global, and shared by all):

* **Help desk.**  The corpus holds curated answers: the model's own answers
  to a set of questions, recorded once with plain decoding (plain's run of
  those questions is the recording).  Requests ask those questions, then
  paraphrases of them.
* **Repository.**  The corpus is a code base: the sources of the standard
  library's ``json`` package.  Requests paste the first part of one of its
  files and ask for the rest, or ask for a function by name.

Both corpora are one JSONL file of strings (one document per line: each
answer, each source file), SGLang's NGRAM corpus format, given to NGRAM as
``--speculative-ngram-external-corpus-path`` and to LOOKAHEAD as
``--speculative-lookahead-corpus``.  NGRAM needs
``--speculative-ngram-external-sam-budget`` too (its default, 0, is refused
with a corpus): the draft nodes its corpus gets, the rest going to its
history trie.  It runs twice, with 4 (the best for NGRAM in a model-free
replay of these requests) and with the most it allows,
``num_draft_tokens - 1``; LOOKAHEAD is compared with the better of the two
on each workload.  Each decoding runs in its own ``sgl.Engine``, in this
order: plain (recording the answers, then writing the corpus), NGRAM,
LOOKAHEAD.

It prints per workload and decoding: tokens, model steps, the acceptance
length (AL: tokens per model step) and tokens/s, then LOOKAHEAD / NGRAM
ratios against the bars we aim for (AL >= 1.2x on each workload, tokens/s >=
1.1x).  The model is SmolLM2-135M-Instruct (``real_model``,
fetched and converted on first use).  One round on a small VM: compare
figures within one run only.

    python benchmarks/bench_corpus.py [--max-new-tokens 128] [--questions 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools"), str(REPO / "benchmarks")]

from bench_workloads import stderr_to, steps_of  # noqa: E402

# (question, paraphrase): the corpus holds the model's answers to the first.
QUESTIONS = [
    ("How do I reset my password if I forgot it?",
     "I forgot my password. What are the steps to reset it?"),
    ("How can I connect my laptop to a wireless printer?",
     "What is the way to set up a wireless printer with my laptop?"),
    ("Why is my computer running so slowly, and how can I fix it?",
     "My computer has become very slow. What can I do to speed it up?"),
    ("How do I back up the files on my computer?",
     "What is the best way to make a backup of the files on my computer?"),
    ("How do I set up two-factor authentication for my email account?",
     "Can you explain how to turn on two-factor authentication for my email?"),
]
SYSTEM = "You are the help desk assistant of a company. Answer the user's question."

PACKAGE = "json"  # the standard-library package whose sources are the repository corpus
PASTE_FILES = ("decoder.py", "encoder.py")  # paste the first part, ask for the rest
PASTE_LINES = 40
BY_NAME = [  # (file, what to ask for)
    ("encoder.py", "the function `py_encode_basestring_ascii`"),
    ("decoder.py", "the method `JSONDecoder.raw_decode`"),
]
WORKLOADS = ("help desk", "repository")


def package_sources() -> dict[str, str]:
    root = Path(sysconfig.get_paths()["stdlib"]) / PACKAGE
    return {p.name: p.read_text() for p in sorted(root.glob("*.py"))}


def chat(tokenizer, user: str, system: str | None = None) -> str:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def help_desk_requests(tokenizer, n: int) -> dict:
    pairs = QUESTIONS[:n]
    return {"originals": [chat(tokenizer, q, SYSTEM) for q, _ in pairs],
            "paraphrases": [chat(tokenizer, p, SYSTEM) for _, p in pairs]}


def repository_requests(tokenizer, sources: dict) -> list[str]:
    out = []
    for name in PASTE_FILES:
        head = "".join(sources[name].splitlines(keepends=True)[:PASTE_LINES])
        out.append(chat(tokenizer, f"Here is the beginning of `{PACKAGE}/{name}` from the Python standard "
                                   f"library:\n\n```python\n{head}```\n\nContinue the file from where it stops."))
    for name, what in BY_NAME:
        out.append(chat(tokenizer, f"Write {what} from `{PACKAGE}/{name}` in the Python standard library, "
                                   f"exactly as it is there."))
    return out


def measure(engine, prompts: list[str], sampling: dict, tag: str) -> dict:
    """Serve ``prompts`` one at a time (batch 1), each with its own cache_salt."""
    outs, t0 = [], time.perf_counter()
    for i, prompt in enumerate(prompts):
        outs.append(engine.generate(prompt, sampling, cache_salt=f"{tag}-user-{i}"))
        print(".", end="", flush=True)  # progress: one dot per request
    seconds = time.perf_counter() - t0
    tokens = sum(len(o["output_ids"]) for o in outs)
    steps = sum(steps_of(o) for o in outs)  # the prefill counted, for every decoding
    return {"outputs": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs], "tokens": tokens,
            "seconds": seconds, "steps": steps}


def serve(model: str, kwargs: dict, sampling: dict, reqs: dict, log: Path) -> dict:
    import sglang as sgl

    with stderr_to(log):
        engine = sgl.Engine(model_path=model, log_level="error", **kwargs)
    try:
        # First-call costs (and the NGRAM corpus' first build), not measured: an
        # unrelated prompt, so no drafter sees the requests before they are served.
        engine.generate("Say hello.", {**sampling, "max_new_tokens": 8})
        time.sleep(1.0)  # LOOKAHEAD indexes its start-up corpus in the background (milliseconds here)
        return {phase: measure(engine, prompts, sampling, phase.replace(" ", "-")) for phase, prompts in reqs.items()}
    finally:
        with stderr_to(log):
            engine.shutdown()


def combine(parts: list[dict]) -> dict:
    return {k: sum(p[k] for p in parts) for k in ("tokens", "seconds", "steps")} | {
        "outputs": [o for p in parts for o in p["outputs"]]}


def corpus_documents(plain_run: dict, sources: dict) -> list[str]:
    """The corpus, one document per line of its file: plain decoding's
    recorded help-desk answers, then the package's source files."""
    return plain_run["help desk: originals"]["texts"] + list(sources.values())


def bound_steps(tokenizer, reqs: dict, results: dict, docs: list[list[int]], width: int) -> dict:
    """{decoding: {phase: model steps}} at the hindsight bound of copying
    drafters (``copy_bound``) on each speculative decoding's own outputs
    (in bfloat16 they part from plain decoding's), with the sources a
    request of its own user may draft from: the corpus, its prompt and its
    output so far (``docs``: the corpus documents' tokens)."""
    from copy_bound import copy_bound_steps

    prompts = {phase: [tokenizer.encode(p, add_special_tokens=False) for p in ps] for phase, ps in reqs.items()}
    return {name: {phase: sum(copy_bound_steps(docs, p, out, width)
                              for p, out in zip(prompts[phase], run[phase]["outputs"]))
                   for phase in reqs}
            for name, run in results.items() if name != "plain"}


def report(results: dict, corpus_info: str, ngrams: list[str], bound: dict | None = None) -> dict:
    rows = {"help desk": ("help desk: originals", "help desk: paraphrases"),
            "  originals": ("help desk: originals",), "  paraphrases": ("help desk: paraphrases",),
            "repository": ("repository",)}
    print(f"\n{corpus_info}\n")
    print("| workload | decoding | tokens | model steps | AL | tokens/s | vs plain | identical to plain |")
    print("|---|---|---|---|---|---|---|---|")
    figures = {}
    for row, phases in rows.items():
        plain = combine([results["plain"][p] for p in phases])
        for name, r in results.items():
            f = combine([r[p] for p in phases])
            al, rate = f["tokens"] / f["steps"], f["tokens"] / f["seconds"]
            figures[(row, name)] = (al, rate)
            same = f["outputs"] == plain["outputs"]
            print(f"| {row} | {name} | {f['tokens']} | {f['steps']} | {al:.2f} | {rate:.1f} | "
                  f"{rate / (plain['tokens'] / plain['seconds']):.2f}x | {'yes' if same else 'no'} |")
    print("\nLOOKAHEAD / NGRAM, NGRAM's better run (higher AL, higher tokens/s) on each workload:\n")
    print("| workload | AL LOOKAHEAD / NGRAM | tokens/s LOOKAHEAD / NGRAM | bar: AL >= 1.2x, tokens/s >= 1.1x "
          "| copy bound on LOOKAHEAD's texts: AL (LOOKAHEAD's share, the bar's) | ... on NGRAM's texts (NGRAM's share) |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for row in rows:
        la = figures[(row, "LOOKAHEAD")]
        al_ng, al_by = max((figures[(row, n)][0], n) for n in ngrams)
        rate_ng, rate_by = max((figures[(row, n)][1], n) for n in ngrams)
        al_ratio, rate_ratio = la[0] / al_ng, la[1] / rate_ng
        summary[row.strip()] = {"al": la[0], "al_ngram": al_ng, "al_ratio": al_ratio, "rate": la[1],
                                "rate_ngram": rate_ng, "rate_ratio": rate_ratio}
        limit = " | "
        if bound:
            def bound_al(name):
                return combine([results[name][p] for p in rows[row]])["tokens"] / sum(bound[name][p] for p in rows[row])
            la_bound, ng_bound = bound_al("LOOKAHEAD"), bound_al(al_by)
            summary[row.strip()] |= {"al_bound": la_bound, "al_bound_ngram": ng_bound}
            limit = (f"{la_bound:.2f} ({la[0] / la_bound:.0%}, {1.2 * al_ng / la_bound:.0%}) | "
                     f"{ng_bound:.2f} ({al_ng / ng_bound:.0%})")
        bar = "" if row.startswith(" ") else (f"AL {'PASS' if al_ratio >= 1.2 else 'MISS'}, "
                                              f"tokens/s {'PASS' if rate_ratio >= 1.1 else 'MISS'}")
        print(f"| {row} | {al_ratio:.2f}x ({la[0]:.2f} / {al_ng:.2f}, {al_by}) | {rate_ratio:.2f}x "
              f"({la[1]:.1f} / {rate_ng:.1f}, {rate_by}) | {bar} | {limit} |")
    if bound:
        print("\ncopy bound: a contiguous single-source copy bound, the AL of a drafter that, knowing the output, "
              "copies at each step the best continuation of any occurrence of the context's last token in the "
              "corpus, the prompt or the output so far (benchmarks/copy_bound.py), on each decoding's own outputs, "
              "the prefill a step of its own as in the measured AL; LOOKAHEAD can exceed it by re-anchoring. "
              "The bar's share: 1.2x NGRAM's AL over LOOKAHEAD's bound")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-path", default=None, help="default: SmolLM2-135M-Instruct, fetched on first use")
    ap.add_argument("--questions", type=int, default=4, help=f"help-desk questions (1-{len(QUESTIONS)}), "
                                                             "each asked again as a paraphrase")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=8, help="verify width per request (root included)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--workdir", default=None, help="where the corpus file goes (default .cache/bench_corpus)")
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="serve nothing: print the tables of a run saved with --json (and its copy bound)")
    args = ap.parse_args(argv)
    if args.report:
        return reprint(args.report, args.num_draft_tokens)

    from cpu_env import apply_cpu_env, cpu_engine_kwargs, default_cache_dir

    apply_cpu_env()
    from transformers import AutoTokenizer

    from real_model import real_model_path

    model = args.model_path or real_model_path()
    tokenizer = AutoTokenizer.from_pretrained(model)
    work = Path(args.workdir) if args.workdir else default_cache_dir() / "bench_corpus"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "sglang.log"
    log.write_text("")
    sources = package_sources()
    hd = help_desk_requests(tokenizer, args.questions)
    reqs = {"help desk: originals": hd["originals"], "help desk: paraphrases": hd["paraphrases"],
            "repository": repository_requests(tokenizer, sources)}
    sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
    base = cpu_engine_kwargs(dtype=args.dtype, max_total_tokens=16384, max_running_requests=4)
    spec = {"speculative_num_draft_tokens": args.num_draft_tokens}
    corpus = work / "corpus.jsonl"
    print(f"model: {model} ({args.dtype}); help desk: {args.questions} questions and {args.questions} paraphrases; "
          f"repository: {len(reqs['repository'])} requests on the {PACKAGE} package; greedy, max "
          f"{args.max_new_tokens} new tokens, batch 1, verify width {args.num_draft_tokens}; one round; "
          f"SGLang's messages: {log}", flush=True)

    results = {}
    t0 = time.time()
    print("  plain (records the help-desk answers)...", end="", flush=True)
    results["plain"] = serve(model, base, sampling, reqs, log)
    print(f" {time.time() - t0:.0f} s", flush=True)
    documents = corpus_documents(results["plain"], sources)
    with open(corpus, "w") as f:
        for text in documents:
            f.write(json.dumps(text) + "\n")
    docs = [tokenizer.encode(t, add_special_tokens=False) for t in documents]
    sams = sorted({min(s, args.num_draft_tokens - 1) for s in (4, args.num_draft_tokens - 1)})
    ngrams = [f"NGRAM (SAM {s})" for s in sams]
    configs = {name: {**base, **spec, "speculative_algorithm": "NGRAM",
                      "speculative_ngram_external_corpus_path": str(corpus),
                      "speculative_ngram_external_sam_budget": s} for name, s in zip(ngrams, sams)}
    configs["LOOKAHEAD"] = {**base, **spec, "speculative_algorithm": "LOOKAHEAD",
                            "speculative_lookahead_corpus": [str(corpus)]}
    for name, kwargs in configs.items():
        t0 = time.time()
        print(f"  {name}...", end="", flush=True)
        results[name] = serve(model, kwargs, sampling, reqs, log)
        print(f" {time.time() - t0:.0f} s", flush=True)
    info = (f"corpus {corpus}: {len(documents) - len(sources)} recorded answers and {len(sources)} source files "
            f"of {PACKAGE}/, {sum(map(len, docs)):,} tokens; NGRAM (SAM n): --speculative-ngram-external-sam-budget n")
    bound = bound_steps(tokenizer, reqs, results, docs, args.num_draft_tokens)
    summary = report(results, info, ngrams, bound)
    identical = all(r[p]["outputs"] == results["plain"][p]["outputs"] for r in results.values() for p in reqs)
    print(f"\noutputs identical to plain decoding: {identical}"
          + ("" if identical or args.dtype == "float32" else
             " (bfloat16: verify and decode forwards round differently at near ties)"))
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": model, "dtype": args.dtype, "width": args.num_draft_tokens, "summary": summary,
            "identical": identical, "requests": reqs, "runs": results, "steps_count_prefill": True}))
    return 0


def reprint(path: str, width: int) -> int:
    """The tables of a saved run, with the copy bound computed anew (the
    corpus rebuilt as the run built it, ``corpus_documents``)."""
    from transformers import AutoTokenizer

    from real_model import real_model_path

    saved = json.loads(Path(path).read_text())
    results, reqs = saved["runs"], saved["requests"]
    if not saved.get("steps_count_prefill"):
        # Runs saved before steps counted the prefill for every decoding: a
        # speculative decoding's steps were its verify steps alone, plain
        # decoding's one per token (the prefill's included). Add the prefill.
        for name, run in results.items():
            if name != "plain":
                for phase in run.values():
                    phase["steps"] += sum(1 for o in phase["outputs"] if o)
    width = saved.get("width", width)
    tokenizer = AutoTokenizer.from_pretrained(real_model_path())
    documents = corpus_documents(results["plain"], package_sources())
    docs = [tokenizer.encode(t, add_special_tokens=False) for t in documents]
    ngrams = [name for name in results if name.startswith("NGRAM")]
    report(results, f"{path}: {saved['model']} ({saved['dtype']}), verify width {width}", ngrams,
           bound_steps(tokenizer, reqs, results, docs, width))
    return 0


if __name__ == "__main__":
    sys.exit(main())
