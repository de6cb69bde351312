"""Shared fixtures: the tiny local model and the environment for CPU sglang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Path of the tiny random Llama + BPE tokenizer (built once, offline)."""
    from lookahead.testing.cpu_env import default_cache_dir
    from lookahead.testing.tiny_model import build_tiny_model

    return str(build_tiny_model(default_cache_dir() / "tiny-llama-seed0", seed=0))


@pytest.fixture(scope="session")
def cpu_subprocess_env() -> dict:
    """Environment for a subprocess that runs sglang's CPU engine with this repo importable."""
    from lookahead.testing.cpu_env import cpu_env

    env = cpu_env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO), str(REPO / "tests")])
    return env
