"""Every command of the CLI, found from the Typer app (a new command is covered when it is added): no
command removes or overwrites what it reads, and a bad output fails before any work with a clear error,
never a traceback (issue 40, severe 2 and medium 7).

* Each path parameter of each command declares its role (cli/paths.py): input, build spec, output.
* Each command with `--out` is run with an output folder holding one of its inputs, one input at a
  time (for a build spec: the spec file, the target, and each method's own folders: the draft, the
  Medusa heads, the EAGLE-3 draft): refused, and nothing inside is lost, with and without `--force`.
  Today's `deploy SPEC --out <folder holding the models> --force` deleted the models.
* Each output of each command pointed at an unwritable place (/sys, where even root cannot write, and
  a path through a file) fails at once: exit 2, the option named, no traceback.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.cli.paths import Declared, Role, roles

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tiny"
UNWRITABLE = Path("/sys/specbuild-test")  # EACCES / EPERM for every user, root included


def commands() -> dict[str, tuple[object, typing.Callable]]:
    """'deploy', 'repo build', ... -> (the click command, the command's function)."""
    found = {}

    def walk(cmd, prefix):
        for name, sub in getattr(cmd, "commands", {}).items():
            if hasattr(sub, "commands"):
                walk(sub, [*prefix, name])
            else:
                found[" ".join([*prefix, name])] = (sub, sub.callback.__wrapped__)

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = commands()
OUT_COMMANDS = sorted(
    name
    for name, (_, fn) in COMMANDS.items()
    if any(p.role is Role.OUT_DIR and p.spelling == "--out" for p in roles(fn).values())
)


def test_the_walk_finds_every_command_with_an_out():
    assert set(COMMANDS) >= {"check", "deploy", "repo build", "repo check", "tune", "serve"}
    assert OUT_COMMANDS == [
        "bench",
        "compile",
        "convert",
        "deploy",
        "eagle3 convert",
        "plan",
        "repo build",
        "train-eagle3",
        "train-medusa",
    ]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_path_parameter_declares_its_role(name):
    """A Path parameter without a role would escape the input/output checks: every one has one."""
    _, fn = COMMANDS[name]
    for param, hint in typing.get_type_hints(fn, include_extras=True).items():
        base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
        if Path in (base, *typing.get_args(base)):
            meta = getattr(hint, "__metadata__", ())
            assert any(isinstance(m, Declared) for m in meta), f"{name}: {param} has no role"


# ---- the invocations ------------------------------------------------------------------------------------

MODELS = ("target", "draft", "heads", "eagle")
SPEC_INPUTS = {  # what each method's spec reads besides the spec file (the test's own list, not the code's)
    "draft_target": ["target", "draft"],
    "medusa": ["target", "heads"],
    "ngram": ["target"],
    "eagle3": ["target", "eagle"],
}


def spec_file(folder: Path, method: str, models: dict[str, Path]) -> Path:
    """A valid spec of `method` in `folder`; each model folder it names is models[name] (made here)."""
    raw = yaml.safe_load((EXAMPLES / "draft-target.yaml").read_text())
    raw.pop("draft")
    raw["mode"] = method
    raw["target"] = {"model": str(models["target"])}
    if method == "draft_target":
        raw["draft"] = {"model": str(models["draft"])}
    elif method == "medusa":
        raw["medusa"] = {"heads": str(models["heads"]), "num_heads": 3, "choices": [[0], [1]]}
    elif method == "eagle3":
        raw["eagle3"] = {"model": str(models["eagle"])}
        raw["flow"] = "llmapi"
    for sub in SPEC_INPUTS[method]:
        models[sub].mkdir(parents=True, exist_ok=True)
        (models[sub] / "config.json").write_text('{"precious": true}')
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{method}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def dummy(path: Path) -> Path:
    """An input with content to lose: a folder holding a file."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "data.txt").write_text("precious")
    return path


def inputs_elsewhere(name: str, root: Path, skip: str | None = None) -> dict[str, str]:
    """Values for every input parameter of `name` but `skip`, in root/elsewhere; --out is root/out."""
    out = {"out": str(root / "out")}
    for param, p in roles(COMMANDS[name][1]).items():
        if param != skip and p.role is Role.SPEC:
            where = {m: root / "elsewhere" / m for m in MODELS}
            out[param] = str(spec_file(root / "elsewhere", "draft_target", where))
        elif param != skip and p.role is Role.INPUT:
            out[param] = str(dummy(root / "elsewhere" / param))
    return out


def cases(name: str):
    """(label, make) per input of command `name`; make(root) lays that one input inside root/out and
    the others in root/elsewhere, and returns the parameter values."""
    declared = roles(COMMANDS[name][1])

    def values(root: Path, skip: str) -> dict[str, str]:
        return inputs_elsewhere(name, root, skip)

    for param, p in declared.items():
        if p.role is Role.SPEC:
            for method, models in SPEC_INPUTS.items():

                def spec_inside(root, param=param, method=method):
                    where = {m: root / "elsewhere" / m for m in MODELS}
                    return {**values(root, param), param: str(spec_file(root / "out", method, where))}

                yield f"{method} spec file", spec_inside
                for model in models:

                    def model_inside(root, param=param, method=method, model=model):
                        where = {m: root / ("out" if m == model else "elsewhere") / m for m in MODELS}
                        return {
                            **values(root, param),
                            param: str(spec_file(root / "elsewhere", method, where)),
                        }

                    yield f"{method} {model} folder", model_inside
        elif p.role is Role.INPUT:
            yield (
                p.label,
                lambda root, param=param: {**values(root, param), param: str(dummy(root / "out" / param))},
            )


def argv(name: str, values: dict[str, str], extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of `name` with `values` (param name -> text) and placeholders for the rest of its
    required parameters."""
    cmd, _ = COMMANDS[name]
    args, opts = [], []
    for p in cmd.params:
        value = values.get(p.name)
        if value is None and p.required:
            value = {"url": "127.0.0.1:1", "prompt": "hi"}.get(p.name, "x")
        if value is None:
            continue
        if p.param_type_name == "argument":
            args.append(value)
        else:
            opts += [p.opts[0], value]
    return [*name.split(), *args, *opts, *extra]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(folder)): (
            os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "/"
        )
        for p in sorted(folder.rglob("*"))
    }


