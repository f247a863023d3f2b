"""`deploy --engine vllm | sglang`: the lines are checked against the pinned releases' facts (vLLM 0.33.0,
SGLang 0.5.23, read from their wheels by tools/vllm_facts.py and tools/sglang_facts.py):

* vLLM: rejection_sample_method / draft_sample_method in their value lists, no `tensor_parallel_size`
  (0.33.0 raises on it), the load-aware schedule as `num_speculative_tokens_per_batch_size` whose inclusive
  ranges give the schedule's K at every batch size (vLLM's lookup: carried forward, clamped), the draft TP
  rule, Medusa refused with the last release that had it;
* SGLang: every flag of the launch line is one of 0.5.23's, steps / topk / draft tokens given together
  (draft tokens = steps + 1 at topk 1), the adaptive ladder (a ConfigMap file) only for EAGLE3 with topk 1,
  its candidate steps holding --speculative-num-steps, routed like the schedule; EAGLE refused for an
  EAGLE-3 draft; the seed at 1 and 2 nodes validates (kubernetes-validate);
* EAGLE-3 drafts: what the draft's config.json must hold for each engine, refused when it would feed the
  draft other target layers than the spec's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_deploy import SEED, validate_all

from specbuild.core.errors import DeployError


def _seed(tmp_path: Path, mode: str | None = None, **sections) -> Path:
    """The seed (model paths made absolute) with `sections` merged in; another mode drops the draft."""
    raw = yaml.safe_load(SEED.read_text())
    for key in ("target", "draft"):
        raw[key]["model"] = str(SEED.parent / raw[key]["model"])
    if mode is not None:
        raw["mode"] = mode
        del raw["draft"]
        if mode == "eagle3":
            raw["flow"] = "llmapi"
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key].update(value)
        else:
            raw[key] = value
    path = tmp_path / f"{mode or 'seed'}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _load(path):
    from specbuild.core.spec import load_spec

    return load_spec(path)


# ---- vLLM 0.33.0 ---------------------------------------------------------------------------------------


def test_vllm_schedule_is_written_as_per_batch_size_ranges(tmp_path):
    from specbuild.core.facts.vllm import vllm_facts
    from specbuild.core.perf.schedule import schedule_of
    from specbuild.deploy.vllm import SCHEDULE_KEY, serve_argv

    spec = _load(_seed(tmp_path, speculation={"schedule": {1: 5, 3: 2, 6: 0}}))
    argv = serve_argv(spec)
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    facts = vllm_facts()
    assert SCHEDULE_KEY in facts.speculative_config_keys
    ranges = cfg[SCHEDULE_KEY]
    assert ranges == [[1, 2, 5], [3, 5, 2], [6, 8, 0]]  # inclusive, first at 1, to max_batch_size 8
    # vLLM's lookup (core/facts/vllm.py dynamic rules): a batch size takes the K of its range, gaps and the
    # tail carry the last K, K above num_speculative_tokens is clamped; it must equal the schedule's K
    assert facts.dynamic["first_start"] == ranges[0][0] == 1 and facts.dynamic["k_min"] == 0
    schedule, k_max = schedule_of(spec), cfg["num_speculative_tokens"]
    for batch in range(1, spec.build.max_batch_size + 1):
        k = next(min(k, k_max) for start, end, k in ranges if start <= batch <= end)
        assert k == schedule.k_for(batch), batch
    assert "--data-parallel-size" not in argv  # data parallelism would switch the schedule off


def test_vllm_schedule_off_serves_the_target_alone(tmp_path):
    from specbuild.deploy.vllm import serve_argv

    argv = serve_argv(_load(_seed(tmp_path, speculation={"schedule": {1: 0}})))
    assert "--speculative-config" not in argv  # vLLM requires num_speculative_tokens > 0


def test_vllm_refuses_what_its_release_refuses():
    from specbuild.core.facts.vllm import vllm_facts
    from specbuild.deploy.vllm import check_speculative_config

    facts = vllm_facts()
    assert set(facts.literals["RejectionSampleMethod"]) == {"standard", "synthetic", "block", "fly"}
    assert facts.fields["draft_sample_method"]["default"] == "greedy"
    ok = {"method": "draft_model", "num_speculative_tokens": 4, "rejection_sample_method": "standard"}
    check_speculative_config(ok, target_tp=4)
    for bad, words in (
        ({"tensor_parallel_size": 1}, "is not a valid argument in the speculative_config"),
        ({"rejection_sample_method": "typical"}, "one of standard, synthetic, block, fly"),
        ({"draft_sample_method": "topk"}, "one of greedy, probabilistic"),
        ({"draft_tensor_parallel_size": 2}, "1 or the target's tensor_parallel_size"),
        ({"num_speculative_tokens_per_batch_size": [[2, 8, 4]]}, "the first range starts at 2"),
        ({"num_speculative_tokens_per_batch_size": [[1, 4, 4], [4, 8, 2]]}, "ranges overlap"),
        ({"num_speculative_tokens_per_batch_size": [[1, 8, -1]]}, "K -1 < 0"),
        ({"method": "deepseek_mtp"}, "replaces it with mtp"),
    ):
        with pytest.raises(DeployError) as exc:
            check_speculative_config({**ok, **bad}, target_tp=4)
        assert words in exc.value.found, (bad, exc.value.found)


def test_vllm_use_logits_samples_the_draft(tmp_path):
    from specbuild.deploy.vllm import speculative_config

    cfg = speculative_config(_load(_seed(tmp_path, speculation={"use_logits": True})))
    assert cfg["draft_sample_method"] == "probabilistic"


def test_vllm_medusa_refusal_names_the_last_release_with_it():
    from specbuild.core.facts.vllm import MEDUSA_LAST, release_facts, vllm_facts
    from specbuild.deploy.vllm import serve_argv

    with pytest.raises(DeployError) as exc:
        serve_argv(_load(SEED.parent / "medusa-vicuna-7b.yaml"))
    assert "0.32.0 was the last release with it" in exc.value.found and exc.value.fix
    assert "medusa" not in vllm_facts().speculative_methods
    assert ("medusa", "none in 0.33.0; last in 0.32.0", MEDUSA_LAST) in release_facts()


# ---- SGLang 0.5.23 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2])
def test_sglang_seed_line_is_the_releases(nodes):
    from specbuild.core.facts.sglang import sglang_facts
    from specbuild.deploy.sglang import sglang_manifests

    spec = _load(SEED)
    files = sglang_manifests(spec, name=spec.name, nodes=nodes, models_claim="llama")
    kinds = validate_all(files)
    assert kinds == ({"Deployment": 1, "Service": 1} if nodes == 1 else {"LeaderWorkerSet": 1, "Service": 1})
    server = files["20-sglang.yaml"][-1]
    if nodes == 1:
        pods = [server["spec"]["template"]["spec"]]
    else:
        t = server["spec"]["leaderWorkerTemplate"]
        pods = [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    facts = sglang_facts()
    for pod in pods:
        (c,) = pod["containers"]
        argv = c["command"]
        assert argv[:3] == list(facts.launch)
        assert {a for a in argv if a.startswith("--")} <= facts.server_flags
        value = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
        assert value["--model-path"] == "/models/llama-3.3-70b-instruct"
        assert value["--speculative-algorithm"] == "STANDALONE"
        assert value["--speculative-draft-model-path"] == "/models/llama-3.2-1b-instruct"
        assert (value["--speculative-num-steps"], value["--speculative-eagle-topk"]) == ("5", "1")
        assert value["--speculative-num-draft-tokens"] == "6"  # topk 1: steps + 1
        assert value["--tp-size"] == "4" and value["--max-running-requests"] == "8"
        assert "--speculative-adaptive" not in argv  # STANDALONE: SGLang would switch it off
        assert c["resources"]["limits"]["nvidia.com/gpu"] == str(4 // nodes)
        if nodes > 1:
            assert value["--nnodes"] == "$(LWS_GROUP_SIZE)" and value["--node-rank"] == "$(LWS_WORKER_INDEX)"
            assert value["--dist-init-addr"].startswith("$(LWS_LEADER_ADDRESS):")


def _eagle3(tmp_path, *, draft: dict | None, schedule=None, layers=None) -> Path:
    head = tmp_path / "e3"
    head.mkdir(parents=True)
    if draft is not None:
        (head / "config.json").write_text(json.dumps(draft))
    section = {"model": str(head)}
    if layers is not None:
        section["layers_to_capture"] = layers
    extra = {"speculation": {"max_draft_len": 5, "schedule": schedule}} if schedule else {}
    return _seed(tmp_path, "eagle3", eagle3=section, **extra)


EAGLE3_ARCH = {"architectures": ["LlamaForCausalLMEagle3"]}


def test_sglang_eagle3_adaptive_ladder_from_the_schedule(tmp_path):
    from specbuild.core.facts.sglang import sglang_facts
    from specbuild.deploy.sglang import ADAPTIVE_FILE, CONFIG_DIR, check_argv, sglang_manifests

    spec = _load(_eagle3(tmp_path, draft=EAGLE3_ARCH, schedule={1: 5, 3: 2, 6: 0}))
    files = sglang_manifests(spec, name="e3", models_claim="m")
    assert validate_all(files) == {"ConfigMap": 1, "Deployment": 1, "Service": 1}
    cm, dep = files["20-sglang.yaml"]
    ladder = json.loads(cm["data"][ADAPTIVE_FILE])
    assert ladder == {
        "1": {"candidate_steps": [5]},
        "3": {"candidate_steps": [2]},
        "6": {"candidate_steps": [0]},
    }
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    argv = c["command"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert argv[argv.index("--speculative-adaptive-config") + 1] == f"{CONFIG_DIR}/{ADAPTIVE_FILE}"
    assert {"name": "sglang-config", "mountPath": CONFIG_DIR, "readOnly": True} in c["volumeMounts"]
    ad = sglang_facts().adaptive
    assert "EAGLE3" in ad["algorithms"] and argv[argv.index("--speculative-eagle-topk") + 1] == str(
        ad["topk"]
    )
    # SGLang routes a batch size to the largest key <= it (bisect_right - 1): the schedule's own rule
    from specbuild.core.perf.schedule import schedule_of

    keys = sorted(int(k) for k in ladder)
    for batch in range(1, 9):
        slot = max([k for k in keys if k <= batch] or [keys[0]])
        assert ladder[str(slot)]["candidate_steps"] == [schedule_of(spec).k_for(batch)]
    bad = [*argv]
    bad[bad.index("--speculative-num-steps") + 1] = "4"
    bad[bad.index("--speculative-num-draft-tokens") + 1] = "5"
    with pytest.raises(DeployError, match="not among the candidate steps"):
        check_argv(bad, ladder)


def test_sglang_refuses_eagle_for_an_eagle3_draft(tmp_path):
    from specbuild.deploy.sglang import algorithm_of, launch_argv

    spec = _load(_eagle3(tmp_path, draft=EAGLE3_ARCH))
    assert algorithm_of(spec) == "EAGLE3"
    for name in ("EAGLE", "eagle", "NEXTN"):
        with pytest.raises(DeployError) as exc:
            launch_argv(spec, algorithm=name)
        assert "acceptance length of 1 token" in exc.value.expected and "EAGLE3" in exc.value.fix


def test_sglang_ngram_and_medusa(tmp_path):
    from specbuild.deploy.sglang import launch_argv, unmapped

    spec = _load(_seed(tmp_path, "ngram", ngram={"max_matching_ngram_size": 3}))
    argv = launch_argv(spec)
    assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "6"  # the last token + K=5 drafted
    assert argv[argv.index("--speculative-ngram-max-bfs-breadth") + 1] == "1"  # one chain, as TensorRT-LLM
    assert "--speculative-draft-model-path" not in argv
    assert any(u.startswith("ngram.max_matching_ngram_size") for u in unmapped(spec))
    with pytest.raises(DeployError, match="SGLang cannot serve mode medusa"):
        launch_argv(_load(SEED.parent / "medusa-vicuna-7b.yaml"))


def test_sglang_checks_unknown_flags_and_the_trio():
    from specbuild.deploy.sglang import check_argv

    base = ["python", "-m", "sglang.launch_server", "--model-path", "m"]
    check_argv([*base, "--tp-size", "2"])
    with pytest.raises(DeployError, match="--tp-sizes"):
        check_argv([*base, "--tp-sizes", "2"])
    with pytest.raises(DeployError, match="without the rest"):
        check_argv([*base, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3"])


# ---- EAGLE-3 draft folders: vLLM and SGLang read the aux-layer ids differently --------------------------


def test_eagle3_draft_ids_are_checked_per_engine(tmp_path):
    """Target 80 layers, spec ids [1, 39, 76] (TensorRT-LLM numbering: after layers 2, 40, 77; also its
    default for 80 layers). vLLM reads a top-level key first, in its numbering (+1); SGLang only
    eagle_config's, adding 1 itself."""
    from specbuild.deploy.sglang import launch_argv
    from specbuild.deploy.vllm import speculative_config

    ids = [1, 39, 76]
    sglang_style = {**EAGLE3_ARCH, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
    spec = _load(_eagle3(tmp_path / "a", draft=sglang_style, layers=ids))
    launch_argv(spec)  # SGLang: fine
    with pytest.raises(DeployError) as exc:  # vLLM would read [1, 39, 76] as its own ids: one layer early
        speculative_config(spec)
    assert '"eagle_aux_hidden_state_layer_ids": [2, 40, 77]' in exc.value.fix
    both = {**sglang_style, "eagle_aux_hidden_state_layer_ids": [2, 40, 77]}
    spec = _load(_eagle3(tmp_path / "b", draft=both, layers=ids))
    speculative_config(spec)
    launch_argv(spec)
    plain_llama = {"architectures": ["LlamaForCausalLM"], "eagle_aux_hidden_state_layer_ids": [2, 40, 77]}
    spec = _load(_eagle3(tmp_path / "c", draft=plain_llama, layers=ids))
    speculative_config(spec)  # vLLM maps LlamaForCausalLM to its EAGLE-3 class under method eagle3
    with pytest.raises(DeployError, match="would not load the draft as an EAGLE-3 model"):
        launch_argv(spec)
    # no ids anywhere: every engine's default is the same three layers as TensorRT-LLM's default
    spec = _load(_eagle3(tmp_path / "d", draft=EAGLE3_ARCH))
    speculative_config(spec)
    launch_argv(spec)
    speculative_config(_load(_eagle3(tmp_path / "e", draft=EAGLE3_ARCH, layers=ids)))  # = the default
    for run in (speculative_config, launch_argv):  # the spec asks for other layers than the default
        with pytest.raises(DeployError, match="other target layers"):
            run(_load(_eagle3(tmp_path / f"f-{run.__name__}", draft=EAGLE3_ARCH, layers=[3, 39, 76])))


def test_sglang_refuses_a_speculators_draft_and_vllm_reads_its_ids(tmp_path):
    """A speculators folder says architectures [Eagle3Speculator] ("Eagle3" in it) and keeps its ids at the
    top level in vLLM's numbering: vLLM reads it, SGLang has no such class and would not see the ids."""
    from specbuild.deploy.sglang import launch_argv
    from specbuild.deploy.vllm import speculative_config

    speculators = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "speculators_config": {"algorithm": "eagle3"},
        "eagle_aux_hidden_state_layer_ids": [2, 40, 77],
    }
    spec = _load(_eagle3(tmp_path, draft=speculators, layers=[1, 39, 76]))
    speculative_config(spec)
    with pytest.raises(DeployError, match="speculators-format") as exc:
        launch_argv(spec)
    assert "eagle3 convert" in exc.value.fix and "--to hf" in exc.value.fix


