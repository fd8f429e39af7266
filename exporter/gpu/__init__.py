"""Where GPU memory comes from: NVML (or a recording), which GPUs are vLLM's, and vLLM's share."""
