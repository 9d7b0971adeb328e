"""The folders of src/draftfeed/ follow the data path: each includes only the folders before it, in
the order docs/architecture.md's table lists them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "src" / "draftfeed"


def documented_order() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return re.findall(r"^\| `([a-z_]+)/` \|", text, flags=re.MULTILINE)


def test_the_documented_order_names_every_folder_once():
    order = documented_order()
    assert len(order) == len(set(order)), order
    assert sorted(order) == sorted(p.name for p in SOURCES.iterdir() if p.is_dir())


def test_no_folder_includes_a_later_one():
    order = documented_order()
    rank = {folder: i for i, folder in enumerate(order)}
    upward = []
    for folder in order:
        for path in sorted((SOURCES / folder).iterdir()):
            for line_number, line in enumerate(path.read_text().splitlines(), 1):
                match = re.match(r'#include "draftfeed/([a-z_]+)/', line)
                if match and rank[match.group(1)] > rank[folder]:
                    upward.append(f"{path.relative_to(ROOT)}:{line_number} includes {match.group(1)}/")
    assert not upward, "\n".join(upward)


def test_source_and_batch_stand_side_by_side():
    """The sources and the copy share the sample vocabulary (sample/) and nothing of each other:
    pipeline/ joins them."""
    crossing = []
    for folder, other in (("batch", "source"), ("source", "batch")):
        for path in sorted((SOURCES / folder).iterdir()):
            for line_number, line in enumerate(path.read_text().splitlines(), 1):
                if line.startswith(f'#include "draftfeed/{other}/'):
                    crossing.append(f"{path.relative_to(ROOT)}:{line_number} includes {other}/")
    assert not crossing, "\n".join(crossing)
