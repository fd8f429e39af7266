"""Specification of exporter/sweep/: the probe's load sweep."""
