"""EAGLE-3 checkpoint formats: the speculators format read and written, `specbuild eagle3 convert` between
it and the HF layout (tensors byte-exact, aux-layer ids converted), `check` / `inspect` on either format,
and a draft trained elsewhere imported: checked, converted, measured by `tune`, run by the reference engine.

Every draft handed to specbuild here is laid out by the minimal writers of tests/eagle3_drafts.py (plain
safetensors + json), never by specbuild's own writer, so a reader and writer that agree with each other
but not with the format would fail; specbuild's converter output is compared with those writers' names.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from eagle3_drafts import raw_tensor_bytes, write_draft, write_hf, write_speculators

torch = pytest.importorskip("torch")

from safetensors.torch import load_file, save_file  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from specbuild.cli import app  # noqa: E402
from specbuild.core.errors import CheckpointError  # noqa: E402
from specbuild.core.formats.eagle3 import Eagle3DraftConfig  # noqa: E402
from specbuild.core.formats.eagle3_speculators import (  # noqa: E402
    Verifier,
    from_speculators,
    tensor_name,
    to_speculators,
)
from specbuild.core.sampling_params import SamplingParams  # noqa: E402
from specbuild.core.spec import load_spec  # noqa: E402
from specbuild.engines.reference.eagle3 import load_eagle3_draft, open_row  # noqa: E402
from specbuild.engines.reference.engine import ReferenceEngine  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

LAYERS = [1, 2, 3]  # of the 4-layer target, as layer outputs (eagle_config); vLLM / speculators: [2, 3, 4]
VLLM_IDS = [2, 3, 4]
SHAPE = dict(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=384, draft_vocab=200)
TOKENS = [5, 17, 42, 99, 7, 3, 250, 11]


@pytest.fixture(scope="module")
def hf_draft(tmp_path_factory):
    return write_draft(tmp_path_factory.mktemp("e3f") / "hf", **SHAPE, layers=LAYERS, seed=5)


def _cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def _first_step(target_model, folder) -> torch.Tensor:
    """The engine's first-step draft logits [T-1,Vd] over TOKENS (one catch-up pass)."""
    draft = load_eagle3_draft(folder, target_model)
    seq = torch.tensor([TOKENS])
    _, aux = target_model.forward_capture(seq, target_model.new_cache(1, 16), capture=draft.aux_layers)
    cache = draft.new_cache(1, 16)
    open_row(cache, 0)
    return draft.logits(draft.forward(seq[:, 1:], draft.fuse(aux[:, :-1]), cache)[0])


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _speculators_copy(src: Path, out: Path, **config) -> Path:
    """The speculators layout of an HF-layout folder's tensors (by the independent writer)."""
    return write_speculators(out, load_file(str(src / "model.safetensors")), **{**SHAPE, **config})


# ---- the config, torch-free -------------------------------------------------------------------------


