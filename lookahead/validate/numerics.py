"""Telling a kernel's rounding from a wrong answer, for 16-bit models on a GPU.

In float32 (the CPU tests, the tiny model on a GPU) LOOKAHEAD's answers
equal plain decoding's token for token, and ``feature_matrix.differences``
compares them so. A bfloat16 or float16 model on a GPU is not bit-stable
across kernels: a verify forward multiplies ``bs x N`` rows where a decode
step multiplies ``bs``, its attention runs the extend kernel, and the logits
come out of a 16-bit GEMM (a logit near 20 has a bfloat16 step of 0.125).
Plain decoding itself moves that much between batch sizes. So where the
reference's two best tokens are that close, either path may take either, and
the answers then go on as two different texts, both correct.

``compare`` therefore accepts a token that differs from the reference's only
where the reference ranked it second at most ``tie_margin`` below its own
choice (its top logprobs, asked for alongside each answer:
``feature_matrix.reference_with_margins``), compares nothing of that answer
after it, and compares logprobs within ``logprob_tolerance``. Anything else,
a token the reference did not rank second, or ranked far below, is a
difference. Every accepted divergence is listed with its margin, so the
report shows how close each call was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

# Per dtype of the model's weights: (logprob tolerance, tie margin), in nats.
# bfloat16 logits carry 8 significant bits (a step of 0.125 at 16-32), float16
# 11 (0.0156); two kernels may round a logit a step apart, and a logprob moves
# with its logit and the log-sum-exp both.
HALF_PRECISION = {"bfloat16": (0.25, 0.5), "float16": (0.05, 0.1)}


@dataclass
class Comparison:
    differences: list = field(default_factory=list)
    near_ties: list = field(default_factory=list)  # (where, position, margin)
    max_logprob_deviation: float = 0.0


def compare(expected, got, margins, logprob_tolerance: float, tie_margin: float,
            where: str = "answer", into: Optional[Comparison] = None) -> Comparison:
    """``got`` against the reference's ``expected``, with ``margins`` laid out
    as ``expected`` is (``None`` where the reference kept none)."""
    out = into if into is not None else Comparison()
    if isinstance(expected, dict) and "output_ids" in expected:
        _answer(expected, got, margins, logprob_tolerance, tie_margin, where, out)
    elif _is_token_records(expected):
        _token_records(expected, got, logprob_tolerance, tie_margin, where, out)
    elif isinstance(expected, str) and _is_token_records(margins):
        _text(expected, got, margins, tie_margin, where, out)
    elif (isinstance(expected, list) and len(expected) == 2 and isinstance(expected[0], str)
          and _is_token_records(margins)):
        # An OpenAI completion, [text, token logprobs]: the text decides;
        # the logprobs count up to where it parted.
        cut = _text(expected[0], got[0], margins, tie_margin, where, out)
        n = len(margins) if cut is None else cut
        _values(expected[1][:n], got[1][:n] if isinstance(got[1], list) else got[1], logprob_tolerance, where, out)
    elif isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            out.differences.append(f"{where}: keys differ")
        else:
            for k in expected:
                compare(expected[k], got[k], _at(margins, k), logprob_tolerance, tie_margin, f"{where}.{k}", out)
    elif isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            out.differences.append(f"{where}: {str(expected)[:200]} != {str(got)[:200]}")
        else:
            for i, (e, g) in enumerate(zip(expected, got)):
                compare(e, g, _at(margins, i), logprob_tolerance, tie_margin, f"{where}[{i}]", out)
    else:
        _values(expected, got, logprob_tolerance, where, out)
    return out


def _at(margins, key):
    try:
        return margins[key]
    except (KeyError, IndexError, TypeError):
        return None


def _values(expected, got, tolerance: float, where: str, out: Comparison) -> None:
    if isinstance(expected, float) or isinstance(got, float):
        if expected is None or got is None:
            out.differences.append(f"{where}: {expected!r} != {got!r}")
            return
        deviation = abs(expected - got)
        out.max_logprob_deviation = max(out.max_logprob_deviation, deviation)
        if not math.isclose(expected, got, abs_tol=tolerance):
            out.differences.append(f"{where}: {expected!r} != {got!r}")
    elif isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)) and len(expected) == len(got):
        for i, (e, g) in enumerate(zip(expected, got)):
            _values(e, g, tolerance, f"{where}[{i}]", out)
    elif expected != got:
        out.differences.append(f"{where}: {str(expected)[:200]} != {str(got)[:200]}")


def _margin_at(tops, ours, theirs) -> Optional[float]:
    """How far below ``ours`` the reference ranked ``theirs`` (``tops``: its
    top logprobs there, as ``(logprob, token, ...)`` or ``(token, logprob)``),
    or None when ``theirs`` is not among them."""
    if not tops:
        return None
    ranked = dict(_entry(x)[::-1] for x in tops)
    if ours not in ranked or theirs not in ranked:
        return None
    return ranked[ours] - ranked[theirs]


def _diverge(where: str, position: int, margin: Optional[float], tie_margin: float, out: Comparison,
             ours, theirs) -> None:
    if margin is not None and 0.0 <= margin <= tie_margin:
        out.near_ties.append((where, position, margin))
    else:
        ranked = "not in the reference's top tokens" if margin is None else f"{margin:.3f} below"
        out.differences.append(f"{where}: token {position} is {theirs!r}, the reference's {ours!r} ({ranked})")


def _answer(expected: dict, got: dict, margins, tolerance: float, tie_margin: float, where: str,
            out: Comparison) -> None:
    """A /generate answer: its tokens up to the first divergence, which must
    be a near tie; then nothing more (the two texts have parted)."""
    if not isinstance(got, dict) or "output_ids" not in got:
        out.differences.append(f"{where}: not an answer: {str(got)[:200]}")
        return
    ours, theirs = expected["output_ids"] or [], got["output_ids"] or []
    cut = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if cut is None and len(ours) != len(theirs):
        # One stopped where the other went on: the stop token (EOS) itself was the call.
        cut = min(len(ours), len(theirs))
    tops = _at(margins, "output_top_logprobs") or expected.get("output_top_logprobs")
    if cut is not None:
        if cut < len(ours) and cut < len(theirs):
            _diverge(where, cut, _margin_at(_at(tops, cut), ours[cut], theirs[cut]), tie_margin, out,
                     ours[cut], theirs[cut])
        else:
            out.differences.append(f"{where}: {len(theirs)} tokens, the reference {len(ours)}, "
                                   f"identical up to token {cut}")
    n = len(ours) if cut is None else cut
    for key in expected:
        if key == "output_ids":
            continue
        e, g = expected[key], got.get(key)
        if key == "output_top_logprobs" and isinstance(e, list) and isinstance(g, list):
            for i, (te, tg) in enumerate(zip(e[:n], g[:n])):
                _top_list(te, tg, tolerance, tie_margin, f"{where}.{key}[{i}]", out)
            if len(g) < n:
                out.differences.append(f"{where}.{key}: {len(g)} positions, {n} expected")
        elif key.startswith("output_") and isinstance(e, list):
            _values(e[:n], g[:n] if isinstance(g, list) else g, tolerance, f"{where}.{key}", out)
        elif key in ("text", "finish_reason", "completion_tokens") and cut is not None:
            continue  # the texts parted at a near tie: their ends differ
        else:
            _values(e, g, tolerance, f"{where}.{key}", out)


def _entry(entry) -> tuple:
    """(logprob, token) of a top-logprob entry: SGLang's ``[logprob, id, text]``
    or OpenAI's ``(token, logprob)``."""
    return (entry[0], entry[1]) if isinstance(entry[0], float) else (entry[1], entry[0])


