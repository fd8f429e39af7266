"""vllm-headroom: KV-cache capacity and real-traffic headroom for vLLM, as Prometheus metrics."""

__version__ = "0.1.0"
