"""Latency model: exact at measured points, interpolation, noise, RADAR constants, errors."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import DataError
from pipeline.logs.schema import read_table, table_files
from simulator.latency.model import LatencyModel
from simulator.logs.synthetic import latency_rows, write_latency
from tests.simulator.conftest import syn, syn_root  # noqa: F401


def test_exact_at_measured_points(syn_root):
    lat = LatencyModel.from_logs(syn_root, point="median")
    rows = [r for f in table_files(syn_root, "latency") for r in read_table(f, "latency").to_pylist()]
    for r in rows:
        if r["op"] == "draft_step":
            assert lat.t_draft(r["width"], r["context_len"]) == pytest.approx(r["median"], rel=1e-12)
        elif r["op"] == "verify":
            assert lat.t_verify(r["verify_size"], r["context_len"]) == pytest.approx(r["median"], rel=1e-12)
        elif r["op"] == "overhead":
            assert lat.t_overhead(r["context_len"]) == pytest.approx(r["median"], rel=1e-12)
        elif r["op"] == "prefill":
            assert lat.t_prefill(r["context_len"]) == pytest.approx(r["median"], rel=1e-12)
        else:
            assert lat.t_policy() == pytest.approx(r["median"])
    med = LatencyModel.from_logs(syn_root, point="mean")         # the mean is available too
    r = next(r for r in rows if r["op"] == "verify")
    assert med.t_verify(r["verify_size"], r["context_len"]) == pytest.approx(r["mean"], rel=1e-12)
    rep = lat.fit_report()
    assert all(rep["ops"][op]["in_sample_max_rel_err"] < 1e-12 for op in ("draft_step", "verify", "overhead"))
    assert rep["ops"]["verify"]["loo_points"] > 0 and rep["ops"]["verify"]["loo_mean_rel_err"] < 0.01


def test_piecewise_linear_between_points(tmp_path):
    rows = [r for r in latency_rows("m", "cpu", widths=(10,), verify_grid=(1, 60), contexts=(100, 300))]
    lat = LatencyModel.from_rows(rows, point="median")
    pt = {(r["verify_size"], r["context_len"]): r["median"] for r in rows if r["op"] == "verify"}
    mid_v = (pt[(1, 100)] * (1 - 29 / 59) + pt[(60, 100)] * (29 / 59))
    assert lat.t_verify(30, 100) == pytest.approx(mid_v)
    assert lat.t_verify(60, 200) == pytest.approx((pt[(60, 100)] + pt[(60, 300)]) / 2)
    assert lat.t_verify(60, 5000) == pytest.approx(pt[(60, 300)])      # flat beyond the measured range
    # vectorised, broadcasting
    v = lat.t_verify(np.array([[1], [60]]), np.array([100, 300]))
    assert v.shape == (2, 2) and v[1, 1] == pytest.approx(pt[(60, 300)])


def test_scaled_is_a_slower_machine():
    """scaled(f): every engine op (draft, verify, overhead; central value and quantiles) x f, policy
    costs unchanged; what validate's time-local clock uses for drift."""
    lat = LatencyModel.from_rows(latency_rows("m", "cpu", widths=(10,), verify_grid=(1, 60), contexts=(100, 300)))
    lat.policy_costs["k"] = 0.003
    s = lat.scaled(1.25)
    for v, c in ((1, 100), (30, 200), (60, 300)):
        assert s.t_verify(v, c) == pytest.approx(1.25 * lat.t_verify(v, c))
        assert s.verify(v, c, "p90") == pytest.approx(1.25 * lat.verify(v, c, "p90"))
    assert s.t_draft(10, 150) == pytest.approx(1.25 * lat.t_draft(10, 150))
    assert s.t_overhead(100) == pytest.approx(1.25 * lat.t_overhead(100))
    assert s.policy_s == lat.policy_s and s.call_s("k") == 0.003
    assert s.meta["speed_factor"] == 1.25 and "speed_factor" not in lat.meta


def test_noise_matches_measured_quantiles():
    lat = LatencyModel.from_rows(latency_rows("m", "cpu", widths=(10,), contexts=(512,)))
    rng = np.random.default_rng(0)
    x = lat.t_verify(np.full(40_000, 60), 512, rng)
    med = lat.t_verify(60, 512)                                  # the central value
    row = next(r for r in latency_rows("m", "cpu", widths=(10,), contexts=(512,))
               if r["op"] == "verify" and r["verify_size"] == 60)
    assert np.quantile(x, 0.1) == pytest.approx(row["p10"], rel=0.01)
    assert np.quantile(x, 0.9) == pytest.approx(row["p90"], rel=0.01)
    assert np.median(x) == pytest.approx(med, rel=0.01)


