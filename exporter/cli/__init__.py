"""Who drives it: the ``vllm-headroom`` command line, one module per command."""
