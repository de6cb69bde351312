"""Teacher-forces answers through one plain ``sgl.Engine`` and writes each
emitted token's gap to the forward's best (``numerics.token_gaps``): the
driver behind the bfloat16 check of every emitted token.

``python tests/support/teacher_force_driver.py SPEC.json OUT.json``; SPEC
holds the model path, the engine's keyword arguments, the prompts (token
ids) and ``{name: [output ids per prompt]}``. With ``"lossy_from": name``
it also builds what a lossy verifier would have emitted from that
decoding's answers (``numerics.lossy_output``, accepting runner-ups less than
``"lossy_high"`` nats below the best, 0.3 unless given) and teacher-forces those too,
as ``"lossy"`` (requests where no position qualifies are left out, and
``"lossy_requests"`` lists the ones kept).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(spec_path: str, out_path: str) -> None:
    sys.path[:0] = [str(REPO), str(REPO / "cpu"), str(REPO / "tools")]
    from cpu_env import apply_cpu_env, cpu_engine_kwargs

    apply_cpu_env()
    import sglang as sgl

    from lookahead.validate import numerics

    spec = json.loads(Path(spec_path).read_text())
    prompts = spec["prompts"]
    engine = sgl.Engine(model_path=spec["model"], log_level="error", **cpu_engine_kwargs(**spec.get("engine", {})))
    try:
        result = {"outputs": dict(spec["outputs"]), "gaps": {}}
        for name, outs in spec["outputs"].items():
            result["gaps"][name] = numerics.teacher_force(engine, prompts, outs)
        source = spec.get("lossy_from")
        if source:
            high = spec.get("lossy_high", 0.3)
            lossy = [numerics.lossy_output(o, g, high=high) for o, g in
                     zip(spec["outputs"][source], result["gaps"][source])]
            keep = [i for i, lo in enumerate(lossy) if lo is not None]
            result["lossy_requests"] = keep
            result["outputs"]["lossy"] = [lossy[i] for i in keep]
            result["gaps"]["lossy"] = numerics.teacher_force(engine, [prompts[i] for i in keep],
                                                             [lossy[i] for i in keep])
    finally:
        engine.shutdown()
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
