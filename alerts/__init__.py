"""The alert and recording rules: one table (:mod:`alerts.rules`) and its generator."""
