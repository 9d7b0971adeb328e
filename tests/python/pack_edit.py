"""Editing a packed cache the way a lying or broken writer would, for the tests of what a reader
does with it (tests/python/test_pack_safety.py): a shard's safetensors header rewritten (the data
moved by as many bytes as the header grew, the manifest's offsets and sizes following, so that only
the edited field lies), a manifest field changed, a sample's bytes flipped."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any


def manifest_of(cache: Path) -> dict:
    return json.loads((cache / "manifest.json").read_text())


def write_manifest(cache: Path, manifest: dict) -> None:
    (cache / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")) + "\n")


def samples_of(manifest: dict) -> list[dict[str, Any]]:
    fields = manifest["sample_fields"]
    return [dict(zip(fields, s)) for s in manifest["samples"]]


def sample_of(cache: Path, row: int) -> dict[str, Any]:
    return next(s for s in samples_of(manifest_of(cache)) if s["row"] == row)


def set_sample_field(cache: Path, row: int, field: str, value: Any) -> None:
    manifest = manifest_of(cache)
    index = manifest["sample_fields"].index(field)
    for s in manifest["samples"]:
        if s[0] == row:
            s[index] = value
    write_manifest(cache, manifest)


def shard_header(path: Path) -> tuple[dict, int]:
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]), size


def edit_shard_header(cache: Path, row: int, edit: Callable[[dict], None]) -> None:
    """Rewrites the header of the shard holding `row` after `edit(header)` changed it (the data
    unchanged, moved after the new header), and the manifest's offsets and shard size with it."""
    manifest = manifest_of(cache)
    shard_index = sample_of(cache, row)["shard"]
    path = cache / manifest["shards"][shard_index]["file"]
    data = path.read_bytes()
    header, size = shard_header(path)
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    delta = len(text) - size
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    offset = manifest["sample_fields"].index("offset")
    for s in manifest["samples"]:
        if s[1] == shard_index:
            s[offset] += delta
    manifest["shards"][shard_index]["bytes"] = path.stat().st_size
    write_manifest(cache, manifest)


def flip_sample_byte(cache: Path, row: int) -> None:
    """One byte of the row's packed sample flipped: its checksum fails."""
    sample = sample_of(cache, row)
    shard = cache / manifest_of(cache)["shards"][sample["shard"]]["file"]
    blob = bytearray(shard.read_bytes())
    blob[sample["offset"] + sample["length"] // 2] ^= 0xFF
    shard.write_bytes(bytes(blob))
