"""Baselines the benchmarks compare onceflow with."""
