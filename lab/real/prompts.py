"""The prompts of `make demo-real`: user turns for SmolLM2-135M-Instruct, in three fixed sets.

* `quoting` — the answer should repeat text the prompt holds, where n-gram (prompt lookup) drafting
  should pay: "add a docstring to this function" / "add type hints" on short functions of the Python
  standard library, and "correct this text" on paragraphs of its module docstrings;
* `open` — open-ended chat (a story, a poem, tips) whose answer quotes nothing, where it should not;
* `train` — more of both kinds, disjoint from the two bench sets: the Medusa heads and the draft learn
  from the target's greedy answers to these.

Everything comes from the running interpreter's standard library and the word lists below, in a fixed
order, so the sets are reproducible for a given Python (the cache key names the Python version).
Each prompt is wrapped in the model's chat template by the caller (real_model.chat_prompt).
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.errors import SpecbuildError

# Small, stable standard-library modules whose short functions read well in a prompt.
CODE_MODULES = (
    "bisect",
    "colorsys",
    "fnmatch",
    "genericpath",
    "glob",
    "heapq",
    "keyword",
    "posixpath",
    "shlex",
    "string",
    "textwrap",
    "tokenize",
    "calendar",
    "base64",
    "quopri",
    "copy",
)
TEXT_MODULES = (
    "textwrap",
    "shlex",
    "string",
    "glob",
    "heapq",
    "bisect",
    "calendar",
    "base64",
    "copy",
    "pprint",
)
CODE_LINES = (4, 12)  # a function body this short fits the prompt budget with its answer
TEXT_CHARS = (160, 420)  # a docstring paragraph of this length

CODE_TASKS = (
    "Add a docstring to this Python function and return the whole function:\n\n```python\n{code}```",
    "Add type hints to this Python function and return the whole function:\n\n```python\n{code}```",
)
TEXT_TASKS = (
    "Correct any spelling or grammar mistakes in this text and return the corrected text:\n\n{text}",
)
OPEN_TASKS = (
    "Tell me a short story about {topic}.",
    "Write a short poem about {topic}.",
    "Give me three tips about {topic}.",
    "Why do people like {topic}?",
)
TOPICS = (
    "a lighthouse keeper",
    "autumn leaves",
    "a robot learning to paint",
    "the ocean at night",
    "baking bread",
    "a lost umbrella",
    "learning to swim",
    "a mountain village",
    "friendship",
    "a train journey",
    "gardening",
    "the first snow",
    "a curious cat",
    "space travel",
    "playing chess",
    "a rainy afternoon",
    # appended (the bench prompts come first and stay the same): training data for 128 training prompts
    "a busy harbour",
    "a quiet library",
    "the northern lights",
    "a bicycle repair shop",
    "learning a new language",
    "a street musician",
    "an old map",
    "a thunderstorm",
    "a beekeeper",
    "a desert oasis",
    "a city at dawn",
    "a forgotten letter",
    "hiking in the mountains",
    "a kite festival",
    "a school science fair",
    "a vegetable market",
    "a clockmaker",
    "a snowy forest",
    "a paper boat",
    "a night market",
    "the smell of coffee",
    "a jazz club",
    "a family reunion",
    "a treehouse",
    "a broken compass",
    "a glass of lemonade",
    "a lonely astronaut",
    "a fishing trip",
    "an ancient castle",
    "a spring meadow",
    "a sleepy dragon",
    "a crowded subway",
    "a pottery class",
    "a windmill",
    "a marathon runner",
    "a birthday surprise",
    "a secret garden",
    "the moon",
    "an island ferry",
    "a violin",
    "a lost puppy",
    "a farmers' almanac",
    "a winter cabin",
    "a volcano",
    "a toy shop",
    "a river crossing",
    "a chess tournament",
    "a summer camp",
    "a carpenter",
    "a hot air balloon",
    "a city park",
    "an old photograph",
    "a shooting star",
    "a bakery at dawn",
    "a sailing race",
    "a museum guard",
    "a garden snail",
    "a mountain lake",
    "a foggy morning",
    "a tailor",
    "a rooftop garden",
    "a postman",
    "a camping trip",
    "a field of sunflowers",
)
BENCH_EVERY = 5  # every 5th prompt of each kind is a bench prompt, the others train


@dataclass(frozen=True)
class PromptSets:
    quoting: tuple[str, ...]
    open: tuple[str, ...]
    train: tuple[str, ...]
    # what `tune` measures on: half quoting, half open, from neither the bench nor the training prompts
    # (a draft trained on its tune prompts' answers looks better there than on unseen ones)
    tune: tuple[str, ...] = ()


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def short_functions(stdlib: Path | None = None) -> list[str]:
    """Top-level functions of CODE_MODULES with CODE_LINES lines, as source text (module order, then
    file order); private helpers are kept (they read as ordinary code)."""
    out = []
    for name in CODE_MODULES:
        path = (stdlib or _stdlib()) / f"{name}.py"
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and not node.decorator_list:
                lines = node.end_lineno - node.lineno + 1
                if CODE_LINES[0] <= lines <= CODE_LINES[1]:
                    out.append(ast.get_source_segment(source, node) + "\n")
    return out


def docstring_paragraphs(stdlib: Path | None = None) -> list[str]:
    """Paragraphs of TEXT_MODULES' module and function docstrings, TEXT_CHARS long, one line each."""
    out = []
    for name in TEXT_MODULES:
        path = (stdlib or _stdlib()) / f"{name}.py"
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        nodes = [tree, *(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node) or ""
            for para in doc.split("\n\n"):
                text = " ".join(para.split())
                if TEXT_CHARS[0] <= len(text) <= TEXT_CHARS[1] and not text.startswith((">>>", "-", "*")):
                    out.append(text)
    return list(dict.fromkeys(out))


def _split(items: list[str]) -> tuple[list[str], list[str]]:
    bench = [p for i, p in enumerate(items) if i % BENCH_EVERY == 0]
    train = [p for i, p in enumerate(items) if i % BENCH_EVERY != 0]
    return bench, train


def prompt_sets(
    *, bench_size: int = 4, train_size: int = 32, tune_size: int = 4, stdlib: Path | None = None
) -> PromptSets:
    """The four sets: `bench_size` quoting (half code, half text) and open prompts, `train_size` training
    prompts (half quoting, half open), interleaved so both kinds appear early, and `tune_size` tune prompts
    (half quoting, half open) from the bench pools past the bench prompts."""
    functions = short_functions(stdlib)
    code = [CODE_TASKS[i % len(CODE_TASKS)].format(code=f) for i, f in enumerate(functions)]
    text = [TEXT_TASKS[0].format(text=t) for t in docstring_paragraphs(stdlib)]
    chat = [task.format(topic=t) for i, t in enumerate(TOPICS) for task in OPEN_TASKS if _takes(i, task)]
    code_b, code_t = _split(code)
    text_b, text_t = _split(text)
    chat_b, chat_t = _split(chat)
    half = bench_size // 2
    quoting = tuple(code_b[: bench_size - half] + text_b[:half])
    quoting_train = _interleave(code_t, text_t)[: train_size // 2]
    train = tuple(_interleave(quoting_train, chat_t[: train_size - len(quoting_train)]))
    quoting_tune = _interleave(code_b[bench_size - half :], text_b[half:])[: tune_size // 2]
    tune = tuple(_interleave(quoting_tune, chat_b[bench_size : bench_size + tune_size - len(quoting_tune)]))
    if (
        len(quoting) < bench_size
        or len(chat_b) < bench_size
        or len(train) < train_size
        or len(tune) < tune_size
    ):
        raise SpecbuildError(
            "too few standard-library sources for the demo-real prompts",
            expected=f"{bench_size} quoting and open bench prompts, {train_size} training prompts, "
            f"{tune_size} tune prompts",
            found=f"{len(quoting)} quoting, {len(chat_b)} open, {len(train)} training, {len(tune)} tune",
            fix="run the demo with a CPython that ships its standard library sources",
        )
    return PromptSets(quoting=quoting, open=tuple(chat_b[:bench_size]), train=train, tune=tune)


def _takes(i: int, task: str) -> bool:
    """Each topic takes two of the four open tasks, in rotation (two prompts a topic)."""
    k = OPEN_TASKS.index(task)
    return k in (i % len(OPEN_TASKS), (i + 1) % len(OPEN_TASKS))


def _interleave(a: list[str], b: list[str]) -> list[str]:
    out = []
    for i in range(max(len(a), len(b))):
        out += [x[i] for x in (a, b) if i < len(x)]
    return out
