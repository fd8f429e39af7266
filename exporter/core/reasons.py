"""Every bounded word the exporter uses as a label value: sources, reasons, states, outcomes.

Failure is data here: a source that fails says *why* with one of these words, the collector
exposes each of them from 0 (so that ``rate()`` sees the first failure), and dashboards and
alerts match on them. Keeping them in one module, as enums, means a new reason cannot be added
in one place and forgotten in another, and that no free text (an error message, a URL) ever
becomes a label value.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Source(StrEnum):
    """What the exporter reads (``headroom_source_up{source}``)."""

    VLLM_METRICS = "vllm_metrics"
    VLLM_MODELS = "vllm_models"
    VLLM_VERSION = "vllm_version"
    NVML = "nvml"
    #: GPU memory from NVIDIA's dcgm-exporter (``gpu_source=dcgm``) instead of NVML.
    DCGM = "dcgm"
    MODEL_CONFIG = "model_config"


class HttpReason(StrEnum):
    """Why reading vLLM's HTTP API failed, or its metrics could not be used."""

    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_ERROR = "connection_error"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    #: A redirect (not followed: the target URL must name vLLM itself).
    HTTP_3XX = "http_3xx"
    HTTP_401 = "http_401"
    HTTP_403 = "http_403"
    HTTP_404 = "http_404"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    #: The answer is not a metrics exposition (HTML, JSON), or has no ``vllm:`` series.
    NOT_METRICS = "not_metrics"
    #: Not the answer vLLM gives (bad JSON, an unexpected encoding, a missing field).
    INVALID_RESPONSE = "invalid_response"
    PARSE_ERROR = "parse_error"
    #: Counters that go down again and again without a restart: several vLLMs behind one URL
    #: (a load balancer), or not vLLM.
    INCONSISTENT_COUNTERS = "inconsistent_counters"
    #: A bug of ours while deriving the figures (logged once with its traceback).
    INTERNAL_ERROR = "internal_error"


class ModelReason(StrEnum):
    """Why the model's files could not be used for the prediction."""

    MODEL_NOT_FOUND = "model_not_found"
    MODEL_CONFIG_INVALID = "model_config_invalid"
    MODEL_UNSUPPORTED = "model_unsupported"


class PredictionState(StrEnum):
    """``headroom_prediction_state{state}``: the prediction, or why there is none."""

    OK = "ok"
    WAITING_FOR_TARGET = "waiting_for_target"
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_CONFIG_INVALID = "model_config_invalid"
    MODEL_UNSUPPORTED = "model_unsupported"
    NO_GPU_MEMORY = "no_gpu_memory"
    NO_CACHE_CONFIG = "no_cache_config"
    DOES_NOT_FIT = "does_not_fit"


class Limit(StrEnum):
    """``headroom_ceiling_limited_by{limit}``: what caps the sequences vLLM runs at once."""

    #: The KV pool: usable tokens over the blocks one sequence holds.
    KV_CACHE = "kv_cache"
    #: The scheduler's ``--max-num-seqs`` (or ``--max-num-active-seqs``, 0.31+).
    MAX_NUM_SEQS = "max_num_seqs"
    #: The engine sleeps (``vllm:engine_sleep_state``): it runs nothing until woken.
    ENGINE_ASLEEP = "engine_asleep"
    #: vLLM's admission caps (``--max-num-queued-reqs``, ``--max-num-queued-tokens``, 0.32+):
    #: past them the API server answers 503 instead of queueing.
    QUEUE_CAP = "queue_cap"


class AdmissionReason(StrEnum):
    """vLLM's ``reason`` of ``vllm:admission_rejections_total``: the admission cap that refused.

    Each is the name of the setting behind it, so ``--max-num-queued-reqs`` is the flag of
    ``max_num_queued_reqs`` (vLLM 0.32/0.33 ``vllm/v1/engine/async_llm.py``). The parser keeps
    these always and a few other values besides (a later vLLM may add a cap).
    """

    #: The server's unfinished requests (waiting and running) reached ``--max-num-queued-reqs``.
    MAX_NUM_QUEUED_REQS = "max_num_queued_reqs"
    #: The prompt tokens still in prefill reached ``--max-num-queued-tokens``.
    MAX_NUM_QUEUED_TOKENS = "max_num_queued_tokens"


class MaxNumSeqsSource(StrEnum):
    """``headroom_max_num_seqs{source}``: where the running vLLM's limit was learnt."""

    #: The vLLM process's own command line (``--max-num-seqs``).
    COMMAND_LINE = "command_line"
    #: The exporter's ``max_num_seqs`` setting.
    SETTING = "setting"
    #: vLLM's default for its version, device and world size (:mod:`exporter.sizing.scheduler`).
    DEFAULT = "default"


