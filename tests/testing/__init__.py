"""Specification of exporter/testing/."""
