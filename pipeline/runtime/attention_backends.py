"""Which SDPA kernels attention may run on: chosen here, never left to PyTorch's default order.

Why. Every attention of the target and the head goes through `torch.nn.functional.
scaled_dot_product_attention` (transformers' `sdpa`, `pipeline/models/attention.py`, the head's
`gqa_attention`). On Hopper GPUs torch's default order tries cuDNN's attention first, and cuDNN
builds a new execution plan for every new shape. EAGLE-3 changes shape at every call (each draft
level's key span grows, each verify has its own V and context), so on an H100 with the Llama-3.1-8B
shape in bf16 (torch 2.11 + cu130) the default cost

    t_draft of (8, 10, 60) at context 1024      459.8 ms   (22.1 ms with cuDNN off)
    t_verify of (8, 10, 60) at context 1024      97.2 ms   (39.1 ms)
    a whole (8, 10, 60) cycle at context 128    460.9 ms   (50.6 ms)

so every latency profile taken there taught policies never to draft deep. The choice made here:

    flash > efficient (memory-efficient) > math        cuDNN only when asked for

Flash and memory-efficient attention take any shape without planning; the math kernel is the
fallback for what neither covers (e.g. an fp32 mask on an old GPU). On a CPU torch has a flash
kernel and the math one, and picks between them as before, so nothing changes there.
`DRAFTGYM_SDPA` overrides the list (comma-separated, in priority order, from flash, efficient, math,
cudnn), e.g. `DRAFTGYM_SDPA=cudnn,flash,math` to measure cuDNN again after a torch upgrade.

How. `choose_attention(module)` hooks the module (the target CausalLM, the EAGLE-3 head), so every
forward of it, from any caller (engines, collection, profiling, training), runs inside
the switches `torch.nn.attention.sdpa_kernel(<the list>, set_priority=True)` sets; the global flags are restored when
the forward returns or raises. Inside a torch.compile trace the hooks do nothing: the caller runs
the compiled step under `attention_backends()` instead, and the trace takes the flags it sees.
The choice is recorded in the environment fingerprint (`attention`) and, on CUDA, in the device
string that keys latency profiles (`pipeline.runtime.fingerprint.device_name`).
"""
from __future__ import annotations

import contextlib
import os

import torch
from torch.nn.attention import SDPBackend

from pipeline.errors import DraftGymError

ENV = "DRAFTGYM_SDPA"
KERNELS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
           "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
DEFAULT = ("flash", "efficient", "math")
_STACK = "_draftgym_sdpa_stack"          # per module: the flags to restore, one per running forward


def chosen() -> tuple[str, ...]:
    """The kernels attention may use, in priority order: `$DRAFTGYM_SDPA` or DEFAULT."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    names = tuple(n.strip().lower() for n in raw.split(",") if n.strip())
    bad = [n for n in names if n not in KERNELS]
    if bad or not names or len(set(names)) != len(names):
        raise DraftGymError(f"{ENV} must list distinct kernels from {', '.join(KERNELS)} "
                            f"(priority order, comma-separated), got {raw!r}")
    return names


def label() -> str:
    """'sdpa flash>efficient>math': what fingerprints and CUDA device strings record."""
    return "sdpa " + ">".join(chosen())


@contextlib.contextmanager
def attention_backends():
    """Context: SDPA may use the chosen kernels only, tried in that order (for a compiled step, whose
    trace takes the flags it sees; the hooks below do the same around every eager forward)."""
    previous = _set_chosen()
    try:
        yield
    finally:
        _restore(previous)


def _enter(module, args):
    if torch.compiler.is_compiling():
        return
    module.__dict__.setdefault(_STACK, []).append(_set_chosen())


def _exit(module, args, output):
    if torch.compiler.is_compiling():
        return
    stack = module.__dict__.get(_STACK)
    if stack:
        _restore(stack.pop())


# torch's switches, by the names KERNELS uses (what sdpa_kernel sets; `overrideable` is left alone)
_SWITCHES = {n: (getattr(torch._C, f"_get_{c}_sdp_enabled"), getattr(torch._C, f"_set_sdp_use_{c}"))
             for n, c in (("flash", "flash"), ("efficient", "mem_efficient"), ("math", "math"), ("cudnn", "cudnn"))}


def _set_chosen():
    """Switch to the chosen kernels and priority; returns the previous state. The switches sdpa_kernel
    flips, without its context-manager machinery: 7 us a forward instead of 23 (the 2-core EPYC)."""
    names = chosen()
    previous = ({n: get() for n, (get, _) in _SWITCHES.items()}, torch._C._get_sdp_priority_order())
    for n, (_, put) in _SWITCHES.items():
        put(n in names)
    first = [int(KERNELS[n]) for n in names]
    torch._C._set_sdp_priority_order(first + [int(b) for b in previous[1] if int(b) not in first])
    return previous


def _restore(previous) -> None:
    enabled, priority = previous
    for n, (_, put) in _SWITCHES.items():
        put(enabled[n])
    torch._C._set_sdp_priority_order([int(b) for b in priority])


def choose_attention(module: torch.nn.Module) -> torch.nn.Module:
    """Run every forward of `module` under the chosen kernels (module docstring); idempotent. The
    exit hook also runs when the forward raises (always_call), so no flag stays changed."""
    chosen()                                          # a bad $DRAFTGYM_SDPA fails here, in one line
    if not getattr(module, "_draftgym_sdpa", False):
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_exit, always_call=True)
        module._draftgym_sdpa = True
    return module

