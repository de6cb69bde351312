"""Make sglang take its AMX CPU path on any x86 CPU (testing only).

sglang picks its CPU kernels with ``cpu_has_amx_support()``, which requires
``torch.cpu._is_amx_tile_supported()``, read ONCE when
``sglang.srt.utils.common`` is imported. Without it, ``--attention-backend
intel_amx`` silently falls back to ``torch_native``, which cannot run
speculative TARGET_VERIFY batches, and every layer takes a different code path
than on an AMX server.

With ``LOOKAHEAD_CPU_FORCE_AMX=1``, this file (imported by Python at start-up
because its directory is on ``PYTHONPATH``) installs an import hook that sets
``sglang.srt.utils.common.is_amx_tile_supported = True`` right after that
module executes, so every sglang process (launch_server, Engine, schedulers)
sees one consistent answer. Kernels then come from the pure-torch
``sgl_kernel`` next to this file. Any other ``sitecustomize`` on ``sys.path``
still runs afterwards.

With ``LOOKAHEAD_CPU_TORCH_SPEC_GATHER=1`` as well, the same hook replaces
``sglang.kernels.ops.speculative.gather_spec_extras.gather_spec_extras``
(a Triton row gather that EAGLE's overlap scheduling runs, and which has no
CPU driver) with its pure-torch equivalent, before ``overlap_utils`` binds it.
SGLang turns overlap off for EAGLE on CPU; the tests that lift that guard to
exercise the overlap path of LOOKAHEAD + EAGLE set this variable.

With ``LOOKAHEAD_CPU_SAMPLED_VERIFY=1`` (``cpu_env`` sets it), SGLang's own
verify (``eagle_utils.eagle_sample``: NGRAM, EAGLE) samples on CPU as it does
on CUDA. Stock SGLang 0.5.23 verifies every CPU batch greedily
(``_verify_uses_greedy`` is true for ``is_cpu``, and its sampling kernels
resolve to None there), so NGRAM samples a request's first token at prefill
and decodes every later one by argmax, whatever the temperature: no fair
anchor for sampled traffic. The hook lifts the CPU clause and binds the
pure-torch stand-ins of ``tree_speculative_sampling_target_only`` and the
top-k / top-p renormalisations (``sgl_kernel/sampling.py``, tested against
the target distribution) where the CUDA kernels would be.

In the same CPU environment, ``release_memory_occupation`` and
``resume_memory_occupation`` (what RL frameworks call around training) run
as they do on a GPU without ``torch_memory_saver``: the scheduler's weight
updater ends them with ``torch.get_device_module().synchronize()``, which is
``torch.cuda``'s on a CPU-only torch and raises, so the hook gives that one
module a ``torch`` whose default device module is ``torch.cpu`` (nothing to
wait for on the host). Everything else the calls do (flush the KV cache,
stash and restore the model's buffers) is SGLang's own.
"""

from __future__ import annotations

import os
import sys

# cpu/, the folder above this one, holds import_patching.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import import_patching  # noqa: E402

_TARGET = "sglang.srt.utils.common"
_ENV = "LOOKAHEAD_CPU_FORCE_AMX"
_GATHER_TARGET = "sglang.kernels.ops.speculative.gather_spec_extras"
_GATHER_ENV = "LOOKAHEAD_CPU_TORCH_SPEC_GATHER"
_SAMPLED_ENV = "LOOKAHEAD_CPU_SAMPLED_VERIFY"
_VERIFY_SAMPLING = "sglang.kernels.ops.speculative.verify_sampling"
_RENORM = "sglang.kernels.ops.sampling.renorm"
_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
_WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater"
_MARKER = "lookahead_force_amx"


def _torch_gather_spec_extras(indices, topk_p_buf, topk_index_buf, output_tokens_buf, hidden_states_buf):
    """``gather_spec_extras`` without Triton: the same rows of every buffer."""
    idx = indices.long()
    hidden = hidden_states_buf[idx] if hidden_states_buf is not None else None
    return topk_p_buf[idx], topk_index_buf[idx], output_tokens_buf[idx], hidden


def _force_amx(module) -> None:
    module.is_amx_tile_supported = True


def _torch_gather(module) -> None:
    module.gather_spec_extras = _torch_gather_spec_extras


def _sampling_kernel(module) -> None:
    from sgl_kernel.sampling import tree_speculative_sampling_target_only

    module.tree_speculative_sampling_target_only = tree_speculative_sampling_target_only


def _renorm(module) -> None:
    from sgl_kernel.sampling import top_k_renorm_prob, top_p_renorm_prob

    module.top_k_renorm_prob, module.top_p_renorm_prob = top_k_renorm_prob, top_p_renorm_prob


def _sampled_verify(module) -> None:
    uses_greedy = module._verify_uses_greedy

    def verify_uses_greedy(*, is_cpu, **kwargs):
        # As on CUDA: argmax only for all-greedy batches.
        return uses_greedy(is_cpu=False, **kwargs)

    module._verify_uses_greedy = verify_uses_greedy


class _HostTorch:
    """``torch``, but with ``torch.cpu`` as the default device module."""

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    @staticmethod
    def get_device_module(device=None):
        import torch

        return torch.cpu if device is None else torch.get_device_module(device)


def _host_synchronize(module) -> None:
    import torch

    if not torch.cuda.is_available():
        module.torch = _HostTorch()


def install() -> bool:
    """Install the hook in this process (idempotent). Returns False when
    ``_TARGET`` was already imported, i.e. too late to be consistent."""
    patches = {_TARGET: _force_amx, _WEIGHT_UPDATER: _host_synchronize}
    if os.environ.get(_GATHER_ENV) == "1":
        patches[_GATHER_TARGET] = _torch_gather
    if os.environ.get(_SAMPLED_ENV) == "1":
        patches.update({_VERIFY_SAMPLING: _sampling_kernel, _RENORM: _renorm, _EAGLE_UTILS: _sampled_verify})
    return import_patching.install(patches, _MARKER)


if __name__ == "sitecustomize":
    if os.environ.get(_ENV) == "1":
        install()
    import_patching.chain_next_sitecustomize(os.path.dirname(__file__))
