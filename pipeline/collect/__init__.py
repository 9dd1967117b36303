"""`draftgym collect`: everything the simulator needs to replay EAGLE-3 decoding exactly
(docs/design.md, "Exact counterfactual replay").

    prompt.py   collection of one prompt (the reference) or a batch of prompts: continuation,
                teacher-forced features, tree expansion at every position
    acceptance.py  a root's tree against the logged continuation: acceptance tables, per-depth distributions
    job.py      the Ray Data job and the `collect` subcommand: resume, orphan clean-up, run manifest
    actor.py    one collection actor: a model copy that collects prompt batches and writes their shards
    cluster.py  Ray set-up: embedded or RAY_ADDRESS, the code shipped in a runtime_env, pool sizing
"""