def test_readme_says_what_the_eagle3_draft_must_hold(tmp_path):
    from specbuild.deploy.eagle3_draft import DRAFT_CONTENTS
    from specbuild.deploy.readme import readme_for

    spec = _load(_eagle3(tmp_path, draft=EAGLE3_ARCH))
    for engine in ("vllm", "sglang"):
        assert DRAFT_CONTENTS[engine] in readme_for(spec, engine, {}, {}, [], nodes=1)


# ---- the data files are what the tools read from the wheels ----------------------------------------------


@pytest.mark.parametrize(
    ("package", "tool", "data"),
    [
        ("vllm-0.33.0", "tools/vllm_facts.py", "specbuild/data/vllm_0.33.0.json"),
        ("sglang-0.5.23", "tools/sglang_facts.py", "specbuild/data/sglang_0.5.23.json"),
    ],
)
def test_facts_data_regenerates_from_the_release_wheel(tmp_path, package, tool, data):
    """With SPECBUILD_WHEELS naming a folder that holds the wheel (`pip download <package> --no-deps
    --only-binary :all:`), the tool's output on it equals the committed data file byte for byte; without
    it, the data file's recorded wheel and hashes are what this test would check against."""
    import os
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[1]
    recorded = json.loads((root / data).read_text())
    assert recorded["source"]["wheel"].startswith(package) and len(recorded["source"]["wheel_sha256"]) == 64
    folder = os.environ.get("SPECBUILD_WHEELS")
    wheels = sorted(Path(folder).glob(f"{package}-*.whl")) if folder else []
    if not wheels:
        pytest.skip(f"SPECBUILD_WHEELS holds no {package} wheel (the data file was written from it)")
    (wheel,) = wheels
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith((".py", "RECORD", ".cpp"))]
        z.extractall(tmp_path, members=names)
    out = subprocess.run(
        [sys.executable, str(root / tool), str(tmp_path), str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == (root / data).read_text()
