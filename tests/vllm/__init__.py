"""Specification of exporter/vllm/."""
