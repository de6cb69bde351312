"""What a user sets: ``LookaheadConfig``, and the one check of each option.

The cache's options (``LookaheadConfig``) and the server's flags
(``lookahead.plugin.server_args``) overlap: ``--speculative-lookahead-max-match-len``
is ``max_match_len``, ``--speculative-lookahead-memory-mb`` is
``max_memory_bytes`` in MiB.  Each option's range is checked by one function
here, which the config, the server's resolved options (``LookaheadArgs``)
and its command-line parsers all call, so the three cannot drift apart and
every error names what the caller calls the option (a field or a flag).

How drafts rank what they find (walk lengths, weights) is not here: those
are tuned on the replay, not set by users (``lookahead.trie._tuning``).

Nothing here imports SGLang or the native trie: the launcher checks its
flags before any trie exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Any

from lookahead.trie.host import memory_short_of

# The smallest memory budget: one history of 1,024 tokens with the default orders.
MIN_MEMORY_BYTES = 64 << 10

# --speculative-lookahead-isolation: whose text a request's drafts may come
# from (see lookahead.plugin.request_feed, which applies it).
ISOLATION_MODES = (
    "salt",  # the requests with its cache_salt, else its extra_key (which carries the
             # LoRA adapter too), else those with neither: the keys of SGLang's prefix cache
    "none",  # every request: one shared history
    "request",  # none: only its own prompt and output
)
DEFAULT_ISOLATION = "salt"


def option_error(name: str, problem: str) -> ValueError:
    """"max_walk must be ...", or, where the caller names the option itself
    (argparse's "argument --flag: ..."), just "must be ..."."""
    return ValueError(f"{name} {problem}" if name else problem)


def check_int(value: Any, minimum: int, name: str = "") -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise option_error(name, f"must be an integer >= {minimum}, got {value!r}")
    return value


def check_number(value: Any, minimum: float, name: str = "", *, above: bool = False,
                 finite: bool = False) -> float:
    """``value`` if it is a real number (not a bool) of at least ``minimum``
    (more than it, with ``above``); NaN never passes, nor infinity with
    ``finite``."""
    ok = isinstance(value, Real) and not isinstance(value, bool)
    ok = ok and (value > minimum if above else value >= minimum) and not (finite and math.isinf(value))
    if not ok:
        bound = f"> {minimum}" if above else f">= {minimum}"
        raise option_error(name, f"must be a {'finite ' if finite else ''}number {bound}, got {value!r}")
    return value


def check_memory(value: Any, name: str = "", unit: str = "bytes") -> int:
    """A memory budget of ``value`` ``unit`` (bytes or MiB): a positive
    integer, at least 64 KiB, and no more than this machine has (allocating
    more could succeed, by overcommit, and get the process killed when the
    history is first written)."""
    shift = {"bytes": 0, "MiB": 20}[unit]
    check_int(value, 1, name)
    if value << shift < MIN_MEMORY_BYTES:
        raise option_error(name, f"must be at least 64 KiB, got {value!r} {unit}")
    physical = memory_short_of(value << shift)
    if physical:
        raise option_error(name, f"{value} is more than this machine's memory ({physical >> shift:,} {unit})")
    return value


def check_isolation(mode: Any, name: str = "isolation") -> str:
    if mode not in ISOLATION_MODES:
        raise option_error(name, f"must be one of {', '.join(ISOLATION_MODES)}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class LookaheadConfig:
    """The cache's options; the defaults are the ones measured best (docs/benchmarks.md).

    ``max_memory_bytes`` bounds the shared histories (all scopes together,
    their index included); each live request's own store comes on top and
    is freed when it ends.  ``max_match_len`` is how far back a draft reads
    the context: longer matches are more specific but cost more per step.
    ``orders`` are the n-gram lengths indexed (each costs 6 bytes per token
    held): matching starts from the longest that occurs.  Sharing: a
    request's output enters its scope's history every ``flush_tokens``
    tokens and when it ends, behind the last ``share_prompt_tail`` tokens of
    its prompt (so the start of an answer is found by the end of its
    question), or more where the prompt's end repeats earlier in the prompt:
    ``share_tail_margin`` tokens past the longest such suffix, at most
    ``max_match_len`` (an agent's prompt ends in the same boilerplate after
    every tool output, which tells nothing of which turn it is; 0: off);
    ``share_outputs=False`` shares nothing.
    ``remember_answers``: how many prompts' answers (their first 64 tokens,
    per scope) are kept so that the same prompt served again drafts its
    earlier answer from its first token (``lookahead.trie.answers``; 0: off).
    ``corpus_memory_bytes`` bounds the external corpora (``lookahead.trie.corpora``),
    apart from the histories; nothing is allocated until a corpus is added.
    """

    max_memory_bytes: int = 256 << 20
    max_match_len: int = 64
    orders: tuple = (1, 2, 4, 8)
    share_outputs: bool = True
    share_prompt_tail: int = 24
    share_tail_margin: int = 16
    flush_tokens: int = 128
    remember_answers: int = 8192
    vocab_size: int | None = None  # reject ids >= vocab_size when set
    background: bool = True  # False: apply inserts on the caller's thread (debugging)
    corpus_memory_bytes: int = 512 << 20

    def __post_init__(self):
        check_memory(self.max_memory_bytes, "max_memory_bytes")
        check_int(self.max_match_len, 1, "max_match_len")
        orders = tuple(self.orders)
        if not orders or any(not isinstance(o, int) or o < 1 for o in orders) or list(orders) != sorted(set(orders)):
            raise ValueError(f"orders must be increasing positive integers, got {self.orders!r}")
        if len(orders) > 8:
            raise ValueError(f"at most 8 n-gram orders are supported, got {len(orders)}")
        object.__setattr__(self, "orders", orders)
        check_int(self.share_prompt_tail, 0, "share_prompt_tail")
        check_int(self.share_tail_margin, 0, "share_tail_margin")
        check_int(self.flush_tokens, 1, "flush_tokens")
        check_int(self.remember_answers, 0, "remember_answers")
        check_memory(self.corpus_memory_bytes, "corpus_memory_bytes")
        if self.vocab_size is not None:
            check_int(self.vocab_size, 1, "vocab_size")

    @property
    def shared_capacity(self) -> int:
        """Tokens one scope's history holds at most (all of them, when there
        is one scope): the largest power of two whose stream and index (4
        bytes per order for chains, 2 for hash heads) fit."""
        per_token = 4 + 6 * len(self.orders)
        tokens = max(16, self.max_memory_bytes // per_token)
        return 1 << (tokens.bit_length() - 1)
