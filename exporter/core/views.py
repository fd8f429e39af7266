"""Immutable views of a target's state, published by the poller and read by the collectors.

The poller replaces a target's :class:`TargetView` as a whole after every poll; a scrape reads
whichever view is current. Views are plain frozen data, so concurrent scrapes never see a half
updated state and never need a lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from exporter.core.reasons import DropReason, EvictionReason, PredictionState, Source

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.core.derive import TargetDerived
    from exporter.core.pool import PoolLayout


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """How reading one source (``vllm_metrics``, ``nvml``...) went."""

    up: bool
    #: Unix time of the last success; ``None`` before the first.
    last_success_time: float | None = None
    #: Seconds the last read took.
    duration_seconds: float | None = None
    #: Failed reads since the exporter started, by bounded reason.
    errors: Mapping[str, int] = field(default_factory=dict)
    #: The last failure, for logs and the landing page (never a label).
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class GpuMemoryView:
    """Memory of one GPU vLLM uses, in bytes; ``None`` where NVML cannot tell."""

    index: str
    uuid: str
    name: str
    total_bytes: float
    used_bytes: float
    free_bytes: float
    #: What CUDA (and so vLLM) sees as the total: NVML's total less the driver's reservation.
    cuda_total_bytes: float
    vllm_bytes: float | None = None
    foreign_bytes: float | None = None
    vllm_predicted_bytes: float | None = None
    unexplained_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class PredictionView:
    """The sizing model's figures for this target, or why there are none.

    ``state`` is ``"ok"`` or a bounded reason (:class:`~exporter.core.reasons.PredictionState`);
    ``message`` explains it to a human (logs, landing page), never a label.
    """

    state: str
    message: str = ""
    bytes_per_token: float | None = None
    weights_bytes: float | None = None
    overhead_bytes: float | None = None
    kv_budget_bytes: float | None = None
    #: Per engine, in vLLM's terms (``kv_cache_size_tokens`` semantics).
    capacity_tokens: float | None = None
    #: The KV-cache groups a sequence takes blocks in, as the model's config lays them out:
    #: how many sequences shorter than ``max_model_len`` a pool of several groups holds.
    layout: PoolLayout | None = None
    #: Labels of ``headroom_sizing_info``; empty when the architecture is unknown.
    info: Mapping[str, str] = field(default_factory=dict)

    @property
    def state_flags(self) -> dict[str, float]:
        """1 for the current state and 0 for every other: the one-hot ``state`` gauge."""
        return {state: 1.0 if state == self.state else 0.0 for state in PredictionState}


@dataclass(frozen=True, slots=True)
class TargetInfo:
    """Facts about the vLLM server from ``/v1/models`` and ``/version``."""

    model_id: str | None = None
    model_root: str | None = None
    max_model_len: int | None = None
    vllm_version: str | None = None


@dataclass(frozen=True, slots=True)
class TargetView:
    """Everything the collectors need about one target, as of its latest poll."""

    target: str
    derived: TargetDerived | None = None
    prediction: PredictionView = field(
        default_factory=lambda: PredictionView(state="waiting_for_target")
    )
    gpus: tuple[GpuMemoryView, ...] = ()
    sources: Mapping[str, SourceHealth] = field(default_factory=dict)
    info: TargetInfo = field(default_factory=TargetInfo)
    restarts_total: int = 0
    window_samples: int = 0
    #: Samples of the latest payload the parser left out, by reason.
    dropped: Mapping[str, int] = field(default_factory=dict)
    #: Window samples given up for memory since the poller started, by reason.
    window_evictions: Mapping[str, int] = field(default_factory=dict)

    @property
    def dropped_samples(self) -> dict[str, int]:
        """Samples left out by every reason the parser has, from 0."""
        return {**dict.fromkeys(DropReason, 0), **self.dropped}

    @property
    def window_evictions_total(self) -> dict[str, int]:
        """Window samples given up for memory by every reason, from 0."""
        return {**dict.fromkeys(EvictionReason, 0), **self.window_evictions}

    @property
    def admission_rejections_per_second(self) -> float | None:
        """Queue-limit refusals per second (absent before the first window or before 0.32)."""
        return self.derived.admission_rejections_per_second if self.derived else None

    @property
    def admission_rejections_by_reason_per_second(self) -> Mapping[str, float]:
        """The same by the cap that refused, each reason vLLM writes (none before 0.32)."""
        return self.derived.admission_rejections_by_reason_per_second if self.derived else {}

    @property
    def up(self) -> bool:
        """Whether the latest read of vLLM's ``/metrics`` succeeded."""
        health = self.sources.get(Source.VLLM_METRICS)
        return health is not None and health.up
