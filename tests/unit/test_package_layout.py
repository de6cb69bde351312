"""The package's architecture, as checks a reviewer would otherwise do by eye.

* ``lookahead.trie`` (what drafts) and ``lookahead.replay`` (what measures
  drafts on logs) run where neither sglang nor torch is installed: a user
  replays their logs before installing a server, and the trie stays a
  library. Only ``lookahead.plugin`` and ``lookahead.validate`` need SGLang.
* No import cycle between the package's modules (module-level imports).
* No module over 600 lines: a longer one holds more than one idea.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "lookahead"
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")) + sorted(PACKAGE.rglob("*.pyx")):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _module_level_imports(path: Path, name: str, known: set) -> set:
    """Package modules that ``path`` imports when it is imported (not inside
    functions, not under ``if TYPE_CHECKING``)."""
    if path.suffix != ".py":
        return set()
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(body):
        for node in body:
            if isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if "TYPE_CHECKING" not in test:
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in known)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    target = f"{base}.{alias.name}"
                    if target in known:
                        found.add(target)
                    elif base in known:
                        found.add(base)

    visit(tree.body)
    found.discard(name)
    return found


def test_no_module_is_longer_than_600_lines():
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_cycle():
    modules = _modules()
    graph = {name: _module_level_imports(path, name, set(modules)) for name, path in modules.items()}
    assert graph["lookahead.plugin"], "the graph must see imports (the plugin imports its server args)"
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def walk(node, stack):
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])


_WITHOUT_SGLANG_AND_TORCH = r"""
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("sglang", "torch", "sgl_kernel", "flashinfer"):
            raise ImportError(f"{name} is not installed here")
        return None

sys.meta_path.insert(0, Refuse())
import numpy as np
import lookahead
import lookahead.trie, lookahead.trie.cache, lookahead.trie.corpora, lookahead.trie.config
import lookahead.trie.scopes, lookahead.trie.tokens, lookahead.trie._tuning
import lookahead.replay, lookahead.replay.formats, lookahead.replay.baselines

cache = lookahead.LookaheadCache()
cache.put_prompt("earlier", [1, 2, 3])
cache.put_output("earlier", list(range(100, 140)))
cache.finish("earlier")  # its output enters the shared history
cache.put_prompt("now", [7, 8, 100, 101, 102])
cache.synchronize()
draft = cache.draft("now", [7, 8, 100, 101, 102], budget=4, one_branch=True)
assert list(draft.tokens) == [103, 104, 105, 106], draft.tokens
lookahead.replay.make_drafter("lookahead", 8)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("sglang", "torch"))
assert not heavy, heavy
print("OK")
"""


def test_trie_and_replay_need_neither_sglang_nor_torch():
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_SGLANG_AND_TORCH], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr


def test_public_names_stay_importable_from_the_package():
    import lookahead
    from lookahead.trie.cache import Draft, LookaheadCache
    from lookahead.trie.config import LookaheadConfig

    assert (lookahead.LookaheadCache, lookahead.Draft, lookahead.LookaheadConfig) == (
        LookaheadCache, Draft, LookaheadConfig)
    assert sorted(lookahead.__all__) == ["Draft", "LookaheadCache", "LookaheadConfig", "__version__"]


def test_the_readme_is_for_users_and_short():
    """Under 250 lines, opening with the two commands that set everything up;
    measurement history lives in docs/, and nothing reads ../shared."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 250, len(text.splitlines())
    first_block = text.split("```")[1]
    assert "make demo" in first_block and "make test" in first_block, first_block
    assert "../shared" not in text
