"""Specification of exporter/service/."""
