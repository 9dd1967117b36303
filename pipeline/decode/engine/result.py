"""What a batched generation returns: each prompt's row (tokens, stop reason, the steps it took part
in, its arrival, join and finish times) and the step log (one StepRecord per step, pipeline/decode/controller.py), plus the cut rule a
row stops by."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pipeline import metrics
from pipeline.decode.controller import CycleRecord, StepRecord


class Generated:
    """What every generation's record reports from its `output_ids` and `cycles` (pipeline/metrics.py):
    new tokens, and tau = sum(emitted) / cycles (None for AR, which has no cycle)."""

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def tau(self) -> float | None:
        return metrics.tau_of_cycles(self.cycles)


@dataclass
class RowResult(Generated):
    """One prompt's generation in a batched call."""

    index: int                      # the prompt's index in the call
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    stop_reason: str = ""           # 'eos' | 'max_new_tokens'
    cycles: list[CycleRecord] = field(default_factory=list)   # one per step it took part in
    arrival_s: float = 0.0          # when the request arrived, s on the call's clock (0: at the start)
    join_s: float | None = None     # when its prefill began (it took a slot)
    finish_s: float | None = None   # when its last token was emitted


@dataclass
class BatchResult:
    """Rows in prompt order, and the step log. Indexing and iteration go over the rows."""

    method: str
    rows: list[RowResult]
    steps: list[StepRecord] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_s: float = 0.0          # every row's prefill (target + head), refills included
    idle_s: float = 0.0             # waits for the next arrival skipped on the call's clock (arrivals only)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]

    def __iter__(self):
        return iter(self.rows)

    @property
    def captures(self) -> int:
        """CUDA graphs this call captured (its steps': every graph is captured inside a step; 0 without graphs)."""
        return sum(s.captures for s in self.steps)

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.rows)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def step_rows(self) -> list[dict]:
        """One dict per step (a `cycles`-style table): the record's fields, the shape's label, sums."""
        return [{**asdict(s), "shape": s.shape.label(), "accepted_sum": s.accepted_sum,
                 "emitted_sum": s.emitted_sum} for s in self.steps]


def cut(out: list[int], eos: set[int], max_new_tokens: int) -> tuple[list[int], str | None]:
    """Cut at the first EOS (kept) or at max_new_tokens; None while the row goes on."""
    for i, t in enumerate(out[:max_new_tokens]):
        if t in eos:
            return out[: i + 1], "eos"
    if len(out) >= max_new_tokens:
        return out[:max_new_tokens], "max_new_tokens"
    return out, None
