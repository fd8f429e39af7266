"""Specification of exporter/cli/."""
