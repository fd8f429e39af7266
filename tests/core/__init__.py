"""Specification of exporter/core/."""
