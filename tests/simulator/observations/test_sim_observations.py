"""Observations: one builder for the engine's per-step objects and the logs' batched arrays."""
from __future__ import annotations

import numpy as np
import torch

from pipeline.decode.controller import CycleRecord
from pipeline.decode.tree import DraftStep
from simulator.observations import paper
from tests.helpers import ltd_depth_obs_from_step, resps_obs_from_record
from tests.simulator.conftest import syn, syn_root  # noqa: F401


def test_depth_obs_step_equals_batched(syn):
    logs, _ = syn
    W = 10
    wa = logs.w[W]
    rows = np.arange(0, logs.n_positions, 7)
    for d in (1, 2, 5):
        batched = paper.ltd_depth_obs(wa.candidate_scores[rows, d - 1], d, logs.context_len[rows], W)
        fast = paper.ltd_depth_obs(wa.sorted_candidates[rows, d - 1], d, logs.context_len[rows], W, presorted=True)
        assert np.array_equal(batched, fast) and batched.dtype == np.float32
        assert batched.shape == (len(rows), W * W + 2)
        r = rows[3]
        k = W if d == 1 else W * W                              # the engine gives [W] after forward 1
        step = DraftStep(depth=d, width=W, beam_scores=torch.from_numpy(wa.beam_scores[r, d - 1]),
                         candidate_scores=torch.from_numpy(wa.candidate_scores[r, d - 1, :k]),
                         entropy=torch.from_numpy(wa.entropy[r, d - 1]), context_len=int(logs.context_len[r]))
        assert np.array_equal(ltd_depth_obs_from_step(step), batched[3])
    o = batched[0]
    assert (np.diff(o[: W * W]) <= 0).all() and o[W * W] == 5 and o[-1] == logs.context_len[rows[0]] / 1000


def test_size_obs_pool_equals_levels(syn):
    logs, _ = syn
    W, Dm = 10, logs.max_depth
    wa = logs.w[W]
    r, D = 11, 4
    c = wa.candidate_scores[r]
    pool = np.concatenate([c[0, :W], c[1:D].reshape(-1)])       # DraftPool.scores order
    from_pool = paper.ltd_size_obs_from_pool(torch.from_numpy(pool), W, D, int(logs.context_len[r]), Dm)
    from_logs = paper.ltd_size_obs(wa.sorted_candidates[[r]], D, logs.context_len[[r]], W, Dm, presorted=True)[0]
    assert np.array_equal(from_pool, from_logs)
    assert from_pool.shape == (paper.ltd_size_obs_dim(W, Dm),)
    assert (from_pool[W + (D - 1) * W * W: -2] == paper.SCORE_FLOOR).all()   # undrafted levels are padding
    assert from_pool[-2] == D


def test_batch1_builders_equal_batched(syn):
    """The online controller's batch-1 builders (ltd_depth_obs_one, ltd_size_obs_parts) give the
    batched builders' vectors bit for bit, also for NaN, +-inf, values above 0 and below the floor."""
    logs, _ = syn
    W, Dm = 10, logs.max_depth
    wa = logs.w[W]
    rng = np.random.default_rng(0)
    for r in (0, 11, 40):
        for d in (1, 2, 5):
            k = W if d == 1 else W * W
            c = wa.candidate_scores[r, d - 1, :k].copy()
            if r == 40:                                    # the edge cases clean_scores handles
                c[rng.choice(k, 4, replace=False)] = [np.nan, -np.inf, np.inf, -1e9]
                c[0] = 0.25
            ref = paper.ltd_depth_obs(c[None], d, np.array([int(logs.context_len[r])]), W)[0]
            assert np.array_equal(paper.ltd_depth_obs_one(c, d, int(logs.context_len[r]), W), ref)
        c = wa.candidate_scores[r]
        for D in (1, 2, 4, Dm):
            pool = np.concatenate([c[0, :W], c[1:D].reshape(-1)]).astype(np.float32)
            if r == 40:
                pool[rng.choice(len(pool), 3, replace=False)] = [np.nan, -np.inf, 0.5]
            ref = paper.ltd_size_obs_from_pool(pool, W, D, int(logs.context_len[r]), Dm)
            live, tail = paper.ltd_size_obs_parts(pool, W, D, int(logs.context_len[r]), Dm)
            assert len(live) == W + (D - 1) * W * W
            assert np.array_equal(live, ref[: len(live)]) and np.array_equal(tail, ref[-2:])
            assert (ref[len(live): -2] == paper.SCORE_FLOOR).all()
    for r in (0, 40):
        for d in (1, 3):
            b = wa.beam_scores[r, d - 1].copy()
            b[[1, 4]] = [np.nan, -np.inf]
            assert np.array_equal(paper.radar_obs_one(b, W), paper.radar_obs(b[None], W)[0])
            assert np.array_equal(paper.radar_obs_one(b[:6], W), paper.radar_obs(b[None, :6], W)[0])   # padded
    try:
        paper.ltd_size_obs_parts(np.zeros(W + 5, np.float32), W, 2, 10, Dm)
    except ValueError as e:
        assert "depth-2 width-10 pool" in str(e)
    else:
        raise AssertionError("a short pool must be refused")


def test_radar_and_resps_obs(syn):
    logs, _ = syn
    x = paper.radar_obs(logs.beam_scores[:50, 2])
    assert x.shape == (50, 10) and (x >= 0).all() and (x <= 1).all() and (np.diff(x, axis=1) <= 0).all()
    rec = CycleRecord(step=0, batch_size=1, depth=5, width=8, verify_size=50, accepted=3, emitted=4, context_len=100)
    one = resps_obs_from_record(rec, torch.tensor([-0.1, -2.0, -3.0]), 104)
    assert one.shape == (paper.RESPS_DIM,) and one.dtype == np.float32
    assert one[0] == np.float32(-0.1) and one[3] == paper.SCORE_FLOOR and one[-1] == 1
    none = resps_obs_from_record(None, None, 104)
    assert none[-1] == 0 and (none[paper.RESPS_ROOT_K:-2] == 0).all()
    batch = paper.resps_obs(np.tile([-0.1, -2.0, -3.0], (2, 1)), [3, 0], [5, 0], [50, 0], [8, 0], [4, 0], [104, 104],
                        [1, 0])
    assert np.array_equal(batch[0], one) and np.array_equal(batch[1], none)


def test_size_actions_and_heuristic_stats():
    assert list(paper.SIZE_ACTIONS) == list(range(20, 241, 20))           # LTD size action a -> V = 20 + 20 a
    assert paper.best_beam_score([[-0.5, -0.2, np.nan]]).tolist() == [np.float32(-0.2)]
    assert paper.best_beam_entropy([[0.7, np.nan]]).tolist() == [np.float32(0.7)]