class ProbeOutcome(StrEnum):
    """``headroom_probe_requests_total{outcome}``: how a fleet-mode ``/probe`` ended."""

    OK = "ok"
    BAD_TARGET = "bad_target"
    DENIED_NOT_IN_ALLOWLIST = "denied_not_in_allowlist"
    DENIED_FORBIDDEN_ADDRESS = "denied_forbidden_address"
    #: Refused at once: too many probes in flight, from this client or of this target, or
    #: every name lookup busy (the HTTP server keeps its other slots for /metrics).
    THROTTLED = "throttled"
    TIMEOUT = "timeout"


class DropReason(StrEnum):
    """``headroom_dropped_samples{reason}``: why the parser left samples of a payload out."""

    #: Past a cardinality cap: too many engines, split values, buckets or info labels.
    TOO_MANY_SERIES = "too_many_series"
    #: A label value longer than any vLLM writes.
    LABEL_TOO_LONG = "label_too_long"
    #: NaN or an infinity where vLLM writes a count, a sum or a ratio.
    NOT_FINITE = "not_finite"
    #: A negative count, a usage ratio outside 0 to 1, a histogram whose ``_sum`` its buckets
    #: contradict (or whose count is past 2**53), a ``cache_config_info`` number vLLM cannot write
    #: (a block of 0 tokens, -1 blocks, a utilization of 2).
    OUT_OF_RANGE = "out_of_range"
    #: A second series of a family for one engine (vLLM writes one, or one per split value), or
    #: a sample of another shape than vLLM writes (a counter without ``_total``).
    UNEXPECTED_SERIES = "unexpected_series"


class EvictionReason(StrEnum):
    """``headroom_window_evictions_total{reason}``: why a window gave up samples for memory."""

    #: The target's own window was over its share of the windows' memory.
    TARGET_BUDGET = "target_budget"
    #: All the windows of the process were over their budget and this one was the biggest.
    PROCESS_BUDGET = "process_budget"
    #: All the targets were over the budget with every window down to two samples, and this
    #: one, with none left, was the biggest: its whole state was forgotten (fleet mode), and
    #: its next probe starts it again. Counted once each time.
    FORGOTTEN = "forgotten"


class AnswerRefusal(StrEnum):
    """``headroom_probe_response_budget_refusals_total{reason}``: why an answer was stopped.

    Fleet mode reads the ``/metrics`` answers of many targets at once within one budget; when
    it is full, the biggest answer over its fair share gives way, never one within it.
    (Answers all within their shares sum to at most the budget: one within its share always
    finds room.)
    """

    #: The answer asking for room in a full budget was the biggest over its fair share: refused.
    OVER_SHARE = "over_share"
    #: Another answer was the biggest over its share: cut to make room, its bytes freed.
    CUT = "cut"


class GpuErrorReason(StrEnum):
    """Why one GPU (or one call on it) failed."""

    #: No GPU matches the selector (wrong UUID, index out of range, GPU gone from the bus).
    NOT_FOUND = "not_found"
    #: NVML says the GPU is lost or needs a reset (fell off the bus, Xid 79...).
    GPU_LOST = "gpu_lost"
    NOT_SUPPORTED = "not_supported"
    NO_PERMISSION = "no_permission"
    TIMEOUT = "timeout"
    #: Anything else, including a non-NVML exception from the bindings.
    CALL_FAILED = "call_failed"


class UnavailableReason(StrEnum):
    """Why NVML as a whole cannot be used."""

    #: The ``pynvml`` module (package ``nvidia-ml-py``) is not importable.
    MODULE_MISSING = "module_missing"
    #: ``libnvidia-ml.so.1`` is not there: no driver on the host, or not mounted in the container.
    LIBRARY_NOT_FOUND = "library_not_found"
    DRIVER_NOT_LOADED = "driver_not_loaded"
    #: The user-space library and the kernel driver differ (typically after a driver upgrade).
    DRIVER_MISMATCH = "driver_mismatch"
    NO_PERMISSION = "no_permission"
    #: NVML was shut down under us (another user of the library in this process).
    UNINITIALIZED = "uninitialized"
    INIT_FAILED = "init_failed"


