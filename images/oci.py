"""Write an OCI image archive from layer tarballs (stdlib only; used by images/build.sh).

The archive holds ``oci-layout``, ``index.json`` and ``blobs/sha256/*`` (OCI image
layout 1.0) and a docker-style ``manifest.json``, so both ``ctr images import`` and
``docker load`` take it. Layers are gzip-compressed with a zero mtime and the archive
entries carry fixed metadata: the same layer tarballs give the same image digest.

    python images/oci.py --ref kestrel.dev/kestrel:tag --out img.tar \\
        --layer base.tar --layer app.tar --entrypoint /usr/bin/tini --cmd python
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def _compress(layer: Path, out_dir: Path) -> tuple[str, str, int]:
    """gzip ``layer`` into out_dir; return (diff_id, blob digest, blob size).

    A layer that lives in the image cache (``<stage>/layer.tar``) keeps its compressed
    blob beside it (``layer.tar.gz`` + ``layer.tar.gz.json``), so an image whose only
    new layer is the app layer does not compress the base and deps layers again."""
    st = layer.stat()
    memo = layer.with_name(layer.name + ".gz.json")
    cached_gz = layer.with_name(layer.name + ".gz")
    if layer.name == "layer.tar" and memo.exists() and cached_gz.exists():
        m = json.loads(memo.read_text())
        if m.get("src") == [st.st_size, st.st_mtime_ns]:
            dest = out_dir / m["digest"].split(":")[1]
            try:
                os.link(cached_gz, dest)
            except OSError:
                shutil.copyfile(cached_gz, dest)
            return str(m["diff_id"]), str(m["digest"]), int(m["size"])
    diff = hashlib.sha256()
    tmp = out_dir / "layer.tmp"
    with (open(layer, "rb") as src, open(tmp, "wb") as raw,
          gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0, filename="") as gz):
        while chunk := src.read(CHUNK):
            diff.update(chunk)
            gz.write(chunk)
    blob = hashlib.sha256()
    with open(tmp, "rb") as fh:
        while chunk := fh.read(CHUNK):
            blob.update(chunk)
    digest = blob.hexdigest()
    tmp.rename(out_dir / digest)
    result = (f"sha256:{diff.hexdigest()}", f"sha256:{digest}", (out_dir / digest).stat().st_size)
    if layer.name == "layer.tar":
        shutil.copyfile(out_dir / digest, cached_gz)
        memo.write_text(json.dumps({"src": [st.st_size, st.st_mtime_ns], "diff_id": result[0],
                                    "digest": result[1], "size": result[2]}))
    return result


def _blob(out_dir: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (out_dir / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _canon(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(
    ref: str,
    out: Path,
    layers: list[Path],
    *,
    entrypoint: list[str],
    cmd: list[str],
    env: list[str],
    workdir: str,
    labels: dict[str, str],
) -> str:
    """Write the archive; return the manifest digest."""
    work = Path(tempfile.mkdtemp(prefix="oci.", dir=out.parent))
    try:
        blobs = work / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        diff_ids: list[str] = []
        layer_desc: list[dict[str, Any]] = []
        for layer in layers:
            diff_id, digest, size = _compress(layer, blobs)
            diff_ids.append(diff_id)
            layer_desc.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                               "digest": digest, "size": size})
        config = {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": entrypoint or None, "Cmd": cmd or None, "Env": env,
                       "WorkingDir": workdir or "/", "Labels": labels or None},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": [{"created": "1970-01-01T00:00:00Z",
                         "created_by": f"images/build.sh {p.parent.name}/{p.name}"}
                        for p in layers],
        }
        cfg_digest, cfg_size = _blob(blobs, _canon(config))
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": cfg_digest, "size": cfg_size},
            "layers": layer_desc,
        }
        man_digest, man_size = _blob(blobs, _canon(manifest))
        tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": man_digest, "size": man_size,
                "annotations": {"io.containerd.image.name": ref,
                                "org.opencontainers.image.ref.name": tag},
                "platform": {"architecture": "amd64", "os": "linux"},
            }],
        }
        files: dict[str, bytes | Path] = {
            "oci-layout": _canon({"imageLayoutVersion": "1.0.0"}),
            "index.json": _canon(index),
            "manifest.json": _canon([{
                "Config": f"blobs/sha256/{cfg_digest.split(':')[1]}",
                "RepoTags": [ref],
                "Layers": [f"blobs/sha256/{d['digest'].split(':')[1]}" for d in layer_desc],
            }]),
        }
        for p in sorted(blobs.iterdir()):
            files[f"blobs/sha256/{p.name}"] = p
        tmp_out = out.with_suffix(out.suffix + ".tmp")
        with tarfile.open(tmp_out, "w", format=tarfile.PAX_FORMAT) as tar:
            for d in ("blobs", "blobs/sha256"):
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                tar.addfile(info)
            for name in sorted(files):
                content = files[name]
                info = tarfile.TarInfo(name)
                info.mode, info.mtime = 0o644, 0
                if isinstance(content, Path):
                    info.size = content.stat().st_size
                    with open(content, "rb") as fh:
                        tar.addfile(info, fh)
                else:
                    info.size = len(content)
                    tar.addfile(info, io.BytesIO(content))
        os.replace(tmp_out, out)
        return man_digest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layer", action="append", type=Path, default=[])
    ap.add_argument("--entrypoint", default="", help="words separated by spaces")
    ap.add_argument("--cmd", default="", help="words separated by spaces")
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--workdir", default="/")
    ap.add_argument("--label", action="append", default=[])
    a = ap.parse_args(argv)
    labels = dict(x.split("=", 1) for x in a.label)
    digest = write_archive(a.ref, a.out, a.layer, entrypoint=a.entrypoint.split(),
                           cmd=a.cmd.split(),
                           env=a.env, workdir=a.workdir, labels=labels)
    print(f"{a.ref} manifest {digest} -> {a.out} ({a.out.stat().st_size} bytes)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
