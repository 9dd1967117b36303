"""Collection: replay of the logs equals the online engine, cycle by cycle; the acceptance table by
hand; the Ray job is resumable and idempotent; bad shards fail with a clear error."""
from __future__ import annotations


import numpy as np
import torch

from pipeline.collect.acceptance import acceptance_table
from pipeline.collect.prompt import CollectConfig, collect_prompt
from pipeline.collect.job import run_collect
from pipeline.decode.controller import StaticController
from pipeline.decode.engine.single import Engine
from pipeline.models.head import random_head
from pipeline.logs.schema import read_table, table_files
from pipeline.decode.tree import DraftPool
from tests.conftest import make_tiny_llama
from tests.helpers import replay_static

GRID = (1, 2, 4, 8, 10, 20, 60)


def test_replay_equals_engine_cycle_by_cycle():
    """Walk the logs from p to p + L + 1 with a static tree: the same L per cycle and the same tokens
    as the online engine, for several targets, widths and shapes (greedy)."""
    total = same = 0
    for vocab, model_seed in [(4, 0), (4, 2), (6, 0), (64, 0)]:
        model = make_tiny_llama(vocab=vocab, hidden=16, seed=model_seed)
        head = random_head(model, seed=0)
        eng = Engine(model, head)
        cfg = CollectConfig(max_new_tokens=40, widths=(3, 4), max_depth=8, verify_grid=GRID, position_batch=7)
        for seed in range(2):
            prompt = torch.randint(0, vocab, (4,), generator=torch.Generator().manual_seed(seed)).tolist()
            log = collect_prompt(eng, head, prompt, cfg)
            assert log.output_tokens[: log.new_tokens] == eng.generate_ar(prompt, 40).output_ids
            for W in cfg.widths:
                acc = log.positions[W]["acceptance"].reshape(-1, 8, len(GRID))
                assert (log.positions[W]["position"] == np.arange(log.new_tokens - 1)).all()
                for D, V in [(8, 60), (3, 10), (5, 20), (2, 4), (1, 1)]:
                    real = eng.generate(prompt, 40, controller=StaticController(D, W, V))
                    replay = replay_static(acc, log.new_tokens, D, V, GRID)
                    total += len(real.cycles)
                    same += sum(a.accepted == L for a, (_, L) in zip(real.cycles, replay))
                    assert len(replay) == len(real.cycles)
                    # tokens: replayed positions emit the logged tokens, which the engine emitted too
                    assert real.output_ids == log.output_tokens[: log.new_tokens]
    assert same / total >= 0.995, f"{same}/{total} cycles agree"
    assert same == total  # fp32 on a CPU: no rounding flips expected at all


def test_acceptance_table_by_hand():
    """W = 2, D = 2. Pool: depth 1: a(-0.1) b(-0.5); children of a: c(-0.3) d(-0.9); of b: e(-0.6) f(-1.2).
    Continuation a, c: node a has rank 0, node c rank 1 (in the depth-2 pool). So
      D=1: L = 1 once V >= 2;   D=2: V=1 -> 0, V=2 -> 1 (only a), V >= 3 -> 2 (a and c).
    Continuation b, e: b has rank 1 at D=1 and rank 2 at D=2 (a, c better); e has rank 3.
      D=1: V=2 -> 0, V>=3 -> 1;  D=2: V<=3 -> 0, V=4 -> 1, V>=5 -> 2."""
    pool = DraftPool(tokens=torch.tensor([[10, 11, 12, 13, 14, 15]] * 2),
                     scores=torch.tensor([[-0.1, -0.5, -0.3, -0.9, -0.6, -1.2]] * 2),
                     parents=torch.tensor([[-1, -1, 0, 0, 1, 1]] * 2),
                     depths=torch.tensor([[1, 1, 2, 2, 2, 2]] * 2), width=2)
    cont = torch.tensor([[10, 12], [11, 14]])
    grid = torch.tensor([1, 2, 3, 4, 5, 7])
    L = acceptance_table(pool, cont, 2, grid)
    assert L[0].tolist() == [[0, 1, 1, 1, 1, 1], [0, 1, 2, 2, 2, 2]]
    assert L[1].tolist() == [[0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 2, 2]]