def _top_list(expected, got, tolerance: float, tie_margin: float, where: str, out: Comparison) -> None:
    """One position's top logprobs: the same values, rank by rank; a rank may
    hold another token only where the reference's own logprobs of the two
    are a near tie (or at the last rank, whose runner-up is unseen)."""
    if not isinstance(got, (list, tuple)) or len(got) != len(expected):
        out.differences.append(f"{where}: {str(expected)[:200]} != {str(got)[:200]}")
        return
    ranked = dict(_entry(x)[::-1] for x in expected)
    for k, (e, g) in enumerate(zip(expected, got)):
        (lp_e, tok_e), (lp_g, tok_g) = _entry(e), _entry(g)
        _values(lp_e, lp_g, tolerance, f"{where}[{k}]", out)
        if tok_e != tok_g:
            close = tok_g in ranked and abs(ranked[tok_g] - lp_e) <= tie_margin
            if not close and k != len(expected) - 1:
                out.differences.append(f"{where}[{k}]: token {tok_g!r} where the reference has {tok_e!r}")


def _is_token_records(value) -> bool:
    """(token, logprob, top logprobs) triples: an OpenAI answer's tokens."""
    return (isinstance(value, (list, tuple)) and bool(value)
            and all(isinstance(t, (list, tuple)) and len(t) == 3 and isinstance(t[0], str) for t in value))


