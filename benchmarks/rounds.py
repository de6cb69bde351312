"""Rounds with rotated order, and ratios reported as median [min-max].

The CPU VMs these benchmarks run on drift by up to 2x within an hour, so one
engine run after another measures the machine as much as the decoding. Every
benchmark whose figures are published therefore runs ``rounds`` rounds, and
round ``r`` serves the engines in the order that starts at engine
``r mod n``: a drift then slows every engine in turn, not always the same one.
A ratio is computed within each round (both sides measured minutes apart) and
reported as the median over rounds, with the smallest and largest beside it.
The median is what a table bolds; never the best round.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Callable, Iterable, Sequence


def rotated(names: Sequence, r: int) -> list:
    """The engines' order in round ``r``: starting at ``names[r % n]``."""
    names = list(names)
    if not names:
        return []
    k = r % len(names)
    return names[k:] + names[:k]


def run_rounds(names: Sequence[str], rounds: int, serve_one: Callable[[str, int], dict],
               keep: Callable[[int, dict], None] | None = None, log: Callable[[str], None] = print,
               first: int = 0) -> list[dict]:
    """``rounds`` rounds of ``serve_one(name, round)`` over ``names`` in
    rotated order; returns one ``{name: result}`` per round (in ``names``'
    order, whatever the serving order was). ``keep(r, results)`` is called
    after each round (to write its JSON at once, so an interrupted run keeps
    the rounds it finished). ``first``: the index of the first round (a run
    resumed after ``first`` rounds keeps their rotation going)."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    out = []
    for r in range(first, first + rounds):
        order = rotated(names, r)
        log(f"round {r + 1}/{first + rounds}: {', '.join(order)}")
        got = {}
        for name in order:
            got[name] = serve_one(name, r)
        result = {name: got[name] for name in names}
        out.append(result)
        if keep is not None:
            keep(r, result)
    return out


def spread(values: Iterable[float]) -> dict:
    """{"median", "min", "max", "values"} of one figure over rounds."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def cell(s: dict, fmt: str = "{:.2f}", suffix: str = "x", bold: bool = True) -> str:
    """``**median** [min-max]`` for a markdown table (one round: the value alone)."""
    med = fmt.format(s["median"]) + suffix
    med = f"**{med}**" if bold else med
    if len(s["values"]) == 1:
        return med
    return f"{med} [{fmt.format(s['min'])}-{fmt.format(s['max'])}]"


def write_round(path: Path | str | None, r: int, data: dict) -> Path | None:
    """Write round ``r``'s JSON beside ``path`` (``out.json`` -> ``out.r0.json``)."""
    if not path:
        return None
    path = Path(path)
    target = path.with_name(f"{path.stem}.r{r}{path.suffix or '.json'}")
    target.write_text(json.dumps(data))
    return target