def has_force(name: str) -> bool:
    return any(p.name == "force" for p in COMMANDS[name][0].params)


@pytest.mark.parametrize("name", OUT_COMMANDS)
def test_no_command_writes_over_what_it_reads(name, tmp_path):
    """Severe 2: today's `deploy SPEC --out DIR --force` deleted the target, draft and Medusa heads in DIR."""
    runner = CliRunner()
    labels = []
    for i, (label, make) in enumerate(cases(name)):
        root = tmp_path / str(i)
        values = make(root)
        before = snapshot(root / "out")
        assert before, (name, label)
        for extra in [("--force",), ()] if has_force(name) else [()]:
            result = runner.invoke(app, argv(name, values, extra))
            assert snapshot(root / "out") == before, (name, label, extra, result.output)  # nothing lost
            assert result.exit_code == 2, (name, label, extra, result.output)
            assert "which this command reads" in result.output, (name, label, extra, result.output)
            assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
        labels.append(label)
    assert labels


OUTPUTS = sorted(
    (name, param)
    for name, (_, fn) in COMMANDS.items()
    for param, p in roles(fn).items()
    if p.role in (Role.OUT_DIR, Role.OUT_FILE)
)


def test_the_walk_finds_every_output():
    assert ("tune", "plot_path") in OUTPUTS and ("serve", "log_file") in OUTPUTS and len(OUTPUTS) == 12


@pytest.mark.parametrize(("name", "param"), OUTPUTS)
@pytest.mark.parametrize("where", ["read-only", "through a file"])
def test_an_unwritable_output_fails_first_without_a_traceback(name, param, where, tmp_path):
    """Medium 7: an output that cannot be written is one clear error, whatever the command."""
    spelling = roles(COMMANDS[name][1])[param].spelling
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    target = UNWRITABLE / "out" if where == "read-only" else blocker / "out"
    values = {**inputs_elsewhere(name, tmp_path), param: str(target)}
    if param != "out":
        values.pop("out", None)
    result = CliRunner().invoke(app, argv(name, values))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    assert f"{spelling} {target}" in result.output, result.output


def test_tune_checks_its_plot_before_measuring(tmp_path, monkeypatch):
    """`tune --schedule --plot /unwritable.png` measured for minutes, then printed a traceback."""
    import specbuild.tuning.tune as tune

    def tripwire(*args, **kwargs):
        raise AssertionError("tune measured before checking --plot")

    monkeypatch.setattr(tune, "tune_spec", tripwire)
    spec = spec_file(tmp_path, "draft_target", {m: tmp_path / m for m in MODELS})
    for plot in (UNWRITABLE / "plot.png", tmp_path / "draft"):  # read-only; a folder where a file goes
        result = CliRunner().invoke(app, ["tune", str(spec), "--schedule", "--plot", str(plot)])
        assert result.exit_code == 2 and f"--plot {plot}" in result.output, result.output
        assert "Traceback" not in result.output


def test_plan_out_onto_an_existing_file_is_refused(tmp_path):
    """`plan --out EXISTING_FILE` was a FileExistsError traceback (after the plan was computed)."""
    spec = spec_file(tmp_path, "draft_target", {m: tmp_path / m for m in MODELS})
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    result = CliRunner().invoke(app, ["plan", str(spec), "--peak-rps", "1", "--out", str(existing)])
    assert result.exit_code == 2 and "is a file" in result.output and "Traceback" not in result.output
    assert existing.read_text() == "mine"


def test_an_os_error_no_stage_typed_is_one_clear_message(capsys):
    """The CLI's one error mapping (cli/common.handle_errors) turns any OSError into a message naming the
    file and the reason; a traceback only with --debug."""
    import errno

    from specbuild.cli.common import handle_errors

    def fails() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out/plan.png")

    with pytest.raises(typer.Exit) as exit_info:
        handle_errors(fails)()
    assert exit_info.value.exit_code == 2
    err = capsys.readouterr().err
    assert "No space left on device: /data/out/plan.png" in err and "ENOSPC" in err and "Traceback" not in err


def test_the_spec_is_read_with_the_commands_overrides(tmp_path):
    """`compile SPEC --flow llmapi` of an EAGLE-3 spec without `flow:` is valid only with the override: the
    check before the command reads the spec the same way (and still finds the EAGLE-3 draft)."""
    models = {m: tmp_path / m for m in MODELS}
    spec = spec_file(tmp_path, "eagle3", models)
    raw = yaml.safe_load(spec.read_text())
    raw.pop("flow")
    spec.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(
        app, ["compile", str(spec), "--flow", "llmapi", "--out", str(models["eagle"])]
    )
    assert result.exit_code == 2 and "is the EAGLE-3 draft model" in result.output, result.output
    result = CliRunner().invoke(app, ["compile", str(spec), "--flow", "llmapi", "--out", str(tmp_path / "b")])
    assert "flow engine" not in result.output, result.output  # it fails later, on the dummy models
