"""The vLLM 0.32.0 metric families the simulated engine serves: names, HELP texts and buckets.

Everything here is copied from a real exposition (``tests/fixtures/vllm-metrics/
vllm-0.32.0-cpu-after-load.prom``) so that the demo's ``/metrics`` is indistinguishable in shape
from a real vLLM 0.32.0 V1 server: the same ``vllm:`` family names, types, label names, HELP texts
and histogram bucket boundaries. ``tests/sim/test_exposition.py`` proves it against the capture.

Histogram bounds are either fixed lists (latencies, ``iteration_tokens_total``, preemptions) or
vLLM's ``build_1_2_5_buckets(max_model_len)`` (token counts), which depend on the served model's
``max_model_len`` exactly as in vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.core.reasons import AdmissionReason
from exporter.vllm.families import named

#: The vLLM version whose exposition the simulation reproduces.
VLLM_VERSION = "0.32.0"

# Latency buckets of vLLM V1 (vllm/v1/metrics/loggers.py), as the 0.32.0 capture shows them.
_TTFT_BOUNDS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BOUNDS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_LATENCY_BOUNDS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_ITERATION_TOKENS_BOUNDS: tuple[float, ...] = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
)  # fmt: skip
_PREEMPTIONS_BOUNDS: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
_PARAMS_N_BOUNDS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """Return vLLM's 1-2-5 bucket bounds up to ``max_value``: 1, 2, 5, 10, 20, 50, ...

    Same rule as vLLM's ``build_1_2_5_buckets``: every ``m x 10^e`` (m in 1, 2, 5) not above
    ``max_value``. For ``max_model_len`` 512 this gives 1, 2, 5, ..., 200, 500.
    """
    bounds: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(float(b) for b in bounds)
            bounds.append(value)
        exponent += 1


@dataclass(frozen=True, slots=True)
class HistogramFamily:
    """One vLLM histogram family: its name, HELP text and (finite) bucket upper bounds."""

    name: str
    documentation: str
    bounds: tuple[float, ...]


# Family names, so that the engine and the renderer cannot disagree on a spelling; each is checked
# against the table of vLLM's families (exporter.vllm.families) when this module is imported.
PROMPT_TOKENS = named("request_prompt_tokens")
GENERATION_TOKENS = named("request_generation_tokens")
ITERATION_TOKENS = named("iteration_tokens_total")
MAX_NUM_GENERATION_TOKENS = named("request_max_num_generation_tokens")
PARAMS_N = named("request_params_n")
PARAMS_MAX_TOKENS = named("request_params_max_tokens")
TIME_TO_FIRST_TOKEN = named("time_to_first_token_seconds")
INTER_TOKEN_LATENCY = named("inter_token_latency_seconds")
TIME_PER_OUTPUT_TOKEN = named("request_time_per_output_token_seconds")
E2E_LATENCY = named("e2e_request_latency_seconds")
QUEUE_TIME = named("request_queue_time_seconds")
INFERENCE_TIME = named("request_inference_time_seconds")
PREFILL_TIME = named("request_prefill_time_seconds")
DECODE_TIME = named("request_decode_time_seconds")
NUM_PREEMPTIONS = named("request_num_preemptions")
PREFILL_KV_COMPUTED = named("request_prefill_kv_computed_tokens")


def histogram_families(max_model_len: int) -> tuple[HistogramFamily, ...]:
    """Return every histogram family of vLLM 0.32.0, in the order vLLM exposes them."""
    tokens = build_1_2_5_buckets(max_model_len)
    return (
        HistogramFamily(PROMPT_TOKENS, "Number of prefill tokens processed.", tokens),
        HistogramFamily(GENERATION_TOKENS, "Number of generation tokens processed.", tokens),
        HistogramFamily(
            ITERATION_TOKENS,
            "Histogram of number of tokens per engine_step.",
            _ITERATION_TOKENS_BOUNDS,
        ),
        HistogramFamily(
            MAX_NUM_GENERATION_TOKENS,
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        ),
        HistogramFamily(PARAMS_N, "Histogram of the n request parameter.", _PARAMS_N_BOUNDS),
        HistogramFamily(
            PARAMS_MAX_TOKENS, "Histogram of the max_tokens request parameter.", tokens
        ),
        HistogramFamily(
            TIME_TO_FIRST_TOKEN, "Histogram of time to first token in seconds.", _TTFT_BOUNDS
        ),
        HistogramFamily(
            INTER_TOKEN_LATENCY, "Histogram of inter-token latency in seconds.", _ITL_BOUNDS
        ),
        HistogramFamily(
            TIME_PER_OUTPUT_TOKEN,
            "Histogram of time_per_output_token_seconds per request.",
            _ITL_BOUNDS,
        ),
        HistogramFamily(
            E2E_LATENCY,
            "Histogram of e2e request latency in seconds.",
            _REQUEST_LATENCY_BOUNDS,
        ),
        HistogramFamily(
            QUEUE_TIME,
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_LATENCY_BOUNDS,
        ),
        HistogramFamily(
            INFERENCE_TIME,
            "Histogram of time spent in RUNNING phase for request.",
            _REQUEST_LATENCY_BOUNDS,
        ),
        HistogramFamily(
            PREFILL_TIME,
            "Histogram of time spent in PREFILL phase for request.",
            _REQUEST_LATENCY_BOUNDS,
        ),
        HistogramFamily(
            DECODE_TIME,
            "Histogram of time spent in DECODE phase for request.",
            _REQUEST_LATENCY_BOUNDS,
        ),
        HistogramFamily(
            NUM_PREEMPTIONS,
            "Histogram of the number of times a request was preempted.",
            _PREEMPTIONS_BOUNDS,
        ),
        HistogramFamily(
            PREFILL_KV_COMPUTED,
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        ),
    )


#: ``finished_reason`` label values of ``vllm:request_success_total``, in vLLM's order.
FINISHED_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")

#: ``reason`` label values of ``vllm:num_requests_waiting_by_reason``.
WAITING_REASONS: tuple[str, ...] = ("capacity", "deferred")

#: ``sleep_state`` label values of ``vllm:engine_sleep_state``.
SLEEP_STATES: tuple[str, ...] = ("awake", "weights_offloaded", "discard_all")

#: ``source`` label values of ``vllm:prompt_tokens_by_source_total``.
PROMPT_TOKEN_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit", "external_kv_transfer")

#: ``source`` label values of ``vllm:prompt_tokens_cached_by_source_total``.
CACHED_TOKEN_SOURCES: tuple[str, ...] = ("device", "host", "p2p", "disk", "external_unspecified")

#: ``reason`` label values of ``vllm:admission_rejections_total`` (no ``engine`` label).
ADMISSION_REJECTION_REASONS: tuple[str, ...] = tuple(reason.value for reason in AdmissionReason)
