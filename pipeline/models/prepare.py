"""What every engine does to the target and the head before its first forward."""
from __future__ import annotations

from pipeline.models import arch
from pipeline.runtime.attention_backends import choose_attention
from pipeline.runtime.cpu_linear import pack_linears


def prepare_modules(model, head) -> None:
    """What the engine (pipeline/decode/engine/core.py) does to the target and the head first, so AR
    and EAGLE-3 at every batch size run the same kernels:
    - refuse a target whose cache the engines cannot compact (pipeline/models/arch.py);
    - on a CPU in fp32, run the linears on oneDNN with packed weights (pipeline/runtime/cpu_linear.py:
      MKL's few-row sgemm made a 2-8 token verify cost 1.5-1.9x an AR step);
    - run every forward on the chosen SDPA kernels (pipeline/runtime/attention_backends.py: cuDNN's,
      PyTorch's first choice on Hopper, re-plans for every new shape, 9-20x slower drafts); the
      target's base model too, which the grouped prefill calls directly (pipeline/decode/engine/prefill.py)."""
    from pipeline.models.target import base_model

    arch.check_target(model)
    for m in (model, head):
        if m is not None:
            pack_linears(m)
            choose_attention(m)
    choose_attention(base_model(model))
