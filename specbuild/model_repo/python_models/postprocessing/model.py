"""Triton Python model `postprocessing`: token ids -> text (HF tokenizer, never trust_remote_code).

TOKENS_BATCH [b, beams, T] with SEQUENCE_LENGTH [b, beams] -> OUTPUT [b * beams] (BYTES, flat as
upstream: a client reads `as_numpy("text_output")[0].decode()`). Each response is detokenized on its own
(streamed chunks carry new tokens only). OUTPUT_IDS / OUTPUT_SEQUENCE_LENGTH pass the tokens through
(specbuild additions, tensors.POSTPROCESSING_EXTRA_OUTPUTS) so the ensemble can return them.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from lifeline import start_in_stub  # noqa: E402
from words import flag, param  # noqa: E402


def _cancelled(request) -> bool:
    try:
        return bool(request.is_cancelled())
    except Exception:  # noqa: BLE001 - a stub without cancellation support
        return False


class TritonPythonModel:
    def initialize(self, args):
        start_in_stub(args["model_name"])  # ends this process if tritonserver dies (lifeline.py)
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        self.skip_special_tokens = flag(param(config, "skip_special_tokens", "true"))
        self.tokenizer = AutoTokenizer.from_pretrained(
            param(config, "tokenizer_dir"), legacy=False, trust_remote_code=False
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            if _cancelled(
                request
            ):  # an ensemble step scheduled after its request was cancelled: write nothing
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            "postprocessing: the request was cancelled",
                            getattr(pb_utils.TritonError, "CANCELLED", 1),
                        )
                    )
                )
                continue
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()  # [b, beams, T]
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()  # [b, beams]
            if tokens.ndim == 2:  # [b, T]: a caller that dropped the beam dim
                tokens, lengths = tokens[:, None, :], lengths.reshape(-1, 1)
            text = np.empty(lengths.shape, dtype=object)  # [b, beams]
            for i in range(tokens.shape[0]):
                for j in range(tokens.shape[1]):
                    ids = tokens[i, j, : int(lengths[i, j])].tolist()
                    text[i, j] = self.tokenizer.decode(
                        ids, skip_special_tokens=self.skip_special_tokens
                    ).encode()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", text.reshape(-1)),  # [b * beams]
                        pb_utils.Tensor("OUTPUT_IDS", tokens.astype(np.int32)),  # [b, beams, T]
                        pb_utils.Tensor("OUTPUT_SEQUENCE_LENGTH", lengths.astype(np.int32)),  # [b, beams]
                    ]
                )
            )
        return responses
