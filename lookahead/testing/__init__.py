"""Test and demo support: run real SGLang on a CPU-only machine.

- ``cpu_env``: environment variables, flags and Engine kwargs for the CPU engine.
- ``tiny_model``: an offline-built tiny Llama plus tokenizer.
- ``TINY_COPIER``: the committed tiny copier checkpoint (``scripts/train_tiny_copier.py``).
- ``cpu_sgl_kernel/``: a pure-torch stand-in for the ``sgl_kernel`` package,
  put first on ``PYTHONPATH`` (never imported from here).

Nothing heavy is imported at package import time.
"""

from pathlib import Path

TINY_COPIER = Path(__file__).with_name("tiny_copier")
