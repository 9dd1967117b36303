"""DraftGym pipeline: the EAGLE-3 engine, head training, collection of replay logs, latency profiling.

Everything that runs the target model lives here; simulator/ and online/ import it, never the
reverse (docs/design.md, "Data flow").

    models/       the target (a Hugging Face model or the embedded SmolLM2), the EAGLE-3 head, their
                  formats and fit checks, grouped-query attention, architecture checks
    decode/       tree drafting and verification, the step shape, the one engine (engine/: every batch
                  size) and its controller hooks, the lossless rule, batched AR generation, `generate`
    train_head/   `draftgym train-draft`: an EAGLE-3 head by self-distillation and training-time test
    collect/      `draftgym collect`: per-position draft trees and acceptance tables, a Ray Data job
    logs/         the Parquet tables (schemas, checked reads), output filesystems, `draftgym query`
    profiling/    `draftgym profile`: this device's draft / verify / policy / overhead latency table
    runtime/      device clock, CPU matmul backend, environment fingerprint, cache folder, atomic writes
    metrics.py    tau, tokens/s, speedup and relative error, defined once for every report
    datasets.py   the built-in prompt sets (sharegpt, humaneval, mt-bench, gsm8k) and user files
    cli.py        the `draftgym` subcommands registered by this package
    cliargs.py    argument helpers shared by every subcommand
    errors.py     DraftGymError: one-line user-facing errors (exit status 2)
"""
