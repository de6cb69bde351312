"""The pure-torch stand-ins that run real SGLang on a bare GPU machine.

``tools/gpu_bare_machine.sh`` serves SGLang on a CUDA machine without
sglang-kernel or flashinfer, with ``tools/bare_gpu`` first on
``PYTHONPATH``. What can be proved without a GPU is proved here, in a
subprocess with that path (so this process's CPU ``sgl_kernel`` stays apart):
the stand-in binds every name SGLang imports from ``sgl_kernel`` at module
level, registers no op that would switch SGLang to its AMX CPU branches,
computes what SGLang's own torch layers compute, and its ``sitecustomize``
patches the kernels that SGLang would otherwise compile on first use.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BARE_GPU = REPO / "tools" / "bare_gpu"


def _run(code: str) -> dict:
    env = dict(os.environ, LOOKAHEAD_BARE_GPU="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join([str(BARE_GPU), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _module_level_sgl_kernel_imports() -> dict:
    """``{module: names}`` that SGLang imports from ``sgl_kernel`` at module
    level outside ``try`` (a missing one fails the importing module)."""
    import sglang

    root = Path(sglang.__file__).parent
    wanted: dict[str, set] = {}
    for path in [*root.joinpath("srt").rglob("*.py"), *root.joinpath("kernels").rglob("*.py")]:
        if "hardware_backend" in path.parts or "multimodal_gen" in path.parts:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escapes in SGLang's sources
                tree = ast.parse(path.read_text())
        except (SyntaxError, UnicodeDecodeError):
            continue

        def walk(node, guarded):
            for child in ast.iter_child_nodes(node):
                inner = guarded or isinstance(node, (ast.Try, ast.FunctionDef, ast.AsyncFunctionDef))
                if isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "sgl_kernel" \
                        and not inner:
                    wanted.setdefault(child.module, set()).update(a.name for a in child.names)
                walk(child, inner)

        walk(tree, False)
    return wanted


@pytest.mark.slow  # imports most of sglang in a subprocess: over 20 s here
def test_every_name_sglang_binds_at_import_exists():
    wanted = _module_level_sgl_kernel_imports()
    assert "sgl_kernel" in wanted and "rmsnorm" in wanted["sgl_kernel"]
    missing = _run(
        "import importlib, json\n"
        f"wanted = {json.dumps({m: sorted(n) for m, n in wanted.items()})}\n"
        "missing = []\n"
        "for module, names in wanted.items():\n"
        "    try:\n"
        "        mod = importlib.import_module(module)\n"
        "    except ImportError:\n"
        "        missing.append(module); continue\n"
        "    missing += [f'{module}.{n}' for n in names if not hasattr(mod, n)]\n"
        "import sgl_kernel\n"
        "print(json.dumps({'missing': missing, 'standin': getattr(sgl_kernel, 'IS_BARE_GPU_STANDIN', False)}))\n"
    )
    assert missing["standin"], "the bare-GPU sgl_kernel was not the one imported"
    # The CPU engine's *_cpu names and the Mamba CPU kernels come from the CPU stand-in.
    gaps = [n for n in missing["missing"] if not n.startswith("sgl_kernel.mamba")]
    assert not gaps, f"names SGLang imports at module level that the stand-in lacks: {gaps}"


def test_kernels_match_sglangs_torch_layers():
    out = _run(
        "import json, torch\n"
        "import sgl_kernel\n"
        "from sglang.srt.layers.layernorm import RMSNorm\n"
        "from sglang.srt.layers.activation import SiluAndMul\n"
        "torch.manual_seed(0)\n"
        "norm = RMSNorm(64, eps=1e-5); norm.weight.data.uniform_(0.5, 1.5)\n"
        "x, r = torch.randn(5, 64), torch.randn(5, 64)\n"
        "ref_out, ref_res = norm.forward_native(x.clone(), r.clone())\n"
        "xi, ri = x.clone(), r.clone()\n"
        "assert sgl_kernel.fused_add_rmsnorm(xi, ri, norm.weight.data, 1e-5) is None\n"
        "plain = sgl_kernel.rmsnorm(x, norm.weight.data, 1e-5)\n"
        "gate = torch.randn(5, 128); out = torch.empty(5, 64)\n"
        "sgl_kernel.silu_and_mul(gate, out)\n"
        "print(json.dumps({\n"
        "  'fused_out': (xi - ref_out).abs().max().item(), 'fused_residual': (ri - ref_res).abs().max().item(),\n"
        "  'rmsnorm': (plain - norm.forward_native(x.clone())).abs().max().item(),\n"
        "  'silu_and_mul': (out - SiluAndMul().forward_native(gate)).abs().max().item(),\n"
        "  'amx_probe': hasattr(torch.ops.sgl_kernel, 'convert_weight_packed'),\n"
        "  'pdl': sgl_kernel.utils.is_arch_support_pdl()}))\n"
    )
    for key in ("fused_out", "fused_residual", "rmsnorm", "silu_and_mul"):
        assert out[key] < 1e-5, (key, out[key])
    assert out["amx_probe"] is False, "an op named convert_weight_packed turns on SGLang's AMX CPU branches"
    assert out["pdl"] is False


def test_sitecustomize_patches_the_jit_kernels():
    out = _run(
        "import json, torch\n"
        "import sglang.kernels.ops.speculative.tree as tree\n"
        "import sglang.kernels.ops.speculative.reconstruct_tree as reconstruct\n"
        "import sglang.kernels.ops.speculative.verify_sampling as vs\n"
        "import sglang.srt.mem_cache.memory_pool as pool\n"
        "import sglang.srt.layers.dual_gemm as dual\n"
        "print(json.dumps({\n"
        "  'verify': tree.verify_tree_greedy.__module__,\n"
        "  'reconstruct': reconstruct.reconstruct_indices_from_tree_mask.__module__,\n"
        "  'sampling': vs.tree_speculative_sampling_target_only.__module__,\n"
        "  'store_cache': pool.can_use_store_cache(256, 256),\n"
        "  'dual_gemm': dual.DualGemm._select_mode(None, None, 64)}))\n"
    )
    assert out["verify"] == out["reconstruct"] == "_lookahead_torch_tree_ops.speculative"
    assert out["sampling"] == "_lookahead_torch_tree_ops.sampling"
    assert out["store_cache"] is False and out["dual_gemm"] is None


def test_flashinfer_renorms_keep_the_top_of_each_row():
    out = _run(
        "import json, torch\n"
        "from flashinfer.sampling import top_k_renorm_probs, top_p_renorm_probs\n"
        "p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])\n"
        "k = top_k_renorm_probs(p, torch.tensor([2, 1]))\n"
        "q = top_p_renorm_probs(p, torch.tensor([0.7, 0.5]))\n"
        "print(json.dumps({'k': k.tolist(), 'p': q.tolist()}))\n"
    )
    assert out["k"][0] == pytest.approx([0.625, 0.375, 0, 0]) and out["k"][1] == pytest.approx([0, 0, 0, 1])
    assert out["p"][0] == pytest.approx([0.625, 0.375, 0, 0]) and out["p"][1] == pytest.approx([0, 0, 3 / 7, 4 / 7])
