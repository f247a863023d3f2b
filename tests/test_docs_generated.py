"""The generated docs are current, and what README and docs/*.md quote exists.

`make docs` writes docs/cli.md, docs/spec.md, specbuild/data/spec.schema.json and the command outputs of
the pages' run blocks; the first test regenerates them in memory and compares. The others read every
`specbuild COMMAND --flag` and every spec key (`section.key`) that README.md and docs/*.md quote and look
each up in the Typer app and the spec's dataclasses.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = {"cli.md", "spec.md"}  # written from the sources they would be checked against


def test_generated_files_are_current():
    from specbuild.cli.docs_gen import generated

    stale = [
        str(path.relative_to(ROOT))
        for path, text in generated().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"run `make docs`: {stale} differ from what the code generates"


# ---- the command line ------------------------------------------------------------------------------


def _commands() -> dict[tuple[str, ...], set[str]]:
    """Command path -> its option names (both forms of a flag pair); groups map to their options too."""
    from specbuild.cli.root import app

    out: dict[tuple[str, ...], set[str]] = {}

    def walk(cmd, path):
        out[path] = {
            n for p in cmd.params if p.param_type_name == "option" for n in (*p.opts, *p.secondary_opts)
        }
        out[path] |= {"--help"}
        if hasattr(cmd, "list_commands"):
            ctx = typer.Context(cmd)
            for name in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, name), (*path, name))

    walk(typer.main.get_command(app), ())
    return out


DEFAULT_SUBCOMMAND = {("repo",): ("repo", "build")}  # `specbuild repo BUILD ...` runs `repo build`
_SPAN = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)
_STOP = {"|", "||", "&&", ";", "&", "#"}


def _quoted_invocations(text: str, top: frozenset[str] = frozenset()):
    """(line of the quote, command path words, flags) for each `specbuild ...` in inline code or a block,
    and each inline span that starts with a command name in `top` and has a flag (`compile --flow x`)."""
    for m in _SPAN.finditer(text):
        code = m.group(1) if m.group(1) is not None else m.group(2)
        line_no = text.count("\n", 0, m.start()) + 1
        for line in code.replace("\\\n", " ").splitlines():
            starts = [s.end() for s in re.finditer(r"(?:^|[\s(`$])specbuild\s+(?=[a-z-])", line)]
            first = line.split()[:1]
            if m.group(2) is not None and first and first[0] in top and " --" in line:
                starts.append(0)
            for start in starts:
                words, flags = [], []
                for tok in line[start:].split():
                    if tok in _STOP or tok.startswith("#"):
                        break
                    if tok.startswith("--"):
                        flags.append(re.split(r"[=\[\]()`,:]", tok)[0].rstrip("."))
                    elif not flags and re.fullmatch(r"[a-z][a-z0-9-]*", tok) and len(words) < 2:
                        words.append(tok)
                yield line_no, words, flags


def _resolve(words: list[str], commands) -> tuple[str, ...] | None:
    path: tuple[str, ...] = ()
    for w in words:
        if (*path, w) in commands:
            path = (*path, w)
        else:
            break
    if words and not path:
        return None
    return DEFAULT_SUBCOMMAND.get(path, path)  # () is `specbuild --help` / `--debug` alone


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_quoted_commands_and_flags_exist(page):
    if page.name in GENERATED:
        pytest.skip("generated from the app itself")
    commands = _commands()
    top = frozenset(path[0] for path in commands if path)
    bad = []
    for line_no, words, flags in _quoted_invocations(page.read_text(encoding="utf-8"), top):
        path = _resolve(words, commands)
        if path is None:
            bad.append(f"line {line_no}: specbuild {' '.join(words)}: no such command")
            continue
        known = commands[path] | {"--debug"}
        bad += [f"line {line_no}: specbuild {' '.join(path)} has no {f}" for f in flags if f not in known]
    assert not bad, f"{page.name}:\n" + "\n".join(bad)


def test_the_quote_reader_reads_commands_groups_and_flags():
    text = (
        "run `specbuild repo check R --json` and `compile --flow llmapi`, not `make bench-load`\n"
        "```bash\nspecbuild repo B --out R --no-decoupled  # x --y\n```"
    )
    assert list(_quoted_invocations(text, frozenset({"compile", "repo"}))) == [
        (1, ["repo", "check"], ["--json"]),
        (1, ["compile"], ["--flow"]),
        (2, ["repo"], ["--out", "--no-decoupled"]),
    ]
    commands = _commands()
    assert _resolve(["repo"], commands) == ("repo", "build")
    assert _resolve(["nosuch"], commands) is None
    assert _resolve([], commands) == ()
    assert "--no-decoupled" in commands[("repo", "build")]


# ---- spec keys ------------------------------------------------------------------------------------

_FILE_TAIL = {
    "sh",
    "json",
    "jsonl",
    "md",
    "yaml",
    "yml",
    "py",
    "txt",
    "pbtxt",
    "log",
    "png",
    "toml",
    "html",
    "com",
}
_SHOWN_AS_ERRORS = {"target.tp_szie"}  # typos quoted on purpose, in the error message they cause


def _quoted_keys(text: str, sections: set[str]):
    """(line, dotted key) for each `section.key[.key]` in the text that is not a file name or code path."""
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(sorted(sections)) + r")((?:\.[a-z_][a-z0-9_]*)+)\b(?![/(.\w-])"
    )
    for m in pattern.finditer(text):
        tail = m.group(2).rsplit(".", 1)[-1]
        if tail in _FILE_TAIL:
            continue
        yield text.count("\n", 0, m.start()) + 1, m.group(1) + m.group(2)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_quoted_spec_keys_exist(page):
    from specbuild.core.spec_schema import keys

    paths = {k.path for k in keys()}
    sections = {p for p in paths if "." not in p and any(q.startswith(p + ".") for q in paths)}
    bad = [
        f"line {n}: {key}"
        for n, key in _quoted_keys(page.read_text(encoding="utf-8"), sections)
        if key not in paths and key not in _SHOWN_AS_ERRORS
    ]
    assert not bad, f"{page.name} quotes spec keys the spec does not have:\n" + "\n".join(bad)


def test_the_key_reader_skips_files_and_code_paths():
    text = (
        "set speculation.max_draft_len and `serving.decoupled`; build.sh, spec.draft.model, docs/serving.md"
    )
    assert [k for _, k in _quoted_keys(text, {"speculation", "serving", "build", "draft"})] == [
        "speculation.max_draft_len",
        "serving.decoupled",
    ]


def test_the_readme_tour_quotes_generated_check_output():
    """README's `check` output is a `make docs` run block, so test_generated_files_are_current keeps it
    what `check` prints today."""
    from specbuild.cli.docs_gen import RUN_BLOCK

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = [m.group("cmd") for m in RUN_BLOCK.finditer(text)]
    assert any(c.startswith("specbuild check examples/llama33-70b-1b.yaml") for c in commands), commands


def test_a_stale_run_block_is_rewritten_with_the_commands_output():
    from specbuild.cli.docs_gen import with_outputs

    cmd = "specbuild plan examples/llama33-70b-1b.yaml --tokens-per-day 100M --gpu h100 | tail -1"
    page = f"before\n<!-- make docs runs: {cmd} -->\n```text\n$ {cmd}\nan old figure\n```\nafter\n"
    lines = with_outputs(page).splitlines()
    assert lines[:4] == ["before", f"<!-- make docs runs: {cmd} -->", "```text", f"$ {cmd}"]
    assert lines[4].startswith("note: ") and lines[5:] == ["```", "after"]  # tail -1: plan's last note


def test_the_readme_matrix_is_the_support_rule():
    """README's method x flow table says yes exactly where core/methods/matrix.py `support` does (the engine
    flow on the default release, the LLM-API flow on any release it is generated for)."""
    from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, Flow
    from specbuild.core.facts.trtllm import DEFAULT_TRTLLM_VERSION
    from specbuild.core.methods import Method
    from specbuild.core.methods.matrix import support

    text = (ROOT / "README.md").read_text(encoding="utf-8").split("## Methods, flows and engines", 1)[1]
    text = text.split("\n## ", 1)[0]
    rows = {
        m: (e.strip(), ll.strip())
        for m, e, ll in re.findall(r"^\| `([a-z0-9_]+)`[^|]*\| ([^|]+)\| ([^|]+)\|", text, re.M)
    }
    assert set(rows) == {m.value for m in Method}, "one row per method"
    for method, (engine, llmapi) in rows.items():
        engine_ok = support(method, Flow.ENGINE, DEFAULT_TRTLLM_VERSION).ok
        llmapi_ok = any(support(method, Flow.LLMAPI, v).ok for v in LLMAPI_VERSIONS)
        assert engine.startswith("yes") == engine_ok, (method, engine)
        assert llmapi.startswith("yes") == llmapi_ok, (method, llmapi)
