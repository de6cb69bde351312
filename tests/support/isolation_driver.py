"""Serves the isolation scenario on ``sgl.Engine`` configurations one after
the other and writes what happened as JSON: the driver behind
``test_e2e_isolation.py``.

In each engine, request A (``cache_salt`` "alice") generates a text; then
three requests continue it, each prompted with A's prompt and the first
``lead`` tokens A generated (someone who guessed how A's text starts): one
with salt "bob", one with salt "alice", one with no salt.  For LOOKAHEAD
engines every draft is logged (``LOOKAHEAD_DRAFT_LOG``), so the test can see
where each came from.  Like ``e2e_driver.py`` it must run in a process set
up for sglang's CPU engine: ``python tests/support/isolation_driver.py SPEC OUT``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUESSERS = (("bob", "bob"), ("alice", "alice"), ("nobody", None))  # (name, cache_salt)


def main(spec_path: str, out_path: str) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools")]
    from cpu_env import apply_cpu_env, cpu_engine_kwargs

    apply_cpu_env()
    import sglang as sgl
    from transformers import AutoTokenizer

    from lookahead.trie.draft_log import DRAFT_LOG_ENV

    spec = json.loads(Path(spec_path).read_text())
    prompt = AutoTokenizer.from_pretrained(spec["model"])(spec["text"])["input_ids"]
    result = {"prompt": prompt, "runs": {}}
    for run in spec["runs"]:
        log = Path(out_path).with_name(f"drafts-{run['name']}.jsonl")
        if run.get("log_drafts"):
            os.environ[DRAFT_LOG_ENV] = str(log)
        else:
            os.environ.pop(DRAFT_LOG_ENV, None)
        engine = sgl.Engine(model_path=spec["model"], log_level="error", **cpu_engine_kwargs(**run["engine"]))
        try:
            sampling = {"temperature": 0.0, "ignore_eos": True}
            a = engine.generate(input_ids=prompt, sampling_params={**sampling, "max_new_tokens": spec["a_tokens"]},
                                cache_salt="alice", rid="A")["output_ids"]
            guess = prompt + a[: spec["lead"]]
            outputs = {"A": a}
            for name, salt in GUESSERS:
                outputs[name] = engine.generate(
                    input_ids=guess, sampling_params={**sampling, "max_new_tokens": spec["guess_tokens"]},
                    cache_salt=salt, rid=name)["output_ids"]
        finally:
            engine.shutdown()
        records = [json.loads(line) for line in log.read_text().splitlines()] if run.get("log_drafts") else []
        result["runs"][run["name"]] = {"outputs": outputs, "guess_prompt": guess, "drafts": records}
        print(run["name"], "done", flush=True)
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
