"""The named example queries of `draftgym query --example NAME` (docs/queries.md explains each).

Each is plain DuckDB SQL over the views `pipeline.logs.query.connect` creates.
"""
from __future__ import annotations

from pipeline.errors import DraftGymError

EXAMPLES: dict[str, str] = {
    # The per-root expectation: for every static (D, V), the mean over all logged roots p of
    # L[D, V] + 1. This is NOT the tau a replayed decode measures: replay walks p -> p + L + 1, so
    # roots right after a long acceptance are skipped (see tau_replay).
    "tau_by_depth_size": """
SELECT model, dataset, temperature, width, depth, verify_size,
       count(*)          AS n_roots,
       avg(accepted)     AS mean_accepted,
       avg(accepted + 1) AS tau_per_root
FROM acceptance_long
GROUP BY ALL
ORDER BY model, dataset, temperature, width, depth, verify_size
""",
    # vLLM's per-position acceptance rate: for a static (D, V), the rate at draft position i
    # (1..D) is the fraction of roots with L >= i. The rates sum to the mean L.
    "per_position_acceptance": """
SELECT a.model, a.dataset, a.temperature, a.width, a.depth, a.verify_size, r.i AS draft_position,
       count(*)                          AS n_roots,
       avg((a.accepted >= r.i)::DOUBLE)  AS acceptance_rate
FROM acceptance_long a
JOIN (SELECT unnest(range(1, (SELECT coalesce(max(max_depth), 0) FROM sequences) + 1))::SMALLINT AS i) r
  ON r.i <= a.depth
GROUP BY ALL
ORDER BY a.model, a.dataset, a.temperature, a.width, a.depth, a.verify_size, draft_position
""",
    # Histogram of L per depth D at V = 60 (EAGLE-3's default total_token), per root.
    "accept_hist_by_depth": """
SELECT model, dataset, temperature, width, depth, accepted,
       count(*) AS n_roots,
       count(*) / sum(count(*)) OVER (PARTITION BY model, dataset, temperature, width, depth) AS fraction
FROM acceptance_long
WHERE verify_size = 60
GROUP BY model, dataset, temperature, width, depth, accepted
ORDER BY model, dataset, temperature, width, depth, accepted
""",
    # Latency profile: median / p10 / p90 per op and parameters, in milliseconds. Several profiles
    # (rows) with the same key are combined by the median of each statistic.
    "latency_curves": """
SELECT device, model_id, op, width, verify_size, context_len, batch,
       count(*)                  AS n_profiles,
       sum(n)::BIGINT            AS n,
       1e3 * median("median")    AS median_ms,
       1e3 * median(p10)         AS p10_ms,
       1e3 * median(p90)         AS p90_ms
FROM latency
GROUP BY ALL
ORDER BY device, model_id, op, width, verify_size, context_len, batch
""",
    # The replayed tau of a static (D, V): walk each sequence p = 0 -> p + L + 1 while
    # p < new_tokens - 1 (as the simulator and the tests' replay_static do); a cycle emits
    # min(L + 1, new_tokens - 1 - p) tokens (the engine's `emitted`); tau = emitted / cycles,
    # iteration-weighted over all sequences. Needs positions 0..n-1 without gaps (others skipped).
    "tau_replay": """
WITH RECURSIVE seqs AS MATERIALIZED (
    SELECT row_number() OVER () AS k, *
    FROM (SELECT a.run_key, a.prompt_id, a.model, a.dataset, a.temperature, a.width, a.depth, a.verify_size,
                 any_value(s.new_tokens) AS new_tokens,
                 list(a.accepted ORDER BY a.position) AS ls
          FROM acceptance_long a JOIN sequences s ON a.run_key = s.run_key AND a.prompt_id = s.prompt_id
          GROUP BY ALL
          HAVING min(a.position) = 0 AND max(a.position) + 1 = count(*)
             AND count(*) >= any_value(s.new_tokens) - 1)
),
walk(k, new_tokens, ls, p, cycles, emitted) AS (
    SELECT k, new_tokens, ls, 0, 0, 0 FROM seqs
    UNION ALL
    SELECT k, new_tokens, ls, p + ls[p + 1] + 1, cycles + 1, emitted + least(ls[p + 1] + 1, new_tokens - 1 - p)
    FROM walk
    WHERE p < new_tokens - 1
)
SELECT s.model, s.dataset, s.temperature, s.width, s.depth, s.verify_size,
       count(*)                             AS n_sequences,
       sum(w.cycles)::BIGINT                AS cycles,
       sum(w.emitted)::BIGINT               AS emitted,
       sum(w.emitted) / sum(w.cycles)       AS tau
FROM walk w JOIN seqs s USING (k)
WHERE w.p >= w.new_tokens - 1
GROUP BY ALL
ORDER BY s.model, s.dataset, s.temperature, s.width, s.depth, s.verify_size
""",
    # Online runs: tau (iteration-weighted), mean L and time split per method, from `cycles`.
    "online_tau": """
SELECT method, device, width,
       count(DISTINCT (run_id, prompt_id, run)) AS n_generations,
       count(*)                                 AS cycles,
       sum(emitted) / count(*)                  AS tau,
       avg(accepted)                            AS mean_accepted,
       1e3 * avg(t_draft)                       AS draft_ms,
       1e3 * avg(t_verify)                      AS verify_ms,
       1e3 * avg(t_controller)                  AS controller_ms,
       1e3 * avg(t_cycle)                       AS cycle_ms,
       sum(emitted) / sum(t_cycle)              AS tokens_per_s_in_cycles
FROM cycles
GROUP BY ALL
ORDER BY method, device, width
""",
    # What is in the logs: committed sequences, positions and orphans per partition and run.
    "summary": """
SELECT s.model, s.dataset, s.temperature, s.run_key,
       count(*)                       AS sequences,
       sum(s.new_tokens)::BIGINT      AS new_tokens,
       any_value(s.widths)            AS widths,
       any_value(s.max_depth)         AS max_depth,
       any_value(len(s.verify_grid))  AS n_grid,
       (SELECT count(*) FROM positions p WHERE p.run_key = s.run_key)  AS position_rows,
       (SELECT count(*) FROM positions_raw p WHERE p.run_key = s.run_key
            AND NOT EXISTS (SELECT 1 FROM sequences q WHERE q.run_key = p.run_key AND q.prompt_id = p.prompt_id))
                                      AS orphan_rows
FROM sequences s
GROUP BY ALL
ORDER BY s.model, s.dataset, s.temperature, s.run_key
""",
}

EXAMPLE_HELP = {
    "tau_by_depth_size": "per-root mean of L+1 for each static (D, V) (not the replayed tau)",
    "per_position_acceptance": "vLLM per-position acceptance: fraction of roots with L >= i, i = 1..D",
    "accept_hist_by_depth": "histogram of L per depth D at V = 60",
    "latency_curves": "latency median/p10/p90 (ms) by op, W, V, context length",
    "tau_replay": "replayed tau of each static (D, V): walk p -> p + L + 1, emitted / cycles",
    "online_tau": "online cycles: tau, mean L and time split per method",
    "summary": "sequences, positions and orphan positions per partition and run",
}


def example(name: str) -> str:
    try:
        return EXAMPLES[name].strip()
    except KeyError:
        raise DraftGymError(f"no example query {name!r} (one of {', '.join(EXAMPLES)})") from None
