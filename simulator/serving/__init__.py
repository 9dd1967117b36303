"""Serving at batch size B: exact replay of continuous batching, per-batch-size schedules, the
engines' own rules and formats (docs/serving.md; docs/design.md, "Serving at batch size B"); `draftgym serve-eval`, which compares every
way of choosing, learned policies included, is simulator/serve_eval.py.

    inputs.py        the logs and latency profile a serving command reads; the shapes they can replay and
                     price (the step shape itself is pipeline/decode/step_shape.py)
    replay.py        the serving step over B rows, exact per row; the closed batch (B rows always full)
    arrivals.py      request arrival times: Poisson, a load sweep, a trace file
    load.py          continuous batching under load: queue, joins and leaves at step boundaries; the
                     switching price
    metrics.py       throughput, TPOT, time in queue, goodput, tau, drafts per step (defined once)
    choosers/        who picks a step's shape: static, schedule, oracle, SGLang's rules, Nightjar's bandit, learned;
                     per-request budgets (vLLM's adaptive verification, SGLang's DSpark, DraftGym's learned budget)
    schedule.py      a schedule: batch-size ranges -> shapes, merged from tuned choices; JSON
    tune.py          `draftgym tune`: the best shape per batch size -> a schedule (the command and its library)
    context_axis.py  `tune --context-bins`: does choosing the shape by context as well as B pay
    formats/         the engines' formats: `draftgym export` (vLLM, SGLang), `profile-import` (SGLang bench)
    observations.py  the load-aware observation: B, queue, context, accept EMA, draft confidences
    env.py           the load-aware replay env: n servers under Poisson load, one shape held per decision
    plots.py         the serving figures: tokens/s against B, the schedule, throughput across arrival rates
"""
