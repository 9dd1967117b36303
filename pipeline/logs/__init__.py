"""The Parquet logs (docs/design.md, "Tables").

    schema.py   table schemas and versions, hive layout, atomic writes and checked reads
    storage.py  where logs are written: a local path or a pyarrow filesystem URI (file://, s3://, gs://)
    query.py    `draftgym query`: DuckDB views and Polars scans over the logs
    query_examples.py  the named example queries (`draftgym query --example NAME`)
    candidates.py  the positions table's compact layout (schema version 3) and its expansion to scores
    compact.py  `draftgym compact-logs`: version-2 positions shards rewritten in the version-3 layout
"""
