"""The serving engines' formats.

    export.py         `draftgym export`: vLLM speculative_config, SGLang flags and adaptive configs
    sglang_import.py  `draftgym profile-import`: SGLang's bench_speculative.py JSONL as a latency profile
"""
