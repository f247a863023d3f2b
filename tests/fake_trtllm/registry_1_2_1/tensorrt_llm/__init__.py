"""Stand-in of tensorrt_llm 1.2.1 for the LLM-API parser tests (tests/fake_trtllm/README.md)."""

__version__ = "1.2.1"