def test_acceptance_distributions_match_the_sampling_rule():
    """At T > 0 the logged P(L = l | D) equals the law of L under the engine's acceptance rule,
    estimated by running `accept_sampling` many times on the very same tree and target logits."""
    from transformers import DynamicCache

    from pipeline.decode.draft import expand_tree
    from pipeline.decode.tree import select_tree
    from pipeline.decode.verify import accept_sampling, target_forward, verify_tree

    model = make_tiny_llama(vocab=6, hidden=16, seed=3)
    head = random_head(model, seed=1)
    eng = Engine(model, head)
    cfg = CollectConfig(max_new_tokens=10, temperature=1.0, seed=5, widths=(3,), max_depth=4, verify_grid=GRID,
                        dist_verify_size=8)
    prompt = [1, 2, 3, 4]
    log = collect_prompt(eng, head, prompt, cfg)
    dists = log.positions[3]["accept_dist"]
    assert len(dists) == log.new_tokens - 1 and all(d is not None for d in dists)
    p = 2
    dist = dists[p].reshape(4, 5)
    assert np.allclose(dist.sum(1), 1.0, atol=1e-5)
    # rebuild the tree rooted at y_p exactly as the engine would, and sample its acceptance
    y = log.output_tokens
    full = prompt + y
    n = len(prompt) + p
    cache = DynamicCache(config=model.config)
    _, hs = target_forward(model, torch.tensor([full[:n]]), torch.arange(n)[None], cache)
    g, logits, kv = head(torch.tensor([full[1 : n + 1]]), head.fuse(hs), torch.arange(n))
    pool = expand_tree(head, kv, torch.ones(1, n, dtype=torch.bool), g[:, -1], logits[:, -1], torch.tensor([n - 1]), 3, 4)
    for D in (1, 2, 4):
        tree = select_tree(pool.truncate_depth(D), 0, y[p], 8)
        vlogits, _ = verify_tree(model, tree, n, cache)
        from pipeline.decode.verify import crop_cache
        crop_cache(cache, n)
        gen = torch.Generator().manual_seed(0)
        counts = np.zeros(5)
        for _ in range(3000):
            path, _ = accept_sampling(tree, vlogits.clone(), 1.0, gen)
            counts[len(path)] += 1
        tv = 0.5 * np.abs(counts / counts.sum() - dist[D - 1]).sum()
        assert tv < 0.04, (D, counts / counts.sum(), dist[D - 1])


def test_collect_at_temperature_writes_distributions(tmp_path, tiny_model_dir):
    cfg = CollectConfig(model=str(tiny_model_dir), head="random", dataset="mt-bench", split=None, n_prompts=1,
                        max_new_tokens=8, temperature=0.7, max_depth=3, widths=(2,), verify_grid=GRID, dist_every=2)
    run_collect(cfg, tmp_path, use_ray=False, progress=False)
    (f,) = table_files(tmp_path, "positions")
    assert "temperature=0.7" in str(f)
    t = read_table(f, "positions")
    d = t["accept_dist"].to_pylist()
    assert [x is None for x in d] == [pos % 2 == 1 for pos in t["position"].to_pylist()]
    assert all(abs(sum(x[i * 4 : i * 4 + 4]) - 1) < 1e-4 for x in d if x is not None for i in range(3))


