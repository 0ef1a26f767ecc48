"""onceflow's tools: local dev services, the demo, benchmarks, chaos, load generation,
baselines and the dashboard generator.

Not the product: a separate distribution (``tools/pyproject.toml``), never in the
application image. Its commands join the ``onceflow`` CLI through the
``onceflow.commands`` entry point group.
"""
