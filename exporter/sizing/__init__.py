"""The sizing model: what a deployment's KV cache holds, from a model's shape and a GPU."""
