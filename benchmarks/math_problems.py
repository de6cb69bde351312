"""Grade-school math word problems, written from templates: the prompts of
the rollout benchmark (RL rollouts sample many answers to such problems).

Two disjoint sets: ``tuning`` draws from the even templates with seeds
below 1000, ``report`` from the odd templates with seeds from 1000 up, so a
figure reported on one was never tuned on the other's problems or wording.
Nothing is downloaded.
"""

from __future__ import annotations

import random

NAMES = ("Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jonas", "Keira", "Liam",
         "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara")
ITEMS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "cards", "shells", "buttons")

TEMPLATES = (
    "{a} has {x} {item}. {b} gives {a} {y} more {item}, and then {a} gives away {z}. How many {item} does {a} have now?",
    "A box holds {x} {item}. {a} buys {y} boxes and uses {z} {item}. How many {item} are left?",
    "{a} reads {x} pages a day for {y} days, then {z} pages on the last day. How many pages did {a} read in all?",
    "{a} earns ${x} an hour and works {y} hours a week. How much does {a} earn in {z} weeks?",
    "A train travels {x} miles an hour for {y} hours, then {z} more miles. How far does it travel altogether?",
    "{a} had {x} {item} and shared them equally among {y} friends, keeping {z} for later. How many did each friend get?",
    "There are {x} students in a class. {y} of them walk to school and {z} ride bikes. The rest take the bus. "
    "How many take the bus?",
    "{a} saves ${x} each month. After {y} months, {a} spends ${z} on a gift. How much money is left?",
    "A garden has {x} rows of {y} plants. {z} plants die. How many plants are still alive?",
    "{a} bakes {x} trays of {y} cookies and eats {z} of them. How many cookies are left?",
    "{a} runs {x} laps of a {y}-meter track and then walks {z} meters. How many meters does {a} cover?",
    "A shop sells {item} at ${x} each. {a} buys {y} and pays with ${z}. How much change does {a} get?",
    "{a} is {x} years old. {b} is {y} years older than {a}. How old will {b} be in {z} years?",
    "A tank holds {x} liters. It loses {y} liters a day for {z} days. How many liters are left?",
    "{a} collects {x} {item} on Monday, twice as many on Tuesday and {z} on Wednesday. How many in all?",
    "A bus has {x} seats in each of {y} rows. {z} seats are empty. How many people are sitting?",
)

SETS = {"tuning": (0, 0), "report": (1, 1000)}  # set -> (template parity, seed offset)


def problems(n: int, which: str = "report", seed: int = 0) -> list[str]:
    """``n`` distinct problems from the ``tuning`` or ``report`` set."""
    if which not in SETS:
        raise ValueError(f"unknown problem set {which!r}: choose from {', '.join(SETS)}")
    parity, offset = SETS[which]
    templates = TEMPLATES[parity::2]
    rng = random.Random(offset + seed)
    out: list[str] = []
    while len(out) < n:
        a, b = rng.sample(NAMES, 2)
        x, y = rng.randint(3, 60), rng.randint(2, 12)
        text = rng.choice(templates).format(a=a, b=b, item=rng.choice(ITEMS), x=x, y=y, z=rng.randint(1, min(x, 30)))
        if text not in out:
            out.append(text)
    return out


def instruction(problem: str) -> str:
    return f"{problem}\nSolve it step by step, then give the final answer on its own line."
