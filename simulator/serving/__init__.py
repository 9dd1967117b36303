"""Serving at batch size B: exact replay of continuous batching, per-batch-size schedules, the
engines' own rules and formats (docs/serving.md; docs/design.md, "Serving at batch size B").

    shapes.py          a step's shape (D, W, V): off, chain K, tree; what the logs can replay
    replay.py          the serving step over B rows, exact per row; the closed batch (B rows always full)
    arrivals.py        request arrival times: Poisson, a load sweep, a trace file
    load.py            continuous batching under load: queue, joins and leaves at step boundaries
    metrics.py         throughput, TPOT, time in queue, goodput, tau, drafts per step (defined once)
    choosers.py        step choosers: static, schedule, the greedy per-step hindsight oracle
    sglang_adaptive.py SGLang's adaptive EMA rule, reimplemented from its source
    sglang_throughput.py SGLang's throughput-aware rule, reimplemented from its source
    schedule.py        a schedule: batch-size ranges -> shapes, merged from tuned choices; JSON
    tune.py            `draftgym tune`: the best shape per batch size -> a schedule
    evaluate.py        `draftgym serve-eval`: AR, best static, schedule, vLLM's example, SGLang, oracle
    export.py          `draftgym export`: vLLM speculative_config, SGLang flags and adaptive config
    sglang_import.py   `draftgym profile-import`: SGLang's bench_speculative.py JSONL as a latency profile
    observations.py    the load-aware observation: B, queue, context, accept EMA, draft confidences
    env.py             the load-aware replay env: n servers under Poisson load, one shape held per decision
    learned.py         a learned load-aware policy as a step chooser (`serve-eval --policy`)
    train_load.py      `draftgym train-load`: the load-aware shape policy; method resps (PPO over a shape list)
    train_ltd.py       train-load --method ltd: a depth and a size head, PPO on the joint log-prob
    train_radar.py     train-load --method radar: stop / continue per depth level, REINFORCE with a baseline
    plots.py           the serving figures: tokens/s against B, the schedule, throughput across arrival rates
"""
