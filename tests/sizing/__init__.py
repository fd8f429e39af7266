"""Specification of exporter/sizing/."""
