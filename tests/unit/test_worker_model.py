"""The model worker's model: the pinned files, mean pooling, L2 norm, truncation at 256
word pieces, and the similarity figures of all-MiniLM-L6-v2."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kestrel.endpoints import MAX_INPUT_TOKENS
from services.worker.model import (
    Embedder,
    ModelError,
    find_files,
    l2_normalize,
    load,
    mean_pool,
    verify,
)


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return load(intra_op_threads=2)


def test_similar_sentences_are_close_and_unrelated_ones_are_not(embedder: Embedder) -> None:
    v = embedder.embed(["A man is eating food.", "A man is eating a piece of bread.",
                        "The girl is carrying a baby."]).vectors
    similar, unrelated = float(v[0] @ v[1]), float(v[0] @ v[2])
    print(f"\ncos(food, bread)={similar:.4f} cos(food, baby)={unrelated:.4f}")
    assert similar == pytest.approx(0.75, abs=0.03)
    assert abs(unrelated) < 0.2
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v.shape == (3, 384)


def test_a_text_over_256_word_pieces_is_cut_there_and_reported(embedder: Embedder) -> None:
    long_text = "bread " * 1000
    out = embedder.embed([long_text, "short"])
    assert out.truncated == [True, False]
    cut = embedder.tokenizer.encode(long_text)
    assert len(cut.ids) == MAX_INPUT_TOKENS
    # A text is embedded the same alone or in a padded batch.
    alone = embedder.embed(["short"]).vectors[0]
    assert np.allclose(alone, out.vectors[1], atol=1e-4)


def test_mean_pooling_counts_only_unmasked_tokens() -> None:
    hidden = np.array([[[1.0, 1.0], [3.0, 5.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]], dtype=np.int64)
    assert mean_pool(hidden, mask).tolist() == [[2.0, 3.0]]
    assert np.allclose(l2_normalize(np.array([[3.0, 4.0]], dtype=np.float32)), [[0.6, 0.8]])


def test_a_model_file_other_than_the_pinned_one_is_refused(tmp_path: Path) -> None:
    files = find_files()
    verify(files)  # the installed one is the pinned one
    shutil.copy(files.tokenizer, tmp_path / "tokenizer.json")
    (tmp_path / "model.onnx").write_bytes(files.onnx.read_bytes()[:-1] + b"\0")
    with pytest.raises(ModelError, match="is not the pinned"):
        load(str(tmp_path))
    with pytest.raises(ModelError, match="missing"):
        find_files(str(tmp_path / "nowhere"))
