"""Text tasks for the tiny copier: where its text comes from, and the prompts it answers.

Shared by ``train_tiny_copier.py`` (training mix), ``eval_copier.py`` (quality
figures) and ``demo.py``, so that all three speak the same prompt format.

Everything is built from the standard library's own sources on this machine:
no downloads. A fixed set of modules is held out: training never reads them, so
that the evaluation and the demo ask the model to copy text it has not seen.
"""

from __future__ import annotations

import io
import keyword
import random
import re
import sysconfig
import tokenize
from pathlib import Path

# Never trained on: the quality figures and the demo use these.
HELD_OUT = (
    "csv.py", "difflib.py", "textwrap.py", "shlex.py", "fractions.py", "statistics.py",
    "calendar.py", "glob.py", "fnmatch.py", "sched.py", "queue.py", "bisect.py",
    "heapq.py", "string.py", "json/__init__.py", "json/decoder.py", "json/encoder.py",
    "graphlib.py", "colorsys.py", "netrc.py",
)

USER, ASSISTANT, END = "<|user|>", "<|assistant|>", "<|end|>"


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _relative(path: Path) -> str:
    return path.relative_to(stdlib_dir()).as_posix()


def training_files() -> list[Path]:
    """Standard-library modules (tests and vendored trees excluded), held-out ones removed."""
    root = stdlib_dir()
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo", "ensurepip"}
    files = []
    for f in sorted(root.rglob("*.py")):
        rel = _relative(f)
        if skip & set(f.relative_to(root).parts) or rel in HELD_OUT:
            continue
        files.append(f)
    return files


def held_out_files() -> list[Path]:
    return [stdlib_dir() / rel for rel in HELD_OUT if (stdlib_dir() / rel).is_file()]


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace").replace("\t", "    ")


def chat(user: str) -> str:
    """The prompt for one user turn; the model answers after the assistant tag."""
    return f"{USER}\n{user}{END}\n{ASSISTANT}\n"


def code_chunks(source: str, min_lines: int = 12, max_lines: int = 40) -> list[str]:
    """Top-level-ish blocks of a module: runs of lines cut at blank lines before a def/class."""
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines)
              if re.match(r"\s*(def|class|async def) ", line) and (i == 0 or not lines[i - 1].strip()
                                                                  or lines[i - 1].lstrip().startswith("@"))]
    chunks = []
    for a, b in zip(starts, starts[1:] + [len(lines)]):
        block = lines[a:b]
        while block and not block[-1].strip():
            block.pop()
        if min_lines <= len(block) <= max_lines:
            chunks.append("\n".join(block))
    return chunks


def identifiers(code: str) -> list[str]:
    """Names used in ``code`` that a rename may target, most used first."""
    counts: dict[str, int] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code + "\n").readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) and len(tok.string) > 1:
                counts[tok.string] = counts.get(tok.string, 0) + 1
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return sorted(counts, key=lambda n: (-counts[n], n))


def rename(code: str, old: str, new: str) -> str:
    return re.sub(rf"\b{re.escape(old)}\b", new, code)


def single_token_name(tokenizer):
    """Whether a name is one token both bare and after a space (its two spellings in code)."""
    def check(name: str) -> bool:
        return all(len(tokenizer(form, add_special_tokens=False)["input_ids"]) == 1 for form in (name, " " + name))
    return check


NEW_NAMES = ("value", "item", "result", "data", "node", "count", "buf", "text", "key", "entry",
             "size", "total", "obj", "name", "index", "out", "part", "line", "token", "state")


def edit_task(code: str, rng: random.Random, renamable=lambda name: True) -> tuple[str, str] | None:
    """('rename X to Y and return it whole' prompt, expected answer), or None.

    ``renamable(name)`` filters both the old and the new name: the tiny copier
    is trained and measured on renames that keep the token count (one token to
    one token), since its copy head matches aligned tokens.
    """
    names = [n for n in identifiers(code)[:8] if n not in NEW_NAMES and renamable(n)]
    fresh = [n for n in NEW_NAMES if not re.search(rf"\b{n}\b", code) and renamable(n)]
    if not names or not fresh:
        return None
    old, new = rng.choice(names), rng.choice(fresh)
    prompt = chat(f"Rename `{old}` to `{new}` in this code and return it whole:\n\n```python\n{code}\n```")
    return prompt, f"```python\n{rename(code, old, new)}\n```"


def quote_task(code: str, rng: random.Random) -> tuple[str, str] | None:
    """Quote a pasted block back exactly (a docstring or a few lines)."""
    lines = code.splitlines()
    if len(lines) < 6:
        return None
    a = rng.randrange(0, len(lines) - 4)
    b = min(len(lines), a + rng.randint(4, 12))
    part = "\n".join(lines[a:b])
    first = lines[a].strip()
    if not first:
        return None
    prompt = chat(f"Here is a file:\n\n```python\n{code}\n```\n\nQuote the lines starting at `{first}` exactly.")
    return prompt, f"```python\n{part}\n```"


def write_task(code: str, rng: random.Random) -> tuple[str, str] | None:
    """An open request answered with real code: teaches the model to write, not only copy."""
    m = re.match(r"\s*(?:async )?(def|class) (\w+)", code)
    if not m:
        return None
    kind = "function" if m.group(1) == "def" else "class"
    prompt = chat(f"Write a Python {kind} named `{m.group(2)}`.")
    return prompt, f"```python\n{code}\n```"


def score_edit(request: dict, answer: str) -> dict:
    """Lines of a rename request's expected answer that ``answer`` reproduces token for
    token, aligned with ``difflib``: unchanged lines (the rename left them alone)
    and renamed lines, each counted and kept."""
    import difflib

    want, have = request["expected"].splitlines(), answer.split(END)[0].rstrip().splitlines()
    pasted = request["prompt"].split("```python\n", 1)[1].rsplit("\n```", 1)[0].splitlines()
    changed = {i for i, (a, b) in enumerate(zip(want, ["```python"] + pasted + ["```"])) if a != b}
    matcher = difflib.SequenceMatcher(None, want, have, autojunk=False)
    matched = {a + k for a, _, size in matcher.get_matching_blocks() for k in range(size)}
    return {"unchanged": len(want) - len(changed), "unchanged_kept": len(matched - changed),
            "renamed": len(changed), "renamed_kept": len(matched & changed),
            "missed": [want[i] for i in sorted(set(range(len(want))) - changed - matched)]}


def held_out_requests(tokenizer, n: int, seed: int = 0, kinds=("edit",)) -> list[dict]:
    """``n`` requests on held-out code, cycling through ``kinds`` ("edit", "quote"):
    each a dict with its kind, the prompt and the expected answer."""
    rng = random.Random(seed)
    renamable = single_token_name(tokenizer)
    chunks = [c for f in held_out_files() for c in code_chunks(read(f))]
    rng.shuffle(chunks)
    made = []
    for chunk in chunks:
        kind = kinds[len(made) % len(kinds)]
        task = edit_task(chunk, rng, renamable) if kind == "edit" else quote_task(chunk, rng)
        if task is None:
            continue
        made.append({"kind": kind, "prompt": task[0], "expected": task[1]})
        if len(made) == n:
            break
    return made
