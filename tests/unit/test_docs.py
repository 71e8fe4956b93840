"""The front door and the docs: the README stays a front door, and every relative link
in it and in docs/ leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_a_front_door_with_both_commands() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 30_000
    assert "make demo" in text and "make test" in text


def test_the_pages_a_newcomer_is_promised_exist() -> None:
    for name in ("architecture", "operations", "benchmarks", "api", "testing", "security",
                 "reliability"):
        assert (REPO / "docs" / f"{name}.md").exists(), name
    assert (REPO / "LICENSE").read_text().startswith("\n                                 Apache")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        missing_anchor = bool(anchor) and dest.suffix == ".md" and (
            not dest.exists() or anchor not in _anchors(dest))
        if not dest.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"
