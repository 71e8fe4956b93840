"""Where the placer finds the worker image when KESTREL_WORKER_IMAGE is unset: the image
record the local CPU node writes (services/placer/core.py recorded_image), read at each
placement so a rebuilt node's image is used without a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kestrel.config import local_image_record
from services.placer.core import NoWorkerImage, recorded_image


def test_the_record_names_the_kestrel_image(tmp_path: Path) -> None:
    record = tmp_path / "images.json"
    record.write_text(json.dumps({"kestrel": {"ref": "kestrel.dev/kestrel:abc"},
                                  "pause": {"ref": "kestrel.dev/pause:def"}}))
    assert recorded_image(str(record)) == "kestrel.dev/kestrel:abc"
    record.write_text(json.dumps({"kestrel": {"ref": "kestrel.dev/kestrel:new"}}))
    assert recorded_image(str(record)) == "kestrel.dev/kestrel:new"


@pytest.mark.parametrize("content", [None, "not json", "[]", '{"pause": {}}'],
                         ids=["missing", "not JSON", "not an object", "no kestrel image"])
def test_an_unreadable_record_says_what_to_set(tmp_path: Path, content: str | None) -> None:
    record = tmp_path / "images.json"
    if content is not None:
        record.write_text(content)
    with pytest.raises(NoWorkerImage, match="KESTREL_WORKER_IMAGE is unset"):
        recorded_image(str(record))


def test_the_default_record_is_the_local_nodes(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    from kestrel_tools.cluster.paths import NODE, NodePaths, Paths

    monkeypatch.setenv("KESTREL_CLUSTER_DIR", str(tmp_path))
    assert local_image_record() == NodePaths(Paths(tmp_path).state / "node").images_json
    assert NODE.images_json.name == local_image_record().name
