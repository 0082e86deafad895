"""Snapshot files under tests/snapshots: compare, or rewrite with KVSPEC_UPDATE_SNAPSHOTS=1."""

from __future__ import annotations

import os
from pathlib import Path

SNAPSHOTS = Path(__file__).with_name("snapshots")


def assert_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / name
    if os.environ.get("KVSPEC_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert path.exists(), f"no snapshot {name}: run with KVSPEC_UPDATE_SNAPSHOTS=1 and review it"
    assert text == path.read_text(), f"{name} changed: review, then KVSPEC_UPDATE_SNAPSHOTS=1"
