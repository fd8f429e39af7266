"""Specification of exporter/gpu/."""
