"""Specification of exporter/sim/."""
