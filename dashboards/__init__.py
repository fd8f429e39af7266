"""Grafana dashboards for vllm-headroom, generated from code.

Two dashboards, built with grafana-foundation-sdk and checked in as JSON beside this package:

- ``vllm-headroom-fleet.json`` (uid ``vllm-headroom-fleet``): every instance by model, fleet
  totals, the instances nearest their ceiling and the firing alerts.
- ``vllm-headroom-instance.json`` (uid ``vllm-headroom-instance``): one instance's sizing chain,
  capacity, headroom, traffic, latency, GPU memory and exporter health.

Panel thresholds and runbook links come from the alert rule file
(``alerts/vllm-headroom.rules.yml``), read at generation time, so the dashboards and the alerts
can never disagree. Regenerate with ``python -m dashboards.generate`` (``make docs``); a test
fails when the checked-in JSON differs from what the code generates.
"""
