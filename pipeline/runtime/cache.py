"""The user cache folder: the dequantised embedded target, prompt-set caches, mirrored remote logs."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*sub: str) -> Path:
    """`$DRAFTGYM_CACHE` (default `~/.cache/draftgym`), joined with `sub`."""
    root = os.environ.get("DRAFTGYM_CACHE") or Path.home() / ".cache" / "draftgym"
    return Path(root).joinpath(*sub)
