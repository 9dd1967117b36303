"""On/off switches read from the environment (DRAFTGYM_CUDA_GRAPHS, ...)."""
from __future__ import annotations

import os

from pipeline.errors import DraftGymError

_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def env_flag(name: str) -> bool | None:
    """True / False for 1, on, true, yes / 0, off, false, no (any case); None when unset or empty;
    anything else: a one-line error naming the variable."""
    v = os.environ.get(name, "").strip().lower()
    if not v:
        return None
    if v in _ON or v in _OFF:
        return v in _ON
    raise DraftGymError(f"{name}={os.environ[name]!r}: expected one of {', '.join(_ON + _OFF)}")
