"""pipeline/metrics.py, the figures' one home: each definition against numbers worked by hand, the
edge cases each docstring promises (no cycle, no time, a zero baseline), and arrays elementwise."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline import metrics


def test_tau_is_emitted_over_cycles_and_no_cycle_reads_as_one():
    assert float(metrics.tau(12, 5)) == pytest.approx(2.4)                # 5 cycles of L + 1 = 3, 3, 2, 2, 2
    assert float(metrics.tau(0, 0)) == 0.0                                 # no cycle: tau 0, not a division by 0
    assert metrics.tau([4, 6, 0], [4, 3, 0]).tolist() == [1.0, 2.0, 0.0]   # AR rows have tau 1


def test_tau_of_cycles_weights_by_iteration():
    cycles = [SimpleNamespace(emitted=e) for e in (4, 1, 1)]              # one long accept, two misses
    assert metrics.tau_of_cycles(cycles) == pytest.approx(2.0)             # (4 + 1 + 1) / 3, not a mean of ratios
    assert metrics.tau_of_cycles([]) is None and metrics.tau_of_cycles(iter(())) is None


def test_tokens_per_s_is_zero_without_time():
    assert float(metrics.tokens_per_s(300, 1.5)) == pytest.approx(200.0)
    out = metrics.tokens_per_s(np.array([10, 10, 10]), np.array([2.0, 0.0, -1.0]))
    assert out.tolist() == [5.0, 0.0, 0.0] and np.isfinite(out).all()


def test_speedup_and_relative_error_by_hand():
    assert metrics.speedup(150.0, 100.0) == pytest.approx(1.5) and metrics.speedup(1.0, 0.0) is None
    assert metrics.rel_error(110.0, 100.0) == pytest.approx(0.10) and metrics.rel_error(90.0, 100.0) == pytest.approx(-0.10)
    assert metrics.rel_error(1.0, 0.0) is None and metrics.rel_error(1.0, None) is None