def test_speculators_config_round_trips_and_refuses_ambiguity():
    hf = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "draft_vocab_size": 8192,
        "rope_theta": 100000.0,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},  # SmolLM2-135M's defaults
    }
    cfg = Eagle3DraftConfig.from_dict(hf)
    raw = to_speculators(cfg, verifier=Verifier("org/target", ("LlamaForCausalLM",)), speculative_tokens=4)
    assert raw["speculators_model_type"] == "eagle3" and "model_type" not in raw
    assert raw["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's numbering: 0 = the embedding
    assert "eagle_config" not in raw and raw["norm_before_residual"] is False
    layer = raw["transformer_layer_config"]
    assert (layer["model_type"], layer["hidden_size"], layer["vocab_size"]) == ("llama", 576, 49152)
    assert layer["rope_parameters"]["rope_theta"] == 100000.0
    method = raw["speculators_config"]["proposal_methods"][0]
    assert (method["proposal_type"], method["speculative_tokens"]) == ("greedy", 4)
    back = from_speculators(json.loads(json.dumps(raw)), folder=Path("."), where="config.json")
    assert back.config == cfg and back.format == "speculators" and back.speculative_tokens == 4
    assert back.verifier == Verifier("org/target", ("LlamaForCausalLM",))
    assert Eagle3DraftConfig.from_dict(back.config.to_hf()) == cfg
    # a published Llama-3.1 draft: `LlamaForCausalLM`, llama3 rope scaling, no ids (the engines' default)
    llama31 = {
        **hf,
        "architectures": ["LlamaForCausalLM"],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
    }
    del llama31["eagle_config"]
    cfg31 = Eagle3DraftConfig.from_dict(llama31)
    raw31 = to_speculators(cfg31, verifier=Verifier("meta-llama/Llama-3.1-8B-Instruct"))
    assert raw31["transformer_layer_config"]["rope_parameters"]["rope_type"] == "llama3"
    assert "eagle_aux_hidden_state_layer_ids" not in raw31  # none named: none invented
    back31 = from_speculators(raw31, folder=Path("."), where="config.json").config
    assert back31 == replace(cfg31, architecture="LlamaForCausalLMEagle3")
    unset = {k: v for k, v in raw.items() if k != "norm_before_residual"}
    with pytest.raises(CheckpointError, match="norm_before_residual") as err:
        from_speculators(unset, folder=Path("."), where="config.json")
    assert "vLLM 0.33.0 reads true" in err.value.found
    qwen3 = {**raw, "transformer_layer_config": {**layer, "model_type": "qwen3"}}
    with pytest.raises(CheckpointError, match="not named a Llama layer"):  # q_norm / k_norm
        from_speculators(qwen3, folder=Path("."), where="config.json")
    unnamed = {**raw, "transformer_layer_config": {k: v for k, v in layer.items() if k != "model_type"}}
    with pytest.raises(CheckpointError, match="not named a Llama layer") as err:
        from_speculators(unnamed, folder=Path("."), where="config.json")
    assert "vLLM 0.33.0 a llama one" in err.value.found
    with pytest.raises(CheckpointError, match="not an EAGLE-3 draft"):
        from_speculators({**raw, "speculators_model_type": "dflash"}, folder=Path("."), where="c")
    assert (
        tensor_name("midlayer.mlp.up_proj.weight", to="speculators", num_layers=1)
        == "layers.0.mlp.up_proj.weight"
    )
    assert tensor_name("layers.0.mlp.up_proj.weight", to="hf", num_layers=1) == "midlayer.mlp.up_proj.weight"
    assert (
        tensor_name("layers.1.hidden_norm.weight", to="hf", num_layers=2) == "midlayer.1.hidden_norm.weight"
    )
    assert (
        tensor_name("midlayer.1.hidden_norm.weight", to="speculators", num_layers=2)
        == "layers.1.hidden_norm.weight"
    )
    assert (
        tensor_name("d2t", to="hf", num_layers=1)
        == tensor_name("d2t", to="speculators", num_layers=1)
        == "d2t"
    )


# ---- convert ------------------------------------------------------------------------------------------


def test_convert_round_trip_is_byte_exact_and_loses_no_input(tmp_path, target4, hf_draft):
    """bfloat16 weights, an own embedding, int64 d2t, bool t2d: every tensor comes back with the same
    name, dtype, shape and bytes; the ids are written in each format's numbering; the input is untouched."""
    src = tmp_path / "src"
    shutil.copytree(hf_draft, src)
    w = load_file(str(src / "model.safetensors"))
    w = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in w.items()}
    w["embed_tokens.weight"] = torch.randn(384, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    save_file(w, str(src / "model.safetensors"))
    before = _digests(src)
    r = _cli("eagle3", "convert", src, "--to", "speculators", "--out", tmp_path / "s", "--verifier", target4)
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == VLLM_IDS
    verifier = cfg["speculators_config"]["verifier"]
    assert verifier["name_or_path"] == str(target4) and verifier["architectures"] == ["LlamaForCausalLM"]
    spec_names = set(raw_tensor_bytes(tmp_path / "s" / "model.safetensors"))
    assert (
        not any(k.startswith("midlayer.") for k in spec_names) and "layers.0.hidden_norm.weight" in spec_names
    )
    r = _cli("eagle3", "convert", tmp_path / "s", "--to", "hf", "--out", tmp_path / "h")
    assert r.exit_code == 0, r.output
    assert raw_tensor_bytes(tmp_path / "h" / "model.safetensors") == raw_tensor_bytes(
        src / "model.safetensors"
    )
    back = json.loads((tmp_path / "h" / "config.json").read_text())
    assert back["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == LAYERS
    assert back["eagle_aux_hidden_state_layer_ids"] == VLLM_IDS
    assert _digests(src) == before
    # refusals: a clear message, exit 2, no traceback, nothing written over an input
    for args, text in (
        (("--to", "speculators", "--out", src, "--verifier", "x"), "--out"),
        (("--to", "hf", "--out", tmp_path / "h2"), "already in the hf format"),
        (("--to", "speculators", "--out", tmp_path / "s2"), "--verifier"),
        (("--to", "gguf", "--out", tmp_path / "s3"), "hf | speculators"),
    ):
        r = _cli("eagle3", "convert", src, *args)
        assert r.exit_code == 2 and text in r.output and "Traceback" not in r.output, r.output
    r = _cli("eagle3", "convert", tmp_path / "s", "--to", "hf", "--out", tmp_path / "h")
    assert r.exit_code == 2 and "already exists" in r.output
    r = _cli("eagle3", "convert", tmp_path / "s", "--to", "hf", "--out", tmp_path / "h3", "--verifier", "x")
    assert r.exit_code == 2 and "with --to speculators only" in r.output
    manifest = json.loads((tmp_path / "h" / "specbuild.json").read_text())
    assert manifest["verifier"] == str(target4) and manifest["speculative_tokens"] == 3
    assert _digests(src) == before


def test_ids_are_converted_and_a_copied_id_list_is_another_draft(tmp_path, target4_model, hf_draft):
    """The same weights read through each format's numbering give the same draft, bit for bit; the id list
    copied from one format into the other unconverted names other layers and another draft."""
    want = _first_step(target4_model, hf_draft)
    r = _cli(
        "eagle3", "convert", hf_draft, "--to", "speculators", "--out", tmp_path / "s", "--verifier", "org/t"
    )
    assert r.exit_code == 0, r.output
    assert load_eagle3_draft(tmp_path / "s", target4_model).aux_layers == tuple(LAYERS)
    assert torch.equal(_first_step(target4_model, tmp_path / "s"), want)
    copied = _speculators_copy(hf_draft, tmp_path / "copied", vllm_ids=LAYERS)  # eagle_config ids as vLLM's
    assert load_eagle3_draft(copied, target4_model).aux_layers == (0, 1, 2)
    off = _first_step(target4_model, copied)
    assert (off - want).abs().max() > 0.1 * want.abs().max()
    theirs = _speculators_copy(hf_draft, tmp_path / "theirs", vllm_ids=VLLM_IDS)  # written elsewhere
    r = _cli("eagle3", "convert", theirs, "--to", "hf", "--out", tmp_path / "h")
    assert r.exit_code == 0, r.output
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == LAYERS  # what SGLang reads (+1 itself)
    assert torch.equal(_first_step(target4_model, tmp_path / "h"), want)
    assert torch.equal(_first_step(target4_model, theirs), want)


# ---- check and inspect ------------------------------------------------------------------------------


def _spec(tmp_path: Path, target: Path, draft: Path, *, layers=LAYERS, k: int = 3) -> Path:
    raw = {
        "name": "e3",
        "mode": "eagle3",
        "flow": "llmapi",
        "dtype": "float32",
        "target": {"model": str(target)},
        "eagle3": {
            "model": str(draft),
            **({"layers_to_capture": list(layers)} if layers is not None else {}),
        },
        "speculation": {"max_draft_len": k},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "serving": {"gpu_memory_gb": 4},
    }
    path = tmp_path / f"e3-{draft.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _rows(spec_path: Path):
    from specbuild.builder.preflight import run_checks

    report = run_checks(load_spec(spec_path))
    return report, {r.name: r for r in report.results if r.name.startswith("eagle3")}


def _variant(tmp_path: Path, hf_draft: Path, name: str, *, config=None, tensors=None, tokenizer_from=None):
    """A speculators copy of hf_draft with its config.json / tensors edited."""
    folder = _speculators_copy(hf_draft, tmp_path / name, vllm_ids=VLLM_IDS)
    if config:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config(raw)))
    if tensors:
        w = load_file(str(folder / "model.safetensors"))
        save_file(tensors(w), str(folder / "model.safetensors"))
    if tokenizer_from is not None:
        tok = json.loads((tokenizer_from / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        a, b = list(vocab)[300:302]
        vocab[a], vocab[b] = vocab[b], vocab[a]  # two ids swapped: another tokenizer, same size
        (folder / "tokenizer.json").write_text(json.dumps(tok))
    return folder


def test_check_validates_either_format_against_the_target(tmp_path, target4, hf_draft):
    spec_draft = _speculators_copy(hf_draft, tmp_path / "spec", vllm_ids=VLLM_IDS)
    for folder in (hf_draft, spec_draft):
        report, rows = _rows(_spec(tmp_path, target4, folder))
        fmt = rows.pop("eagle3: format", None)  # speculators: a warning (TensorRT-LLM / SGLang want HF)
        assert (fmt is None) == (folder == hf_draft) and (fmt is None or fmt.status == "warn")
        assert {r.status for r in rows.values()} == {"pass"}, rows
        assert report.ok and "eagle3: tokenizer" in rows
    assert "speculators format, verifier org/target" in rows["eagle3: draft"].found

    def layer_cfg(**kw):
        return lambda raw: {**raw, "transformer_layer_config": {**raw["transformer_layer_config"], **kw}}

    cases = [
        (
            {"config": lambda raw: {**raw, "eagle_aux_hidden_state_layer_ids": [2, 3, 9]}},
            LAYERS,
            "eagle3: layers captured",
            "not layers of the 4-layer target",
        ),
        ({}, [0, 1, 2], "eagle3: layers captured", "the draft was trained on [1, 2, 3]"),
        ({}, None, "eagle3: layers captured", "eagle3.layers_to_capture is unset"),
        (
            {"tensors": lambda w: {**w, "d2t": w["d2t"] + 1000}},
            LAYERS,
            "eagle3: vocabulary",
            "outside the target vocabulary",
        ),
        ({"config": layer_cfg(vocab_size=500)}, LAYERS, "eagle3: vocabulary", "target vocab_size 384"),
        (
            {"config": lambda raw: {**raw, "target_hidden_size": 32}},
            LAYERS,
            "eagle3: hidden size",
            "width 32",
        ),
        ({"tokenizer_from": target4}, LAYERS, "eagle3: tokenizer", "differs from the target's"),
        (
            {"config": lambda raw: {k: v for k, v in raw.items() if k != "norm_before_residual"}},
            LAYERS,
            "eagle3: draft",
            "norm_before_residual",
        ),
    ]
    for i, (edit, layers, row, text) in enumerate(cases):
        folder = _variant(tmp_path, hf_draft, f"bad{i}", **edit)
        report, rows = _rows(_spec(tmp_path, target4, folder, layers=layers))
        assert rows[row].status == "fail" and text in rows[row].found + rows[row].fix, (i, rows[row])
        assert not report.ok
    r = _cli("check", _spec(tmp_path, target4, tmp_path / "bad0"), "--json")
    assert r.exit_code == 1 and "Traceback" not in r.output
    found = {x["name"]: x for x in json.loads(r.stdout)["results"]}["eagle3: layers captured"]
    assert found["status"] == "fail" and found["fix"]


def test_a_full_vocabulary_draft_with_d2t_warns_for_vllm(tmp_path, target4):
    """vLLM 0.33.0 makes draft_id_to_target_id only for a reduced vocabulary but loads a d2t into it: the
    checkpoint is refused there (llama_eagle3.py, AutoWeightsLoader; read, not run)."""
    full = write_draft(tmp_path / "full", **{**SHAPE, "draft_vocab": 384}, layers=LAYERS, seed=1)
    _, rows = _rows(_spec(tmp_path, target4, full))
    assert rows["eagle3: vocabulary"].status == "warn" and "vLLM 0.33.0" in rows["eagle3: vocabulary"].found
    w = load_file(str(full / "model.safetensors"))
    save_file({k: v for k, v in w.items() if k not in ("d2t", "t2d")}, str(full / "model.safetensors"))
    _, rows = _rows(_spec(tmp_path, target4, full))
    assert rows["eagle3: vocabulary"].status == "pass"


def test_inspect_shows_either_format(tmp_path, hf_draft):
    spec_draft = _speculators_copy(hf_draft, tmp_path / "spec", vllm_ids=VLLM_IDS)
    for folder, fmt in ((hf_draft, "HF layout"), (spec_draft, "speculators")):
        r = _cli("inspect", folder, "--json")
        assert r.exit_code == 0, r.output
        e3 = json.loads(r.stdout)["eagle3"]
        assert e3["format"] == fmt and e3["vocab / draft vocab"] == "384 / 200"
        assert "[1, 2, 3] (layer outputs" in e3["aux layers"] and "ids [2, 3, 4]" in e3["aux layers"]
    assert e3["verifier"] == "org/target ['LlamaForCausalLM']" and e3["speculative tokens"] == 3
    r = _cli("inspect", spec_draft)
    assert r.exit_code == 0 and "eagle3 aux layers" in r.output


def test_inspect_checks_a_draft_against_a_target_without_a_spec(tmp_path, target4, hf_draft):
    spec_draft = _speculators_copy(hf_draft, tmp_path / "spec", vllm_ids=VLLM_IDS)
    r = _cli("inspect", spec_draft, "--target", target4, "--layers", "1,2,3", "--json")
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x["status"] for x in json.loads(r.stdout)["checks"]}
    assert rows.pop("eagle3: format") == "warn" and set(rows.values()) == {"pass"}, rows
    assert {
        "eagle3: hidden size",
        "eagle3: vocabulary",
        "eagle3: tokenizer",
        "eagle3: layers captured",
    } <= set(rows)
    r = _cli("inspect", spec_draft, "--target", target4)  # TensorRT-LLM's default would capture others
    assert r.exit_code == 1 and "eagle3.layers_to_capture is unset" in r.output, r.output
    for args, text in (
        ((target4, "--target", target4), "not an EAGLE-3 draft"),
        ((spec_draft, "--target", target4, "--layers", "1,x"), "not a list of layer ids"),
    ):
        r = _cli("inspect", *args)
        assert r.exit_code == 2 and text in r.output and "Traceback" not in r.output, r.output


# ---- import a draft trained elsewhere ---------------------------------------------------------------

TRAINED = (0, 1, 2)
PROMPTS = ["def add(a, b):", "The quick brown fox", "import os\nimport sys", "Once upon a time there"]


@pytest.fixture(scope="module")
def imported(target4, tmp_path_factory):
    """A trained draft's tensors laid out by the independent writers, in each format: what SpecForge (HF)
    and speculators would hand over. Trained by specbuild here only because no other trainer runs here."""
    from specbuild.tuning.config import Eagle3TrainConfig
    from specbuild.tuning.eagle3_train import train_eagle3

    base = tmp_path_factory.mktemp("e3import")
    prompts = base / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    trained = train_eagle3(
        Eagle3TrainConfig(
            model=str(target4),
            data=prompts,
            out=base / "trained",
            steps=40,
            batch_size=4,
            seq_len=48,
            layers=TRAINED,
            draft_vocab_size=128,
            device="cpu",
            checkpoint_every=0,
            heldout_fraction=0.0,
        )
    )
    tensors = load_file(str(trained.out / "model.safetensors"))
    shape = {**SHAPE, "draft_vocab": 128}
    hf = write_hf(base / "hf", tensors, **shape, layers=list(TRAINED))
    spec = write_speculators(base / "spec", tensors, **shape, vllm_ids=[i + 1 for i in TRAINED])
    return {"hf": hf, "speculators": spec, "prompts": prompts}


def _tune(tmp_path: Path, target: Path, draft: Path, prompts: Path) -> list[float]:
    r = _cli(
        "tune",
        _spec(tmp_path, target, draft, layers=list(TRAINED)),
        "--prompts",
        prompts,
        "--k-max",
        "3",
        "--max-tokens",
        "12",
        "--json",
    )
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["details"]["acceptance_per_position"]


def test_a_draft_trained_elsewhere_is_checked_converted_tuned_and_served(
    tmp_path, target4, target4_model, tokenizer_dir, imported
):
    params = SamplingParams(max_tokens=20, temperature=0.0)
    acceptance = {}
    for fmt, other in (("hf", "speculators"), ("speculators", "hf")):
        folder = imported[fmt]
        report, rows = _rows(_spec(tmp_path, target4, folder, layers=list(TRAINED)))
        rows.pop("eagle3: format", None)  # the speculators warning (test above)
        assert report.ok and {r.status for r in rows.values()} == {"pass"}, rows
        out = tmp_path / f"{fmt}-as-{other}"
        verifier = ("--verifier", target4) if other == "speculators" else ()
        r = _cli("eagle3", "convert", folder, "--to", other, "--out", out, *verifier)
        assert r.exit_code == 0, r.output
        assert (
            raw_tensor_bytes(out / "model.safetensors").keys()
            == raw_tensor_bytes(imported[other] / "model.safetensors").keys()
        )  # the converter's names are the other writer's
        for draft in (folder, out):
            acceptance[draft] = _tune(tmp_path, target4, draft, imported["prompts"])
            engine = ReferenceEngine(
                target4_model, method="eagle3", draft_head=draft, tokenizer_dir=tokenizer_dir, max_draft_len=3
            )
            for text in PROMPTS[:2]:
                prompt = engine.encode(text)
                got = engine.generate(prompt, params)
                assert got.token_ids == engine.generate(prompt, params, speculative=False).token_ids
                assert got.stats.draft_passes > 0
    values = list(acceptance.values())
    assert len(values[0]) == 3 and values[0][0] > 0.2, acceptance  # a trained draft on its own prompts
    assert all(v == values[0] for v in values), acceptance  # one draft, four folders: the same acceptance
