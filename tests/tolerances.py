"""Numeric tolerances of the suite, each derived from a dtype's precision and the magnitude compared.

Float results differ in the last bits between CPU kernels (oneMKL GEMM blocking, ATen's AVX2 /
AVX-512 / AMX code paths, the order of a sum), so no test compares floats with an absolute constant.
A tolerance is a number of ulps (units in the last place, `torch.finfo(dtype).eps`) of the largest
magnitude of the reference: `ulps * eps * max|reference|`. `make test-isa` runs the numeric tests
under every kernel family the machine supports; the measured errors below are from those runs.
"""

from __future__ import annotations

import torch

# Two float32 computations of the same function that differ only in kernels or summation order (a KV
# cache step vs one pass, a row alone vs in a padded batch, a head computed in the engine vs by hand,
# MKL's reproducible vs its fastest GEMM). Measured on the tiny test models: 12-20 ulps of the largest
# logit (AVX2, ATen default, MKL_CBWR=COMPATIBLE), 34 ulps on the AVX-512/AMX machine where an
# absolute 1e-5 failed. 2**10 keeps 30x headroom and stays far below a real bug (a wrong mask,
# position or cache row moves logits by their own magnitude, ~2**23 ulps).
REORDER_ULPS = 2**10

# A few float32 operations on each side (a division, a normalisation, a softmax of a handful of
# values): each rounds by <= 0.5 ulp, so 16 ulps bounds the difference with margin.
FEW_OPS_ULPS = 16

# A model run in float16 / bfloat16 vs float32: weights and activations rounded to the half dtype.
# Measured 5-6 ulps of the half dtype (of the largest logit) for both; 32 allows kernels that
# accumulate differently (AVX512-BF16 / AMX) and still fails a wrong layout (errors ~ the logits).
HALF_ULPS = 2**5


def tol(reference: torch.Tensor, ulps: int, dtype: torch.dtype | None = None) -> float:
    """`ulps` ulps of `dtype` (default: the reference's) at the reference's largest magnitude."""
    eps = torch.finfo(dtype or reference.dtype).eps
    return ulps * eps * max(float(reference.detach().abs().max()), torch.finfo(torch.float32).tiny)


def assert_close(
    got: torch.Tensor, want: torch.Tensor, *, ulps: int, dtype: torch.dtype | None = None
) -> None:
    """max|got - want| <= tol(want, ulps, dtype); the failure says how many ulps were measured."""
    assert got.shape == want.shape, (got.shape, want.shape)
    got, want = got.detach(), want.detach()  # a parameter compares as its values
    err = float((got.float() - want.float()).abs().max())
    limit = tol(want, ulps, dtype)
    unit = limit / ulps
    assert err <= limit, (
        f"max |got - want| = {err:.3g} = {err / unit:.1f} ulps of the largest |want|; allowed {ulps}"
    )
