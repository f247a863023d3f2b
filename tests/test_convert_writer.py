"""The streaming safetensors writer: readable by safetensors, hashed while written, strict about the plan."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from specbuild.core.errors import CheckpointError, ConversionError
from specbuild.engines.trtllm.sources import SafetensorsSource
from specbuild.engines.trtllm.st_writer import Entry, StreamingWriter


def test_parts_from_tensors_and_file_ranges(tmp_path):
    g = torch.Generator().manual_seed(0)
    src_tensors = {"a": torch.randn(6, 5, generator=g), "b": torch.randn(7, generator=g).to(torch.bfloat16)}
    save_file(src_tensors, tmp_path / "src.safetensors")
    src = SafetensorsSource([tmp_path / "src.safetensors"], where="test")
    entries = [Entry("x", "float32", (4, 5)), Entry("y", "bfloat16", (7,)), Entry("z", "float32", (2, 3))]
    z = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with StreamingWriter(tmp_path / "out.safetensors", entries) as w:
        w.write("x", [src.byte_range("a", (1, 3)), torch.zeros(2, 5)])  # rows 1..2 of a, then 2 zero rows
        w.write("y", [src.byte_range("b")])
        w.write("z", [z.t().contiguous().t()])  # a non-contiguous tensor is written in logical order
    back = load_file(tmp_path / "out.safetensors")
    assert torch.equal(back["x"], torch.cat([src_tensors["a"][1:3], torch.zeros(2, 5)]))
    assert torch.equal(back["y"], src_tensors["b"]) and torch.equal(back["z"], z)
    data = (tmp_path / "out.safetensors").read_bytes()
    assert w.sha256 == hashlib.sha256(data).hexdigest()
    (n,) = struct.unpack("<Q", data[:8])
    assert n % 8 == 0 and json.loads(data[8 : 8 + n])["x"]["data_offsets"] == [0, 80]


def test_a_source_range_past_the_end_of_its_file_is_an_error(tmp_path):
    """A source file that ends before a planned range (shortened after it was indexed) stops the writer
    with an error naming the file, and no digest is taken as the file's."""
    save_file({"a": torch.ones(64, 16)}, tmp_path / "src.safetensors")
    src = SafetensorsSource([tmp_path / "src.safetensors"], where="test")
    part = src.byte_range("a")
    with open(tmp_path / "src.safetensors", "r+b") as f:
        f.truncate(part.offset + part.nbytes - 4)
    with pytest.raises(ConversionError, match="src.safetensors ended early"):
        with StreamingWriter(tmp_path / "out.safetensors", [Entry("x", "float32", (64, 16))]) as w:
            w.write("x", [part])
    assert w.sha256 is None


def test_writer_refuses_what_was_not_planned(tmp_path):
    entries = [Entry("x", "float32", (2, 2)), Entry("y", "float32", (1,))]
    with pytest.raises(ConversionError, match="does not match the planned layout"):
        with StreamingWriter(tmp_path / "a.safetensors", entries) as w:
            w.write("x", [torch.zeros(2, 2, dtype=torch.float16)])
    with pytest.raises(ConversionError, match="missing 1 tensor"):
        with StreamingWriter(tmp_path / "b.safetensors", entries) as w:
            w.write("x", [torch.zeros(2, 2)])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_count_nonfinite_is_exact_across_passes(dtype):
    """The masked maximum only says whether a pass holds a NaN/Inf; the count must still be exact, on
    both sides of a pass boundary and in a short last pass."""
    import torch

    from specbuild.engines.trtllm import finite

    n = finite._CHUNK * 2 + 5  # two full passes and a short one
    t = torch.zeros(n, dtype=getattr(torch, dtype))
    spots = [0, finite._CHUNK - 1, finite._CHUNK, n - 1]
    for i, v in zip(spots, [float("nan"), float("inf"), float("-inf"), float("nan")], strict=True):
        t[i] = v
    t[7] = torch.finfo(t.dtype).max  # the largest finite value: all exponent bits but one
    raw = t.view(torch.uint8).numpy().tobytes()
    assert finite.count_nonfinite(raw, dtype) == len(spots)
    ones = torch.ones(3, dtype=t.dtype).view(torch.uint8).numpy().tobytes()
    assert finite.count_nonfinite(ones, dtype) == 0


def test_ranges_over_many_maps_and_chunks_keep_bytes_digest_and_checks(tmp_path, monkeypatch):
    """A file range passes through several maps and chunks (shrunk here to 64 and 16 bytes): the bytes and
    the digest are the source's, and a NaN and an Inf on either side of a map's end are both found."""
    from specbuild.engines.trtllm import st_writer

    monkeypatch.setattr(st_writer, "_CHUNK", 16)
    monkeypatch.setattr(st_writer, "_WINDOW", 64)
    good = torch.arange(100, dtype=torch.float32)
    bad = good.clone()
    bad[15], bad[16] = float("nan"), float("inf")  # bytes 60..67: across the first map's end (64)
    save_file({"b": good, "c": bad}, tmp_path / "src.safetensors")
    src = SafetensorsSource([tmp_path / "src.safetensors"], where="test")
    with StreamingWriter(tmp_path / "out.safetensors", [Entry("b", "float32", (100,))]) as w:
        w.write("b", [src.byte_range("b")])
    data = (tmp_path / "out.safetensors").read_bytes()
    assert w.sha256 == hashlib.sha256(data).hexdigest()
    assert torch.equal(load_file(tmp_path / "out.safetensors")["b"], good)
    with pytest.raises(CheckpointError, match="holds 2 NaN/Inf"):
        with StreamingWriter(tmp_path / "bad.safetensors", [Entry("c", "float32", (100,))]) as w:
            w.write("c", [src.byte_range("c")])
