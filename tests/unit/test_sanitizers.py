"""The native trie under ThreadSanitizer and AddressSanitizer.

The trie's hot paths run without the GIL on two kinds of threads (drafting
callers, the background inserter), so a data race or a use-after-free would
not show up as a Python error, only as a rare wrong draft or a crash.  Here
the extension is rebuilt with the sanitizers (``LOOKAHEAD_SANITIZE``, see
``setup.py``) in a scratch copy of the package, and ``native_stress.py``
drives every native path from several threads; any sanitizer report fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# sanitizer -> runtimes to preload (Python itself is not instrumented)
RUNTIMES = {"thread": ["libtsan.so"], "address,undefined": ["libasan.so", "libubsan.so"]}
REPORT_MARKERS = ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:")


def _runtime(name: str) -> str | None:
    compiler = shutil.which("gcc")
    if compiler is None:
        return None
    path = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


@pytest.mark.slow  # builds the trie twice, then stresses it: minutes here
@pytest.mark.parametrize("sanitizer", list(RUNTIMES))
def test_native_code_is_clean_under_sanitizer(sanitizer, tmp_path):
    preload = [_runtime(name) for name in RUNTIMES[sanitizer]]
    if None in preload:
        pytest.skip(f"gcc's {sanitizer} sanitizer runtime is not installed")
    root = tmp_path / "pkg"
    shutil.copytree(REPO / "lookahead", root / "lookahead",
                    ignore=shutil.ignore_patterns("*.so", "*.cpp", "__pycache__"))
    shutil.copy(REPO / "setup.py", root / "setup.py")
    build = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=root,
                           env={**os.environ, "LOOKAHEAD_SANITIZE": sanitizer},
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    sources = {path.stem for path in (root / "lookahead" / "trie").glob("*.pyx")}
    built = {path.name.split(".")[0] for path in (root / "lookahead" / "trie").glob("*.so")}
    assert sources and built >= sources, f"the sanitizer build made {sorted(built)} of {sorted(sources)}"

    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "LD_PRELOAD": " ".join(preload),
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        "TSAN_OPTIONS": "halt_on_error=1:report_signal_unsafe=0",
    }
    run = subprocess.run([sys.executable, str(REPO / "tests" / "support" / "native_stress.py")], cwd=root, env=env,
                         capture_output=True, text=True, timeout=900)
    reports = [line for line in run.stderr.splitlines() if any(m in line for m in REPORT_MARKERS)]
    assert not reports, run.stderr[-6000:]
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    # The stress really ran against the sanitized build, not an installed one.
    assert run.stdout.startswith("ok:") and str(root) in run.stdout, run.stdout