class VisibilityState(StrEnum):
    """How the GPUs to watch were decided (``exporter.gpu.visibility``)."""

    #: From settings.
    EXPLICIT = "explicit"
    #: From the vLLM process's ``NVIDIA_VISIBLE_DEVICES``/``CUDA_VISIBLE_DEVICES``.
    FROM_PROCESS = "from_process"
    #: vLLM sees every GPU of its container (``all``, or neither variable set): which ones
    #: that is cannot be told from here. Read all only if settings allow it.
    ALL_GPUS = "all_gpus"
    #: vLLM is given no GPU (``none``, ``void``, empty, ``-1``).
    NO_GPUS = "no_gpus"
    #: No vLLM server process in the process table (no shared process namespace?).
    VLLM_NOT_FOUND = "vllm_not_found"
    #: The vLLM process's ``environ`` cannot be read (another UID, or it exited).
    ENVIRON_UNREADABLE = "environ_unreadable"
    #: The environment does not say which GPUs unambiguously (see ``detail``).
    AMBIGUOUS = "ambiguous"
    #: A variable's value is malformed.
    INVALID = "invalid"
    #: vLLM holds ``/dev/nvidia<N>`` open but its environment names no GPU: the GPUs were
    #: injected through CDI, and nothing the sidecar can read says which GPUs NVML should read.
    CDI_DEVICES = "cdi_devices"


class DcgmReason(StrEnum):
    """Why GPU memory could not be read from dcgm-exporter (``source="dcgm"``).

    The HTTP reasons are :class:`HttpReason`'s words for the same failures.
    """

    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_ERROR = "connection_error"
    #: No answer within the poll's time limit (also: a read still running from the last poll).
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    HTTP_3XX = "http_3xx"
    HTTP_401 = "http_401"
    HTTP_403 = "http_403"
    HTTP_404 = "http_404"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    #: A compressed answer (only identity is accepted).
    INVALID_RESPONSE = "invalid_response"
    #: Not a metrics exposition, or a memory line that cannot be read.
    PARSE_ERROR = "parse_error"
    #: No ``DCGM_FI_DEV_FB_USED``/``DCGM_FI_DEV_FB_FREE`` series: not dcgm-exporter, or its
    #: counters file leaves the memory fields out.
    NOT_DCGM = "not_dcgm"
    #: A GPU of this pod has ``FB_USED`` without ``FB_FREE`` (or the other way), or no ``gpu``
    #: or ``UUID`` label.
    MISSING_FIELDS = "missing_fields"
    #: The answer maps no GPU to any pod (dcgm-exporter's Kubernetes mapping is off) and no
    #: GPU UUID of vLLM is known.
    NO_POD_MAPPING = "no_pod_mapping"
    #: The answer maps GPUs to pods, but none to this pod, and no GPU UUID of vLLM is known
    #: (another node's dcgm-exporter, or the pod holds no GPU).
    POD_NOT_FOUND = "pod_not_found"
    #: vLLM's GPU UUIDs are known but this dcgm-exporter does not list them (another node's).
    GPUS_NOT_FOUND = "gpus_not_found"
    #: Fleet mode: the probe named no dcgm-exporter and pod (its ``dcgm``, ``pod`` and
    #: ``namespace`` parameters), so no GPU can be told to be the target's.
    NOT_GIVEN = "not_given"
    #: A bug of ours while reading (logged once with its traceback).
    CALL_FAILED = "call_failed"


#: Visibility states that mean "nothing can be watched": failures of the ``nvml`` source.
VISIBILITY_FAILURES: Final = tuple(
    s for s in VisibilityState if s not in (VisibilityState.EXPLICIT, VisibilityState.FROM_PROCESS)
)

#: Every reason the ``nvml`` source can fail with.
NVML_REASONS: Final[tuple[str, ...]] = tuple(
    dict.fromkeys(
        [*UnavailableReason, *GpuErrorReason, *VISIBILITY_FAILURES],
    )
)

#: Every source and the reasons it can fail with: the error counters start at 0 for each.
_METRICS_ONLY: Final = (HttpReason.INCONSISTENT_COUNTERS, HttpReason.INTERNAL_ERROR)

SOURCE_REASONS: Final[dict[str, tuple[str, ...]]] = {
    Source.VLLM_METRICS: tuple(HttpReason),
    Source.VLLM_MODELS: tuple(r for r in HttpReason if r not in _METRICS_ONLY),
    Source.VLLM_VERSION: tuple(r for r in HttpReason if r not in _METRICS_ONLY),
    Source.NVML: NVML_REASONS,
    Source.DCGM: tuple(DcgmReason),
    Source.MODEL_CONFIG: tuple(ModelReason),
}
