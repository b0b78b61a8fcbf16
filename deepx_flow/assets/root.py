"""Where materialized asset versions are written: DEEPX_ASSET_ROOT, else `.deepx/assets` in
the working folder (materialization, collection of old versions, checkpoints and
`deepx-flow assets` all read it here)."""

from __future__ import annotations

from pathlib import Path

from deepx_flow.config import settings


def asset_root() -> str:
    return settings().asset_root or str(Path.cwd() / ".deepx" / "assets")
