"""The PostgreSQL layer: the one owner of onceflow's tables.

Migrations (``migrations/NNNN_*.sql``), the migrator, and every statement the product
runs on its tables live here, with typed results. The worker, ingest's admin API, the
engine, the console and the CLI call these functions; none of them writes SQL of its
own. The tools call them too; their own SQL is bench and seed SQL (rows seeded into a
scratch database, figures read for proofs and measurements) and lives in ``tools/``
(:mod:`onceflow_tools.benchsql`, :mod:`onceflow_tools.figures`), never imported by
the runtime. It imports only the shared core (and the definitions' errors).
"""
