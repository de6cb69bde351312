"""The wheel a user installs holds what a user runs, and nothing else.

The CPU stand-ins (``cpu/``: a pure-torch ``sgl_kernel`` that would shadow
the real one), the models and GPU-machine scaffolding (``tools/``), the
benchmarks and the tests live in the checkout only. Built as ``make wheel``
does, from a copy of the checkout's tracked files (so that no earlier build's
objects are reused).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_BYTES = 2 * 1024 * 1024


def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


@pytest.mark.slow  # compiles the trie (a minute or two here)
def test_the_wheel_is_small_and_holds_no_test_or_lab_code(tmp_path):
    source = _tracked_copy(tmp_path / "checkout")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path), str(source)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("sglang_lookahead-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if ".dist-info/" not in n]
    print(f"{wheel.name}: {wheel.stat().st_size:,} bytes, {len(names)} files")

    assert wheel.stat().st_size < MAX_BYTES, f"{wheel.stat().st_size:,} bytes"
    assert all(n.startswith("lookahead/") for n in code), [n for n in code if not n.startswith("lookahead/")]
    assert all(n.endswith((".py", ".so")) for n in code), [n for n in code if not n.endswith((".py", ".so"))]
    lab = [n for n in code if any(part in n for part in ("test", "cpu_sgl_kernel", "bare_gpu", "tiny_model",
                                                          "real_model", "bench", "fixture"))]
    assert not lab, lab
    # What a user runs is there: the trie, the plugin, the replay, the GPU validation.
    for needed in ("lookahead/__init__.py", "lookahead/plugin/__init__.py", "lookahead/trie/cache.py",
                   "lookahead/replay/__main__.py", "lookahead/validate/__main__.py"):
        assert needed in names, needed
    assert sum(n.startswith("lookahead/trie/_drafting.") and n.endswith(".so") for n in names) == 1
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "lookahead = lookahead.plugin:register" in text and "[sglang.srt.plugins]" in text