def test_constants_and_radar_mapping():
    lat = LatencyModel.from_constants(draft_step=0.01, verify=0.1, verify_per_token=0.001, policy=0.002,
                                      overhead=0.005, per_context=1e-6)
    assert lat.t_draft(10, 1000) == pytest.approx(0.011)
    assert lat.t_verify(60, 0) == pytest.approx(0.16)
    T0, Tf, Teye = lat.radar_constants(1000, width=10, verify_size=60)
    assert (T0, Tf, Teye) == pytest.approx((0.161 + 0.005, 0.011, 0.002))
    for t in range(1, 9):
        eye = t + 1 if t < 8 else t
        assert lat.radar_tgen(t, 1000) == pytest.approx(T0 + Tf * t + Teye * eye)
    # V is clamped to the pool: D = 1, W = 2 has 2 candidates -> V_eff = 3
    assert lat.t_cycle(1, 2, 60, 0) == pytest.approx(0.01 + 0.1 + 0.003 + 0.005)
    assert lat.t_ar(0) == pytest.approx(0.106)


def test_latency_errors(tmp_path):
    with pytest.raises(DataError, match="no latency table"):
        LatencyModel.from_logs(tmp_path)
    write_latency(tmp_path, latency_rows("m", "cpu", profile_id="p1"))
    write_latency(tmp_path, latency_rows("m", "gpu", profile_id="p2"))
    lat = LatencyModel.from_logs(tmp_path)
    assert lat.meta["profile_id"] == "p2" and "newest" in lat.meta["note"]
    assert LatencyModel.from_logs(tmp_path, profile="p1").meta["profile_id"] == "p1"
    with pytest.raises(DataError, match="not found"):
        LatencyModel.from_logs(tmp_path, profile="p3")
    with pytest.raises(DataError, match="no batch-1 latency rows"):
        LatencyModel.from_logs(tmp_path, model="other")
    # a device filter picks that device's newest profile, or names the devices that have one
    dev = latency_rows("m", "cpu", profile_id="p1")[0]["device"]
    assert LatencyModel.from_logs(tmp_path, device=dev).meta["profile_id"] == "p1"
    with pytest.raises(DataError, match="no latency profile for device 'tpu'.*--profile-first"):
        LatencyModel.from_logs(tmp_path, device="tpu")


def test_plot(tmp_path, syn):
    _, lat = syn
    lat.plot(tmp_path / "lat.png")
    assert (tmp_path / "lat.png").stat().st_size > 1000


def test_per_policy_cost_rows():
    """'policy:<key>' rows (draftgym profile-policy) replace the generic policy op for that checkpoint only."""
    from simulator.replay import call_seconds

    rows = latency_rows("m", "cpu", widths=(10,), contexts=(512,))
    generic = [r for r in rows if r["op"] == "policy"][0]["mean"]     # one cell: robust = its mean
    rows.append({**rows[0], "op": "policy:ltd-0123456789", "median": 0.0013, "mean": 0.0013, "p10": 0.0012,
                 "p90": 0.0015})
    lat = LatencyModel.from_rows(rows)
    assert lat.call_s("ltd-0123456789") == pytest.approx(0.0013)
    assert lat.call_s("other-key") == lat.call_s(None) == pytest.approx(generic)

    class P:
        call_cost, latency_key = "model", "ltd-0123456789"
    assert call_seconds(P(), lat) == pytest.approx(0.0013)
    P.call_cost = 0.0
    assert call_seconds(P(), lat) == 0.0
    assert lat.fit_report()["ops"]["policy"]["per_policy_s"] == {"ltd-0123456789": pytest.approx(0.0013)}


def test_tabulated_surface_is_the_interpolation_bit_for_bit():
    from simulator.latency.surface import Surface

    rng = np.random.default_rng(0)
    x = np.repeat([1, 4, 10, 60, 240], 3)
    ctx = np.tile([64, 512, 2048], 5)
    s = Surface(x, ctx, rng.random(15), rng.random(15) * 0.5, 1 + rng.random(15))
    qx, qc = rng.integers(0, 300, 5000), rng.integers(0, 3000, 5000)
    for stat in ("median", "p10", "p90"):
        direct = s._interp(qx.astype(float), qc.astype(float), stat)
        assert np.array_equal(s(qx, qc, stat), direct)                 # from the table (integer inputs)
        assert np.array_equal(s(qx.astype(float), qc, stat), direct)   # float inputs: interpolated
        assert stat in s._tables
    assert np.array_equal(s(qx + 0.5, qc, "median"), s._interp(qx + 0.5, qc.astype(float), "median"))  # off-grid x
