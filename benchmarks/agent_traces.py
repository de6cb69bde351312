"""Agent traffic for the model-free replay, from SWE-agent's published trajectories.

Why: an agent re-sends its whole conversation every step (system prompt, task,
every earlier action and tool output), and its actions copy what it has just
seen: file names, code lines, commands, error text.  Agent benchmarks and
evaluation harnesses also run the same task again and again (retries, pass@k,
other configurations).  This script turns SWE-agent's demonstration
trajectories (MIT licensed, https://github.com/SWE-agent/SWE-agent) into replay
traces so that ``python -m lookahead.replay`` can measure drafting on that
traffic.

Each assistant turn of a trajectory's ``history`` is one request: the prompt is
the conversation before it (system, instance prompt and demonstrations, earlier
actions and observations) rendered with the model's chat template and a
generation prompt; the response is that assistant message (its text, plus its
tool calls in Hermes style ``<tool_call>{json}</tool_call>`` for the
function-calling trajectories).  Tokenized as ``lookahead/replay/formats.py``
tokenizes conversations.

Two traces are written to ``--out-dir``:

* ``agent.jsonl.gz``: every trajectory once, in path order;
* ``agent_retry.jsonl.gz``: every trajectory ``--runs`` times (default 3), in
  rounds (all tasks, then all tasks again: other tasks' requests lie between a
  task's attempts, as when a harness retries a whole benchmark).  Attempt k is
  the k-th distinct earlier version of that file in the repository's git
  history, where there is one (the trajectory re-recorded: another run of the
  same task, its actions partly different); otherwise the newest again (a
  greedy rerun of an unchanged task gives the same actions).

Each line is ``{"prompt": [ids], "response": [ids], "task": path, "attempt": k}``.

    python benchmarks/agent_traces.py SWE-agent.git    # a bare clone (git clone --bare): HEAD and its history
    python benchmarks/agent_traces.py path/to/trajectories/                    # or *.traj files
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TOKENIZER = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct"
DEFAULT_OUT = ROOT / ".cache" / "agent_traces"


def _git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True,
                          text=True).stdout


def _is_git_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(os.path.join(path, "objects"))


def _parse(text: str):
    """A trajectory's messages as [(role, text)], or None if it has none:
    SWE-agent's ``history``, or mini-swe-agent's ``messages`` (``.traj.json``)."""
    try:
        data = json.loads(text)
        history = data.get("history") or data.get("messages")
    except (ValueError, AttributeError):
        return None
    if not isinstance(history, list) or not any(m.get("role") == "assistant" for m in history):
        return None
    return [(m["role"], _text(m)) for m in history if isinstance(m, dict) and m.get("role")]


def _text(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = fn.get("arguments")
        content += "\n<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": arguments}) + "\n</tool_call>"
    return content


def trajectories(source: str, runs: int) -> dict:
    """{task name: [messages of attempt 1, 2, ...]} (up to ``runs`` distinct versions)."""
    out = {}
    if _is_git_dir(source):
        files = [p for p in _git(source, "ls-tree", "-r", "--name-only", "HEAD").splitlines() if p.endswith(".traj")]
        for path in sorted(files):
            versions = []
            for commit in _git(source, "log", "--format=%H", "HEAD", "--", path).splitlines():
                messages = _parse(_git(source, "show", f"{commit}:{path}"))
                if messages is not None and messages not in versions:
                    versions.append(messages)
                if len(versions) == runs:
                    break
            if versions:
                out[path] = versions
    else:
        for path in sorted([*Path(source).rglob("*.traj"), *Path(source).rglob("*.traj.json")]):
            messages = _parse(path.read_text(encoding="utf-8"))
            if messages is not None:
                out[str(path.relative_to(source))] = [messages]
    return out


def requests(messages: list, tokenizer) -> list:
    """(prompt ids, response ids) for every assistant turn after the first message."""
    out = []
    for i, (role, text) in enumerate(messages):
        if role != "assistant" or i == 0 or not text:
            continue
        history = [{"role": r, "content": t} for r, t in messages[:i]]
        rendered = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        prompt = tokenizer(rendered, add_special_tokens=False)["input_ids"]
        out.append((prompt, tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def write(path: Path, lines: list) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", help="a bare git dir of SWE-agent (read at HEAD, with history) or a directory of .traj files")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER))
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT))
    ap.add_argument("--runs", type=int, default=3, help="attempts per task in agent_retry.jsonl.gz")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    tasks = trajectories(args.source, args.runs)
    if not tasks:
        raise SystemExit(f"no trajectory with an assistant turn under {args.source}")
    cache, once, retry = {}, [], []

    def lines(task, attempt):
        versions = tasks[task]
        messages = versions[attempt] if attempt < len(versions) else versions[0]
        key = id(messages)
        if key not in cache:
            cache[key] = requests(messages, tokenizer)
        return [{"prompt": p, "response": r, "task": task, "attempt": attempt + 1} for p, r in cache[key]]

    for task in tasks:
        once += lines(task, 0)
    for attempt in range(args.runs):
        for task in tasks:
            retry += lines(task, attempt)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write(out / "agent.jsonl.gz", once)
    write(out / "agent_retry.jsonl.gz", retry)
    source = {"source": os.path.abspath(args.source), "tokenizer": args.tokenizer,
              "tasks": {t: len(v) for t, v in tasks.items()}}
    if _is_git_dir(args.source):
        source["commit"] = _git(args.source, "rev-parse", "HEAD").strip()
    (out / "sources.json").write_text(json.dumps(source, indent=1) + "\n")
    for name, rows in (("agent", once), ("agent_retry", retry)):
        print(f"{out / (name + '.jsonl.gz')}: {len(rows)} requests, "
              f"{sum(len(r['prompt']) for r in rows)} prompt and {sum(len(r['response']) for r in rows)} response tokens")
    print(f"{len(tasks)} trajectories, {sum(len(v) > 1 for v in tasks.values())} with a distinct earlier version")


if __name__ == "__main__":
    main()
