"""Benchmarks: run from the repository root, e.g. ``python -m benchmarks.parse``."""
