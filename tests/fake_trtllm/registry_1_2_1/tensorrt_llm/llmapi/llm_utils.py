"""1.2-era serve.py imports the parser from here (tensorrt_llm/commands/serve.py, code-index 4219957788)."""

from tensorrt_llm.llmapi.llm_args import update_llm_args_with_extra_dict

__all__ = ["update_llm_args_with_extra_dict"]
