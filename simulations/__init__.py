"""Experiment grids, reproduction tables and benchmarks built on fedapps (see the issues)."""
