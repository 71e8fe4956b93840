"""bench/gpu.py's safetensors reader and writer: the fp16 weights it carries to a GPU
machine are read there by the same code, so a round trip must keep every tensor."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from bench.gpu import read_safetensors, write_safetensors
from bench.texts import sentences


def test_a_round_trip_keeps_names_dtypes_shapes_and_values(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray] = {
        "embeddings.position_ids": np.arange(12, dtype=np.int64).reshape(1, 12),
        "encoder.layer.0.attention.self.query.weight":
            np.linspace(-1, 1, 6 * 4, dtype=np.float32).reshape(6, 4).astype(np.float16),
        "pooler.dense.bias": np.array([0.5, -2.25, 3.0], dtype=np.float32),
    }
    path = tmp_path / "m.safetensors"
    write_safetensors(path, tensors)
    back = read_safetensors(path)
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype
        assert back[name].shape == t.shape
        assert np.array_equal(back[name], t)


def test_the_header_is_padded_to_eight_bytes_and_names_the_format(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"x": np.zeros(3, dtype=np.float16)})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert header["__metadata__"] == {"format": "pt"}
    assert header["x"] == {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]}
    assert len(raw) == 8 + n + 6


def test_probe_texts_are_all_different_and_continue_from_an_offset() -> None:
    texts = sentences(512)
    assert len(set(texts)) == 512
    assert sentences(8, 64) == texts[64:72]
