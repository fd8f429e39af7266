"""Test doubles and harnesses that tests, benchmarks and scripts share.

``fakevllm``: the one fake vLLM (sockets or an httpx transport, faults, replayed captures);
``processes``: the exporter as a subprocess or a thread, and waiting for servers. Nothing here
runs in production; it ships so that users' own tests can use it, as client libraries ship
theirs.
"""