def test_acceptance_distributions_batched_across_roots_equal_one_root_per_forward(monkeypatch):
    """The T > 0 distributions of many roots verified side by side in one forward (block-diagonal tree
    masks) equal those verified one root per forward (DIST_ROWS forcing one tree per forward)."""
    import pipeline.collect.acceptance as collect

    model = make_tiny_llama(vocab=6, hidden=16, seed=3)
    head = random_head(model, seed=1)
    eng = Engine(model, head)
    cfg = CollectConfig(max_new_tokens=10, temperature=1.0, seed=5, widths=(3,), max_depth=4, verify_grid=GRID,
                        dist_verify_size=8)
    together = collect_prompt(eng, head, [1, 2, 3, 4], cfg).positions[3]["accept_dist"]
    monkeypatch.setattr(collect, "DIST_ROWS", 1)
    alone = collect_prompt(eng, head, [1, 2, 3, 4], cfg).positions[3]["accept_dist"]
    assert len(together) == len(alone) == 9
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_length_groups_cap_members_and_padded_tokens():
    from pipeline.decode.engine.prefill import length_groups

    lens = [10, 10, 20, 30, 100, 250, 900]
    assert length_groups(lens, 3, 1000) == [[0, 1, 2], [3, 4, 5], [6]]           # 3 x 250 <= 1000
    assert length_groups(lens, 16, 100) == [[0, 1, 2], [3], [4], [5], [6]]     # 250 and 900 alone, over the cap
    assert [i for g in length_groups(lens, 2, 10 ** 6) for i in g] == list(range(7))
    assert length_groups([], 4, 100) == []


def test_acceptance_table_equals_tree_selection():
    """acceptance_table against the definition, on random pools with tied scores: for each (D, V),
    select the top V-1 nodes of pool[:n_D] with rank_nodes (what the engine verifies) and walk the
    continuation down the selected nodes from the root."""
    from pipeline.decode.tree import rank_nodes

    g = torch.Generator().manual_seed(3)
    W, Dmax, B = 3, 4, 40
    N = W + (Dmax - 1) * W * W
    grid = torch.tensor([1, 2, 3, 5, 8, 13, 40])
    par = [-1] * W
    for j in range(2, Dmax + 1):                                  # each level: W beams of the previous level x W
        lo_prev = 0 if j == 2 else W + (j - 3) * W * W
        n_prev = W if j == 2 else W * W
        beams = torch.randperm(n_prev, generator=g)[:W] + lo_prev
        par += [int(b) for b in beams for _ in range(W)]
    parents = torch.tensor([par] * B)
    # siblings carry distinct tokens (a beam's top-W children), drawn from 4: on-path nodes are common
    tokens = torch.stack([torch.cat([torch.randperm(4, generator=g)[:W] for _ in range(N // W)]) for _ in range(B)])
    # cumulative scores, as in a real pool: child = parent + a log-prob <= 0; steps of 0 or -0.5 give many ties
    steps = -torch.randint(0, 2, (B, N), generator=g).float() / 2
    scores = steps.clone()
    for i in range(W, N):
        scores[:, i] = scores[:, par[i]] + steps[:, i]
    depths = torch.tensor([[1] * W + [j for j in range(2, Dmax + 1) for _ in range(W * W)]] * B)
    pool = DraftPool(tokens=tokens, scores=scores, parents=parents, depths=depths, width=W)
    cont = torch.randint(0, 4, (B, Dmax), generator=g)
    cont[::7, 2:] = -1                                            # continuations that end early
    L = acceptance_table(pool, cont, Dmax, grid)
    for b in range(B):
        for D in range(1, Dmax + 1):
            n_D = W + (D - 1) * W * W
            order = rank_nodes(scores[b : b + 1, :n_D])[0].tolist()
            for v, V in enumerate(grid.tolist()):
                chosen, node, acc = set(order[: V - 1]), -1, 0
                while acc < D and cont[b, acc] >= 0:
                    kids = [i for i in chosen if par[i] == node and int(tokens[b, i]) == int(cont[b, acc])]
                    if not kids:
                        break
                    node, acc = kids[0], acc + 1
                assert int(L[b, D - 1, v]) == acc, (b, D, V)
