"""The EAGLE-3 decoding engine at batch size 1, and its autoregressive baseline: one prompt at a
time on the one engine (pipeline/decode/engine/core.py at B = 1).

One cycle (vocabulary: docs/design.md, "Vocabulary"):

    x_0 .. x_{n-1} in the target KV cache, x_n = root (emitted, not yet run by the target)
    draft : head reads the pending entries (f_t, x_{t+1}) up to t = n-1        -> root's W children
            then up to D-1 more forwards over the W beams                      -> pool of candidates
    select: root + top V-1 pool nodes by cumulative draft log-prob             -> tree, mask, positions
    verify: one target forward over the V tree tokens on top of the cache      -> logits, hidden states
    accept: greedy or EAGLE's q = 1 sampling rule                              -> L accepted, 1 bonus
    commit: keep the accepted path's KV entries; their fused features become the head's next
            pending entries; emit L + 1 tokens.

The autoregressive baseline is the same step with no draft (V = 1) on the same caches, one token
per step, so speedups compare like with like.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline import metrics
from pipeline.models import arch
from pipeline.decode.engine.core import BatchEngine
from pipeline.decode.engine.result import Generated
from pipeline.decode.controller import Controller, CycleRecord, StaticController
from pipeline.models.head import Eagle3Head


@dataclass
class GenerationResult(Generated):
    """One generation. tau = sum(emitted) / cycles (vLLM's mean acceptance length); the first token,
    produced by the prefill, belongs to no cycle. tokens_per_s = new_tokens / wall_s, prefill included."""

    method: str
    prompt_ids: list[int]
    output_ids: list[int]           # the new tokens only
    cycles: list[CycleRecord] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_s: float = 0.0
    stop_reason: str = ""           # 'eos' | 'max_new_tokens'

    @property
    def tokens_per_s(self) -> float:
        return float(metrics.tokens_per_s(self.new_tokens, self.wall_s))

    @classmethod
    def of_row(cls, res, i: int = 0) -> GenerationResult:
        """Row i of a batched call (BatchResult) as a GenerationResult, with the call's wall and
        prefill times (at B = 1 with one prompt: the generation's own); an AR row has no cycles."""
        row = res.rows[i]
        cycles = row.cycles if res.method == "eagle3" else []
        return cls(res.method, row.prompt_ids, row.output_ids, cycles, wall_s=res.wall_s, prefill_s=res.prefill_s,
                   stop_reason=row.stop_reason)

    def summary(self) -> dict:
        return {"method": self.method, "new_tokens": self.new_tokens, "cycles": len(self.cycles),
                "tau": self.tau, "tokens_per_s": self.tokens_per_s, "wall_s": self.wall_s,
                "prefill_s": self.prefill_s, "stop_reason": self.stop_reason}


class Engine:
    """EAGLE-3 (and AR) generation for one target + one head, one prompt at a time: the batched
    engine (pipeline/decode/engine/core.py) at B = 1. One engine for every batch size:
    static caches and, on a GPU, CUDA graphs at batch 1 as at batch 64. The controller is the one
    interface of every batch size (pipeline/decode/controller.py: plan sees the StepContext of one
    row; level hooks asked after each draft level, that step drafting eagerly); the result's cycles
    are the row's CycleRecords. A plain batch-1
    loop (a growing DynamicCache) is the tests' oracle (tests/pipeline/decode/reference_engine.py): the same
    outputs cycle for cycle in fp32. On a CPU the trees run at that loop's speed and the AR step
    within 2 % of it (about 0.4 ms a step of bookkeeping the loop does not have)."""

    def __init__(self, model, head: Eagle3Head | None, eos_token_ids: set[int] | None = None):
        self._attach(BatchEngine(model, head, eos_token_ids))

    @classmethod
    def on(cls, core: BatchEngine) -> "Engine":
        """The batch-1 calls on an engine a caller also runs at B (its static stores and graphs shared):
        `validate` decodes its methods batched and collects its re-anchored texts one prompt at a time."""
        self = cls.__new__(cls)
        self._attach(core)
        return self

    def _attach(self, core: BatchEngine) -> None:
        self._core, self.model, self.head = core, core.model, core.head
        self.device, self.dtype = core.device, core.dtype
        self.window = core.window                                # sliding window (tokens), None = full attention
        self.max_positions = arch.max_positions(core.model.config)

    @property
    def eos(self) -> set[int]:
        """The token ids that end a generation (the engine's; setting it sets the engine's)."""
        return self._core.eos

    @eos.setter
    def eos(self, ids) -> None:
        self._core.eos = set(ids)

    @property
    def clock(self):
        """The engine's clock (every read waits for the device first: pipeline/runtime/clock.py);
        setting it sets the engine's (the tests' fake devices)."""
        return self._core.clock

    @clock.setter
    def clock(self, clock) -> None:
        self._core.clock = clock

    def generate_ar(self, prompt_ids: list[int], max_new_tokens: int = 128, temperature: float = 0.0,
                    seed: int = 0) -> GenerationResult:
        """Autoregressive decoding: every step off (one target forward per token, no head work), on
        the same engine, so speedups compare like with like."""
        return GenerationResult.of_row(self._core.generate_ar([list(prompt_ids)], max_new_tokens, temperature, seed, 1))

    def generate(self, prompt_ids: list[int], max_new_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                 controller: Controller | None = None) -> GenerationResult:
        """EAGLE-3 under a controller (default: the static EAGLE-3 tree every cycle)."""
        return GenerationResult.of_row(self._core.generate([list(prompt_ids)], max_new_tokens, temperature, seed,
                                                             1, controller or StaticController()))