def _token_records(expected, got, tolerance: float, tie_margin: float, where: str, out: Comparison) -> None:
    if not _is_token_records(got):
        out.differences.append(f"{where}: {str(got)[:200]}")
        return
    for i, (e, g) in enumerate(zip(expected, got)):
        if e[0] != g[0]:
            _diverge(where, i, _margin_at(e[2], e[0], g[0]), tie_margin, out, e[0], g[0])
            return
        _values(e[1], g[1], tolerance, f"{where}[{i}]", out)
        _top_list(e[2], g[2], tolerance, tie_margin, f"{where}[{i}].top", out)
    if len(expected) != len(got):
        out.differences.append(f"{where}: {len(got)} tokens, the reference {len(expected)}")


def _text(expected: str, got, tokens, tie_margin: float, where: str, out: Comparison) -> Optional[int]:
    """Text the reference wrote as ``tokens`` against ``got``: where they part,
    ``got`` must go on with one of the reference's runners-up at that token.
    Returns the token where they parted, or None."""
    if not isinstance(got, str):
        out.differences.append(f"{where}: {str(got)[:200]}")
        return None
    if expected == got:
        return None
    start = 0
    for i, (token, _, tops) in enumerate(tokens):
        if got.startswith(expected[: start + len(token)]) and start + len(token) <= len(got):
            start += len(token)
            continue
        rest = got[start:]
        alternatives = [t for t, _ in tops if t != token and t and rest.startswith(t)]
        margin = min((m for m in (_margin_at(tops, token, t) for t in alternatives) if m is not None), default=None)
        _diverge(where, i, margin, tie_margin, out, token, rest[:12])
        return i
    out.differences.append(f"{where}: {expected[:200]!r} != {got[:200]!r}")
    return len(tokens)


# ---------------------------------------------------------------------------
# Every emitted token, teacher-forced through one plain prefill.
#
# ``compare`` above checks where two answers first part. A verifier that is
# lossy only a little (one that accepts a drafted token whenever it is within
# a fraction of a nat of the best) would pass that check wherever its first
# lossy acceptance happens to fall at a near tie. The check below reads no
# second decoding: it feeds each answer, prompt and output together, through
# one plain forward of the target (a prefill, which shares no kernel path with
# a verify) and requires of every emitted token that it be the forward's
# argmax there, or within ``TEACHER_FORCED_MARGIN`` of it. A lossless
# verifier in bfloat16 emits only argmaxes and near ties (two forwards round a
# logit at most a bfloat16 step or two apart); a verifier that accepts the
# runner-up at larger gaps emits tokens beyond the margin wherever such a gap
# comes up. bfloat16 logits come in steps (1/16 nat at 8-16, 1/8 at 16-32), so
# gaps fall on a grid: 0.25, then 0.3125 and 0.375; a verifier lossy only up to
# 0.3 nats shows beyond 0.25 at the rare 0.28125 alone.

TEACHER_FORCED_MARGIN = 0.25  # nats, bfloat16
# Gaps are float32 differences of logprobs (bfloat16 logits less one log-sum-exp):
# a gap on the bfloat16 grid may come out a few 1e-8 above it (0.25000006).
GAP_TOLERANCE = 1e-4


