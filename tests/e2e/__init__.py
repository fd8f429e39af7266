"""End-to-end tests against a real vLLM, Prometheus and Helm."""
