"""LOOKAHEAD's rules at start-up: what its options require of the rest of
``ServerArgs``, applied during ``ServerArgs.resolve_once()`` in the launching
process, before anything is spawned.

LOOKAHEAD verifies as NGRAM does, so it takes NGRAM's argument rules
(``_handle_ngram`` in SGLang's ``arg_groups/speculative_hook.py``), which
SGLang applies only to ``is_ngram()``; the spec algorithm registered in
``lookahead.plugin`` calls ``validate_lookahead_server_args`` and
``handle_lookahead_server_args`` as its ``validate_server_args`` and
``handle_server_args`` callbacks. Errors are ``ValueError`` naming the flag.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from lookahead.plugin.share import check_server_args as check_share_server_args
from lookahead.plugin.server_args import (
    _SUPPORTED_DEVICES,
    DEFAULT_NUM_DRAFT_TOKENS,
    get_lookahead_args,
)

logger = logging.getLogger(__name__)



def validate_lookahead_server_args(server_args: Any) -> None:
    """``validate_server_args`` callback of the LOOKAHEAD spec algorithm.

    Checks LOOKAHEAD's own options, each on its own (an unset
    --speculative-num-draft-tokens counts as the default). ``server_args`` is
    the write-recording stand-in that SGLang passes to plugin callbacks; reads
    go through the resolution so far. Combinations are checked in
    ``handle_lookahead_server_args``, once the defaults are filled in.
    """
    get_lookahead_args(server_args)


def _check_path(path: str) -> str:
    """Absolute form of ``--speculative-lookahead-path``, checked so that the
    load at start-up and the saves cannot fail on the path itself."""
    flag = "--speculative-lookahead-path"
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if os.path.exists(path):
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {path!r} exists but is not a regular file")
        if not os.access(path, os.R_OK):
            raise ValueError(f"{flag} {path!r} is not readable")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise ValueError(
            f"{flag}: directory {parent!r} does not exist (the trie is saved "
            "there)"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(
            f"{flag}: directory {parent!r} is not writable (the trie is saved "
            "there)"
        )
    return path


def handle_lookahead_server_args(server_args: Any) -> None:
    """``handle_server_args`` of the LOOKAHEAD spec algorithm.

    Mirrors sglang's ``_handle_ngram`` (arg_groups/speculative_hook.py), since
    LOOKAHEAD verifies like NGRAM: a tree of ``speculative_num_draft_tokens``
    nodes including the root, one TARGET_VERIFY forward, no draft model.
    ``server_args`` is SGLang's stand-in for plugin callbacks: it reads through
    the resolution so far and turns field assignments into declarations.
    Raises ``ValueError`` for a bad combination.
    """
    sa = server_args

    if sa.device not in _SUPPORTED_DEVICES:
        raise ValueError(
            f"LOOKAHEAD speculative decoding supports devices {_SUPPORTED_DEVICES}, "
            f"got --device {sa.device!r}"
        )
    if sa.speculative_draft_model_path is not None:
        raise ValueError(
            "LOOKAHEAD drafts from a host-side trie and uses no draft model; "
            "remove --speculative-draft-model-path"
        )

    if sa.speculative_num_draft_tokens is None:
        sa.speculative_num_draft_tokens = DEFAULT_NUM_DRAFT_TOKENS
        logger.warning(
            "speculative_num_draft_tokens is set to %d by default for LOOKAHEAD "
            "(the verify width per request, including the last accepted token). "
            "You can override this by explicitly setting "
            "--speculative-num-draft-tokens.",
            DEFAULT_NUM_DRAFT_TOKENS,
        )
    args = get_lookahead_args(sa)  # raises ValueError on an out-of-range value
    check_share_server_args(sa, args.share)  # --speculative-lookahead-share: the client, no TP
    if args.path is not None:
        path = _check_path(args.path)
        if path != args.path:
            sa.speculative_lookahead_path = path  # absolute: children may chdir
    if args.corpus:
        missing = [p for p in args.corpus if not os.path.exists(p)]
        if missing:
            raise ValueError(f"--speculative-lookahead-corpus: no such file or directory: {', '.join(missing)}")
        absolute = [os.path.abspath(p) for p in args.corpus]
        if absolute != list(args.corpus):
            sa.speculative_lookahead_corpus = absolute  # children may chdir
    if args.num_draft_tokens == 1:
        logger.warning(
            "--speculative-num-draft-tokens 1 leaves no room for draft tokens "
            "(the width includes the last accepted token): LOOKAHEAD will "
            "verify one token per step, like plain decoding."
        )
    if args.speculation_bound == 0:
        logger.warning(
            "--speculative-lookahead-max-batch-size 0: LOOKAHEAD never "
            "speculates and every step decodes one token."
        )

    disable_overlap_on_cpu(sa)

    # Same as NGRAM: the mixed prefill+decode step has no verified resume path.
    if sa.enable_mixed_chunk:
        logger.warning(
            "The mixed chunked prefill is disabled because of using LOOKAHEAD "
            "speculative decoding."
        )
    sa.enable_mixed_chunk = False

    # speculative_eagle_topk / speculative_num_steps only size things for a
    # draft-model-free tree (KV reserved per decode step is
    # max(num_steps * topk, num_draft_tokens); topk > 1 marks a real tree for
    # the paged-attention check below). A chain is topk 1 with
    # num_draft_tokens == num_steps + 1 (SGLang's topk-1 invariant); a tree may
    # branch up to num_draft_tokens - 1 ways at its root, and keeps
    # num_steps * topk <= num_draft_tokens like NGRAM's num_draft_tokens // topk.
    n = args.num_draft_tokens
    if args.one_branch or n <= 2:
        topk, num_steps = 1, max(1, n - 1)
    else:
        topk = n - 1
        num_steps = max(1, n // topk)
    for field, value in (
        ("speculative_eagle_topk", topk),
        ("speculative_num_steps", num_steps),
    ):
        given = getattr(sa, field)
        if given is not None and given != value:
            logger.warning(
                "--%s %s is ignored by LOOKAHEAD (derived from "
                "--speculative-num-draft-tokens and --speculative-one-branch: %s).",
                field.replace("_", "-"),
                given,
                value,
            )
        setattr(sa, field, value)

    # Same rule as NGRAM: tree verification with page_size > 1 needs flashinfer.
    if topk > 1 and (sa.page_size or 1) > 1 and sa.attention_backend != "flashinfer":
        raise ValueError(
            f"LOOKAHEAD tree drafts (up to {topk} branches) with page_size "
            f"({sa.page_size}) > 1 are only supported by the 'flashinfer' "
            "attention backend. Use --page-size 1, --attention-backend "
            "flashinfer, or --speculative-one-branch."
        )
    # On CPU, SGLang's speculative KV allocation for pages
    # (alloc_for_spec_decode -> get_last_loc) launches a Triton kernel, and
    # Triton has no CPU driver: the scheduler would die at the first decode.
    if sa.device == "cpu" and (sa.page_size or 1) > 1:
        raise ValueError(
            f"LOOKAHEAD on CPU needs --page-size 1 (got {sa.page_size}): "
            "SGLang's speculative KV allocation with pages runs a Triton "
            "kernel, which has no CPU driver."
        )

    from sglang.srt.runtime_context import attn_dp_enabled_of

    if attn_dp_enabled_of(sa):
        raise ValueError(
            "LOOKAHEAD speculative decoding does not support dp attention "
            "(neither does NGRAM)."
        )

    # torch_native cannot run TARGET_VERIFY (no tree mask support).
    if args.speculation_bound > 0:
        from sglang.srt.arg_groups.model_override_base import attention_backends_of

        prefill_backend, decode_backend = attention_backends_of(sa)
        verify_backend = (
            decode_backend if sa.speculative_attention_mode == "decode" else prefill_backend
        )
        if verify_backend == "torch_native":
            hint = ""
            if sa.device == "cpu":
                hint = (
                    " On CPU use --attention-backend intel_amx; sglang replaces "
                    "it with torch_native when the machine lacks AMX support "
                    "(torch.cpu._is_amx_tile_supported() and "
                    "torch.ops.sgl_kernel.convert_weight_packed)."
                )
            raise ValueError(
                "LOOKAHEAD verifies drafts in a TARGET_VERIFY forward, which the "
                "torch_native attention backend does not support. Use another "
                "--attention-backend, or --speculative-lookahead-max-batch-size 0."
                + hint
            )

    logger.info(
        "LOOKAHEAD: num_draft_tokens=%d (%d draft token%s), %s, max_batch_size=%s, "
        "max_match_len=%s, memory_mb=%s, path=%s, isolation=%s",
        n,
        n - 1,
        "" if n == 2 else "s",
        "one branch" if args.one_branch else "tree",
        args.max_batch_size,
        args.max_match_len if args.max_match_len is not None else "default",
        args.memory_mb if args.memory_mb is not None else "default",
        sa.speculative_lookahead_path,
        args.isolation,
    )


def disable_overlap_on_cpu(sa: Any) -> None:
    """SGLang's rule for its own speculative algorithms
    (``_disable_overlap_schedule_for_cpu``): no overlap scheduling on CPU,
    where torch streams are stubs. Elsewhere LOOKAHEAD overlaps as NGRAM does.
    Tests of the overlap path replace this function."""
    if sa.device == "cpu" and not sa.disable_overlap_schedule:
        sa.disable_overlap_schedule = True
        logger.warning("Overlap schedule is not implemented for speculative decoding on CPU.")
