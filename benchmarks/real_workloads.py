"""Realistic requests for a real chat model, built from this machine's own files.

Four workloads, the ones users send an assistant every day:

* ``edit``: a standard-library function pasted with an edit to make (rename
  a parameter, add a docstring, add type hints); the answer is the whole
  function again (heavy copying, with changes);
* ``qa``: a section of the Python language reference (``pydoc_data``)
  pasted as a document, with a question on it (retrieval-style answering);
* ``chat``: an open question, nothing to copy;
* ``turn2``: a follow-up on a ``chat`` conversation, whose first answer is
  the model's own (the second turn of a multi-turn chat).

Two sets, fixed here, with disjoint sources and seeds of their own:

* ``tuning``: the pools drafting was tuned and checked on (the modules of
  ``EDIT_MODULES``, the language reference's sections for ``qa``, the
  questions of ``CHAT_QUESTIONS`` and ``FOLLOW_UPS``), drawn with the seed
  as given (seed 0 is what every earlier run used);
* ``report``: pools no tuning has read (other standard-library modules for
  ``edit``; module docstrings, not the language reference, for ``qa``; other
  topics and follow-ups for ``chat`` and ``turn2``), drawn with seeds that
  the tuning set never uses (``report:`` prefixed).  The benchmarks default
  to it; a change to drafting is checked on ``tuning`` only.

Prompts are drawn at random from each pool with a seed.  Nothing is
downloaded.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

WORKLOADS = ("edit", "qa", "chat", "turn2")
SETS = ("tuning", "report")

# Modules whose functions are pasted for edits: readable code of moderate size.
EDIT_MODULES = (
    "textwrap.py", "csv.py", "shlex.py", "fractions.py", "statistics.py", "calendar.py", "glob.py",
    "fnmatch.py", "heapq.py", "bisect.py", "string.py", "json/encoder.py", "json/decoder.py", "graphlib.py",
    "colorsys.py", "difflib.py", "ipaddress.py", "pprint.py", "base64.py", "quopri.py", "uu.py", "locale.py",
    "gettext.py", "tokenize.py", "configparser.py", "random.py", "shutil.py", "zipfile.py", "tarfile.py",
)

EDIT_ASKS = (
    "Rename the parameter `{param}` to `{new}` everywhere in this function and return the whole updated "
    "function in a code block.",
    "Add a short docstring to this function and return the whole function in a code block.",
    "Add type hints to the signature of this function and return the whole function in a code block.",
    "Rename the function `{name}` to `{name}_v2` and return the whole function in a code block.",
)

QA_ASKS = (
    "What does this section say about {topic}? Answer using the text above.",
    "Summarise the rules this section gives for {topic}, quoting it where you can.",
    "According to the document, how does {topic} work? Quote the relevant sentences.",
    "Explain {topic} to a beginner, based only on the document above.",
)

CHAT_QUESTIONS = (
    "What are some good habits for writing maintainable code?",
    "Can you explain how a hash table works?",
    "What is the difference between a process and a thread?",
    "Give me some tips for a job interview.",
    "How do vaccines train the immune system?",
    "Why is the sky blue?",
    "What should I pack for a weekend hiking trip?",
    "How can I improve my sleep?",
    "Explain recursion with a simple example.",
    "What is the difference between weather and climate?",
    "How does compound interest work?",
    "What are the main causes of inflation?",
    "How do I make a good cup of coffee at home?",
    "What is machine learning, in simple terms?",
    "Write a short poem about the ocean.",
    "How does a bicycle stay upright?",
    "What are the benefits of learning a second language?",
    "Explain what an API is to a non-programmer.",
    "How do plants make their food?",
    "What is the best way to learn to play the guitar?",
    "How does the internet work?",
    "Give me a simple recipe for pancakes.",
    "What is the difference between a list and a tuple in Python?",
    "Why do we have seasons on Earth?",
    "How can I be more productive when working from home?",
    "What is a black hole?",
    "How do I write a good cover letter?",
    "What is the difference between HTTP and HTTPS?",
    "Tell me a short story about a robot who learns to paint.",
    "What are some healthy breakfast ideas?",
    "How do electric cars work?",
    "What is photosynthesis?",
)

# The report set's pools: no module, section or question of the tuning set's.
REPORT_EDIT_MODULES = (
    "functools.py", "operator.py", "dataclasses.py", "enum.py", "ntpath.py", "posixpath.py", "linecache.py",
    "queue.py", "imaplib.py", "netrc.py", "mailbox.py", "pickletools.py", "webbrowser.py", "tabnanny.py",
    "trace.py", "pstats.py", "code.py", "contextlib.py", "filecmp.py", "getopt.py", "optparse.py", "gzip.py",
    "bz2.py", "lzma.py", "secrets.py", "hmac.py", "mimetypes.py", "numbers.py", "reprlib.py", "selectors.py",
    "email/utils.py",
)

# Modules whose docstring (800-4000 characters) is the report set's pasted document.
REPORT_QA_MODULES = (
    "copy.py", "sched.py", "smtplib.py", "ftplib.py", "plistlib.py", "wave.py", "cmd.py", "codeop.py",
    "fileinput.py", "timeit.py", "urllib/parse.py", "http/cookies.py", "argparse.py", "subprocess.py",
    "inspect.py", "ast.py", "doctest.py", "pdb.py", "socket.py", "ssl.py", "tempfile.py", "typing.py",
    "sqlite3/__init__.py", "collections/__init__.py",
)

REPORT_QA_ASKS = (
    "What is this module for, according to the documentation above? Answer from the text.",
    "List the main functions or classes this documentation mentions, with what each does.",
    "Using only the documentation above, explain how to use this module to a new programmer.",
    "What does the documentation above say about {topic}? Quote it where you can.",
)

# Topics none of CHAT_QUESTIONS touches: history, arts, cooking techniques
# beyond recipes, personal finance beyond interest, geography, sport, pets,
# household, language, ethics.
REPORT_CHAT_QUESTIONS = (
    "What caused the fall of the Roman Empire?",
    "How should I care for a new puppy in its first month?",
    "What are the rules of chess, briefly?",
    "How do I remove a red wine stain from a carpet?",
    "Why did the Industrial Revolution start in Britain?",
    "What is the difference between baking soda and baking powder?",
    "How do I start a small vegetable garden on a balcony?",
    "What makes a painting impressionist?",
    "How do tides work?",
    "What should I consider when buying a used car?",
    "Explain the offside rule in football.",
    "How do I make a monthly budget?",
    "What are the main differences between British and American English?",
    "Why do cats purr?",
    "How do volcanoes form?",
    "What is the trolley problem in ethics?",
    "How can I learn to draw faces?",
    "What is the history of the printing press?",
    "How do I train for my first 10 km run?",
    "What are the pros and cons of renting versus buying a home?",
    "How do bees make honey?",
    "What is the difference between a violin and a viola?",
    "How do I keep houseplants alive in winter?",
    "Why is the Great Wall of China so long?",
    "What are some tips for taking better photos with a phone?",
    "How does a refrigerator keep food cold?",
    "What is stoicism?",
    "How do I apologise sincerely to a friend?",
    "What were the main achievements of the Renaissance?",
    "How do I choose a good watermelon?",
    "Why do leaves change colour in autumn?",
    "What is the best way to memorise a speech?",
)

REPORT_FOLLOW_UPS = (
    "Could you shorten that to two sentences?",
    "What is one mistake people often make with this?",
    "Can you put that into a table?",
    "How would you explain this to a ten-year-old?",
    "What would you add if you had more space?",
)

FOLLOW_UPS = (
    "Thanks! Can you summarise your answer in three bullet points?",
    "Can you explain that again more simply?",
    "Could you give a concrete example of what you described?",
    "Please rewrite your answer as a short numbered list.",
    "Which of the points you made is the most important, and why?",
)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _functions(path: Path, min_lines: int = 8, max_lines: int = 30) -> list[tuple[str, str, list]]:
    """(name, source, parameter names) of the plain functions in a module."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        start, end = node.lineno - 1, node.end_lineno
        if not min_lines <= end - start <= max_lines:
            continue
        body = lines[start:end]
        indent = len(body[0]) - len(body[0].lstrip())
        text = "\n".join(line[indent:] for line in body).replace("\t", "    ")
        params = [a.arg for a in node.args.args if a.arg not in ("self", "cls") and len(a.arg) > 1]
        out.append((node.name, text, params))
    return out


