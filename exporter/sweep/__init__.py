"""``vllm-headroom probe``: a load sweep that finds where a vLLM server stops keeping up.

The functional core, pure functions over plain data:

- :mod:`exporter.sweep.shape`: the traffic shape, the prompt and output lengths to send, from
  vLLM's own per-request histograms, a file of recorded lengths, or given explicitly;
- :mod:`exporter.sweep.plan`: the sweep plan, the load levels, arrival schedules and bounds;
- :mod:`exporter.sweep.evaluate`: what one step measured, and whether it kept within the limits;
- :mod:`exporter.sweep.knee`: the knee, the binding limit and the ceiling it is compared with;
- :mod:`exporter.sweep.report`: the terminal summary and the ``--json`` document.

The imperative shell, behind small seams that tests swap:

- :mod:`exporter.sweep.drivers`: the load drivers, the built-in async httpx client and vLLM's own
  benchmark client (``vllm bench serve`` run as a module in vLLM's environment);
- :mod:`exporter.sweep.runner`: the sweep itself, with the target's metrics read through a
  :class:`~exporter.sweep.runner.MetricsSource`, a clock and a pause;
- :mod:`exporter.sweep.figure`: the HTML or PNG report drawn with matplotlib (optional extra).
"""
