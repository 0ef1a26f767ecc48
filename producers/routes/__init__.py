"""Ingest's HTTP routes, one module per area."""