def _edit(rng: random.Random, which: str = "tuning") -> list[dict]:
    modules = EDIT_MODULES if which == "tuning" else REPORT_EDIT_MODULES
    while True:
        path = stdlib_dir() / rng.choice(modules)
        funcs = _functions(path)
        if not funcs:
            continue
        name, code, params = rng.choice(funcs)
        ask = rng.choice(EDIT_ASKS)
        if "{param}" in ask and not params:
            continue
        param = rng.choice(params) if params else ""
        ask = ask.format(param=param, new=f"{param}_value" if param else "", name=name)
        return [{"role": "user", "content": f"```python\n{code}\n```\n\n{ask}"}]


def _module_doc(rel: str) -> str:
    try:
        return ast.get_docstring(ast.parse((stdlib_dir() / rel).read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, UnicodeDecodeError):
        return ""


def _qa(rng: random.Random, which: str = "tuning") -> list[dict]:
    if which == "report":
        docs = [(m, d) for m in REPORT_QA_MODULES if 800 <= len(d := _module_doc(m)) <= 4000]
        module, text = rng.choice(docs)
        topic = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        ask = rng.choice(REPORT_QA_ASKS).format(topic=f"the `{topic}` module")
        return [{"role": "user", "content": f"Documentation of `{topic}`:\n\n{text.strip()}\n\n{ask}"}]
    from pydoc_data.topics import topics

    keys = sorted(k for k, v in topics.items() if 800 <= len(v) <= 4000)
    while True:
        key = rng.choice(keys)
        text = topics[key].strip()
        # A paragraph of the section names the topic the question is about.
        paragraphs = [p.strip() for p in text.split("\n\n") if 80 < len(p.strip()) < 600]
        if not paragraphs:
            continue
        topic = key.replace("-", " ")
        ask = rng.choice(QA_ASKS).format(topic=f'"{topic}"')
        return [{"role": "user", "content": f"Document:\n\n{text}\n\n{ask}"}]


def _chat(rng: random.Random, which: str = "tuning") -> list[dict]:
    return [{"role": "user", "content": rng.choice(CHAT_QUESTIONS if which == "tuning" else REPORT_CHAT_QUESTIONS)}]


def _check_set(which: str) -> None:
    if which not in SETS:
        raise ValueError(f"unknown prompt set {which!r}; choose from {', '.join(SETS)}")


def conversations(kind: str, n: int, seed: int = 0, which: str = "tuning") -> list[list[dict]]:
    """``n`` distinct first-turn conversations of workload ``kind`` from set
    ``which`` (``turn2`` draws ``chat`` openings; finish them with ``follow_up``)."""
    _check_set(which)
    make = {"edit": _edit, "qa": _qa, "chat": _chat, "turn2": _chat}[kind]
    # The tuning set keeps the seeds every earlier run used; the report set's
    # are of another form, so no seed draws the same stream in both.
    rng = random.Random(f"{kind}:{seed}" if which == "tuning" else f"report:{kind}:{seed}")
    seen, out = set(), []
    for _ in range(50 * n):
        conv = make(rng, which)
        key = conv[-1]["content"]
        if key not in seen:
            seen.add(key)
            out.append(conv)
        if len(out) == n:
            return out
    raise ValueError(f"cannot draw {n} distinct {kind} requests")


def follow_up(conv: list[dict], answer: str, seed: int = 0, which: str = "tuning") -> list[dict]:
    """``conv`` answered with ``answer`` and asked a follow-up question."""
    _check_set(which)
    rng = random.Random(f"follow:{seed}:{conv[-1]['content']}" if which == "tuning"
                        else f"report:follow:{seed}:{conv[-1]['content']}")
    return [*conv, {"role": "assistant", "content": answer.strip()},
            {"role": "user", "content": rng.choice(FOLLOW_UPS if which == "tuning" else REPORT_FOLLOW_UPS)}]


def render(tokenizer, conv: list[dict]) -> str:
    """The prompt text the model answers (its chat template, generation prompt added)."""
    return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