@dataclass
class TeacherForced:
    """Counts over every emitted token checked."""

    requests: int = 0
    tokens: int = 0
    argmax: int = 0  # the plain forward's own best token
    near: list = field(default_factory=list)  # (request, position, gap) within the margin
    violations: list = field(default_factory=list)  # (request, position, gap or None) beyond it

    @property
    def passed(self) -> bool:
        return self.tokens > 0 and not self.violations

    def summary(self) -> str:
        gaps = [g for _, _, g in self.near]
        return (f"{self.requests} requests, {self.tokens} emitted tokens: {self.argmax} the plain forward's argmax, "
                f"{len(self.near)} within {TEACHER_FORCED_MARGIN} nats of it"
                + (f" (largest gap {max(gaps):.3f})" if gaps else "")
                + f", {len(self.violations)} beyond")


def token_gaps(input_token_logprobs, input_top_logprobs, output_ids) -> list:
    """Per emitted token: (gap to the forward's best logprob, the best token,
    the runner-up token, its gap) from a teacher-forced prefill's input
    logprobs; the last ``len(output_ids)`` positions score the output."""
    n = len(output_ids)
    if n == 0:
        return []
    lps, tops = list(input_token_logprobs)[-n:], list(input_top_logprobs)[-n:]
    if len(lps) != n or len(tops) != n:
        raise ValueError(f"{len(lps)} scored positions for {n} output tokens")
    out = []
    for k, (tok, rec, top) in enumerate(zip(output_ids, lps, tops)):
        lp, scored = _entry(rec)
        if scored != tok:
            raise ValueError(f"position {k} scores token {scored}, the output has {tok}")
        ranked = sorted((_entry(x) for x in (top or [])), key=lambda e: -e[0])
        if not ranked:
            raise ValueError(f"position {k}: no top logprobs")
        best_lp, best = ranked[0]
        second = ranked[1] if len(ranked) > 1 else (None, None)
        out.append((max(0.0, best_lp - lp), best, second[1],
                    None if second[0] is None else best_lp - second[0]))
    return out


def check_teacher_forced(per_request: list, margin: float = TEACHER_FORCED_MARGIN,
                         into: Optional[TeacherForced] = None) -> TeacherForced:
    """``per_request``: one ``(output_ids, token_gaps(...))`` per request."""
    out = into if into is not None else TeacherForced()
    for r, (ids, gaps) in enumerate(per_request):
        out.requests += 1
        for k, (tok, (gap, best, _, _)) in enumerate(zip(ids, gaps)):
            out.tokens += 1
            if tok == best:
                out.argmax += 1
            elif gap <= margin + GAP_TOLERANCE:
                out.near.append((r, k, gap))
            else:
                out.violations.append((r, k, gap))
    return out


def lossy_output(output_ids, gaps, low: float = TEACHER_FORCED_MARGIN, high: float = 0.3) -> Optional[list]:
    """What a verifier that accepts the runner-up wherever it is less than
    ``high`` nats below the best would have emitted up to the first place it
    differs from a lossless one that it can be told apart from: ``output_ids``
    up to the first position whose best token was emitted and whose runner-up
    lies between ``low`` and ``high`` below it, then that runner-up. None when
    no position qualifies."""
    for k, (tok, (gap, best, second, second_gap)) in enumerate(zip(output_ids, gaps)):
        if tok == best and second is not None and second_gap is not None and low + GAP_TOLERANCE < second_gap < high:
            return list(output_ids[:k]) + [second]
    return None


def teacher_force(engine, prompt_ids: list, outputs: list, batch: int = 4) -> list:
    """``token_gaps`` of each ``outputs[i]`` after ``prompt_ids[i]``, from one
    plain forward of prompt + output per request (``engine``: an
    ``sgl.Engine`` serving the target without speculation)."""
    res = []
    for i in range(0, len(outputs), batch):
        ids = [list(p) + list(o) for p, o in zip(prompt_ids[i: i + batch], outputs[i: i + batch])]
        starts = [max(0, len(p) - 1) for p in prompt_ids[i: i + batch]]
        got = engine.generate(input_ids=ids, sampling_params={"temperature": 0.0, "max_new_tokens": 1},
                              return_logprob=True, logprob_start_len=starts, top_logprobs_num=2)
        for o, g in zip(outputs[i: i + batch], got):
            meta = g["meta_info"]
            res.append(token_gaps(meta["input_token_logprobs"], meta["input_top_logprobs"], o))
    return res
