"""The serving engines' formats.

    export.py         `draftgym export`: vLLM speculative_config, SGLang flags and adaptive configs
    sglang_import.py  `draftgym profile-import`: SGLang's bench_speculative.py JSONL as a latency profile
    dspark_table.py   `draftgym cost-table`: SGLang's DSpark cost table from a latency profile
    vllm_counters.py  vLLM's acceptance counters
"""
