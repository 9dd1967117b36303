"""`draftgym train-draft`: train an EAGLE-3 draft head for a target (docs/head.md).

    train.py       the `train-draft` command and its pipeline, stage by stage
    run.py         a run's setup: data split, draft vocabulary, head, optimizer, feature caches, budget
    loop.py        one training session: steps, curve points, held-out evaluation, saving
    checkpoint.py  what `--resume` needs to go on bit-exactly, and the checks that refuse a mismatch
    batches.py     length-bucketed, deterministic, padded batches of training sequences
    config.py      TrainConfig (the CLI flags), TTT curriculum, learning-rate schedule
    data.py        train prompts, self-distilled answers (batched, resumable), the frozen dataset
    features.py    teacher-forced target features and their on-disk store
    initialise.py  a fresh head: draft vocabulary, initialisation from the target, logit-scale calibration
    ttt.py         training-time test: the unrolled draft steps of one batch and their loss;
                   `ttt_metrics`, the loss and accuracy over a set of sequences (held-out, validation)
    lineage.py     a head's history across warm starts; `draftgym head-report`
"""
