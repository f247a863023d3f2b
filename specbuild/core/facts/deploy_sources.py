"""Where the upstream facts of `deploy --engine triton` were read (the same `Fact` records as the LLM-API
flow, core/facts/llmapi_sources.py): how TensorRT-LLM's executor places ranks on devices across nodes, and
what
the Triton backend reads from the repository. `triton_facts` lists them for `doctor --facts` and
docs/deploy.md.

The executor's rule (TensorRT-LLM C++, read at the revisions named below; the 1.2.1 commit ca88df0a is
not readable here, so inferred for 1.2.1): GPUs per node come from the engine's config.json
(`mapping.gpus_per_node`), device ids must be fewer than and below it, and rank r runs on
`deviceIds[r % len(deviceIds)]`. trtllm-build 1.x copies the checkpoint's mapping into the engine, so the
checkpoint must carry the deployment's GPUs per node (engines/trtllm/ckpt_config.py) and the repository one
node's devices (model_repo/generate.py).
"""

from __future__ import annotations

from specbuild.core.facts.llmapi_sources import INFERRED, VERIFIED, Fact

EXECUTOR_GPUS_PER_NODE = Fact(
    "NVIDIA/TensorRT-LLM",
    "cpp/tensorrt_llm/executor/executorImpl.cpp (Executor::Impl::loadModel)",
    "b35ac1b64368513d215c57d2ed01d62d910df8da",
    INFERRED,
    "gpusPerNode = jsonConfig.getGpusPerNode() (the engine's config.json); "
    "WorldConfig::mpi(gpusPerNode, tp, pp, cp, parallelConfig.getDeviceIds()); not read at the 1.2.1 commit",
)
WORLD_CONFIG_CHECKS = Fact(
    "NVIDIA/TensorRT-LLM",
    "cpp/tensorrt_llm/runtime/worldConfig.cpp (WorldConfig::WorldConfig)",
    "3c44cb974badec8966108b16054a99c0923e410d",
    INFERRED,
    "device ids: at most gpusPerNode of them, each < gpusPerNode, unique; none given: 0..gpusPerNode-1",
)
WORLD_CONFIG_DEVICE = Fact(
    "NVIDIA/TensorRT-LLM",
    "cpp/include/tensorrt_llm/runtime/worldConfig.h (WorldConfig::getDevice)",
    "14e801da3632eb71367b847e335c4f2b09098651",
    INFERRED,
    "getDevice() = mDeviceIds[mRank % getGpusPerGroup()], getGpusPerGroup() = len(mDeviceIds)",
)
BUILD_KEEPS_MAPPING = Fact(
    "NVIDIA/TensorRT-LLM",
    "tensorrt_llm/commands/build.py (build_model)",
    "65f1d1536e18aea3380e6e270e00895a709333eb",
    INFERRED,
    "1.x: the checkpoint's PretrainedConfig (mapping included) goes into the engine unchanged; the 0.x "
    "build.py @008b2b8d23af95e4e19fa6f354f9c5f6349b2bfc set mapping.gpus_per_node from --gpus_per_node "
    "(default 8), a flag the 1.x line removed",
)
BACKEND_PARAMETERS = Fact(
    "triton-inference-server/tensorrtllm_backend",
    "docs/model_config.md (gpu_device_ids, tokenizer_dir)",
    "r26.07 3bc115373ce1fde1d94891964b492449402e3a68 (r26.04 ce68ff5fd0a746eac895cfb4a5677b329c5bc707: same "
    "rows)",
    VERIFIED,
    "gpu_device_ids: comma-separated GPU ids of the model, ';' between instances, unset = all visible GPUs; "
    "tokenizer_dir: the path to the tokenizer (preprocessing, postprocessing, BLS, tensorrt_llm)",
)


def triton_facts() -> list[tuple[str, str, Fact]]:
    """(topic, value, source) for what `deploy --engine triton` writes against (TensorRT-LLM 1.2.1)."""
    return [
        ("rank -> device", "rank r runs on gpu_device_ids[r % len(gpu_device_ids)]", WORLD_CONFIG_DEVICE),
        ("device ids", "fewer than and below the engine's mapping.gpus_per_node", WORLD_CONFIG_CHECKS),
        ("GPUs per node", "read from the engine's config.json mapping.gpus_per_node", EXECUTOR_GPUS_PER_NODE),
        ("trtllm-build", "keeps the checkpoint's mapping in the engine", BUILD_KEEPS_MAPPING),
        ("repository paths", "gpu_device_ids and tokenizer_dir as the pod sees them", BACKEND_PARAMETERS),
    ]
