"""The PostgreSQL layer: the one owner of onceflow's tables.

Migrations (``migrations/NNNN_*.sql``), the migrator, and every statement on the
product tables live here, with typed results. The worker, ingest's admin API, the
engine, the CLI and the tools call these functions; none of them writes SQL of its own
on a product table. It imports only the shared core (and the definitions' errors).
"""
