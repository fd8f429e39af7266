"""Where vLLM's data comes from: its HTTP API, its /metrics text, and its version."""
