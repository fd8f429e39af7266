"""What a window sample, and a target between polls, cost in memory: estimates from their shape.

The poller bounds every window, and all windows together, in bytes (:mod:`exporter.service.
memory`): a count of samples bounds nothing when a target's label values, bucket counts or
engines are chosen by whoever answers. Measuring real sizes (``sys.getsizeof`` over every
object) would cost more than the parse; this walks the few fields a lean sample holds and adds
CPython's sizes. Objects shared with the previous sample (bucket bounds, ``cache_config_info``
facts, unchanged model names and split-label keys, see
:func:`~exporter.core.derive.window_snapshot`) are held once and counted once.

Besides its samples, each target holds between polls a little more that the same budget counts
(:func:`state_bytes`): its poller, the restart baseline, the figures the next poll reads, and in
the sidecar the figures held for scrapes. Fleet mode holds that for up to ``probe_max_targets``
targets of up to 64 engines each. ``tests/core/test_footprint.py`` checks both estimates
against tracemalloc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Mapping

    from exporter.core.derive import ContextEstimate, RestartBaseline, TargetDerived
    from exporter.core.snapshot import EngineMetrics, Histogram, VllmSnapshot
    from exporter.core.views import TargetInfo

# CPython 3.11, 64-bit: sizes of the objects a sample is made of.
_FLOAT: Final = 24
_STR: Final = 49  # an ASCII str's header; one byte a character (4 for other text, at worst)
_TUPLE: Final = 40  # plus a pointer an item
_DICT: Final = 64  # empty; an entry costs a slot, its hash and its pointers
_DICT_ENTRY: Final = 48
#: A Sample, its VllmSnapshot (7 slots) and the engines dict's header.
_SAMPLE: Final = 56 + 104 + _DICT + 2 * _DICT
#: An EngineMetrics (27 slots) and its place in the engines dict.
_ENGINE: Final = 16 + 8 * 27 + _DICT_ENTRY
#: A Histogram (4 slots) and its count and sum.
_HISTOGRAM: Final = 48 + 2 * _FLOAT
#: A CacheConfig (10 slots), its numbers and its (empty in a window) labels.
_CACHE_CONFIG: Final = 96 + 6 * _FLOAT + _DICT


def text_bytes(text: str) -> int:
    """Memory of one str: ASCII one byte a character, anything else counted at four."""
    return _STR + (len(text) if text.isascii() else 4 * len(text))


def sample_bytes(snapshot: VllmSnapshot, previous: VllmSnapshot | None = None) -> int:
    """Estimated bytes a window sample of ``snapshot`` holds beyond what ``previous`` shares."""
    total = _SAMPLE + _DICT_ENTRY * len(snapshot.dropped)
    total += _mapping_bytes(
        snapshot.admission_rejections_by_reason,
        previous.admission_rejections_by_reason if previous is not None else None,
    )
    for name, engine in snapshot.engines.items():
        old = previous.engines.get(name) if previous is not None else None
        total += _engine_bytes(engine, old)
        if old is None or old.engine is not engine.engine:
            total += text_bytes(name)
    return total


def _engine_bytes(engine: EngineMetrics, old: EngineMetrics | None) -> int:
    total = _ENGINE + _FLOAT * 10  # the scalar gauges and counters, most of them set
    if engine.model_name is not None and (old is None or old.model_name is not engine.model_name):
        total += text_bytes(engine.model_name)
    for mapping, old_mapping in (
        (engine.requests_waiting_by_reason, old.requests_waiting_by_reason if old else None),
        (engine.sleep_state, old.sleep_state if old else None),
        (
            engine.prompt_tokens_cached_by_source,
            old.prompt_tokens_cached_by_source if old else None,
        ),
        (engine.prompt_tokens_by_source, old.prompt_tokens_by_source if old else None),
        (engine.requests_kv_fetch_by_stage, old.requests_kv_fetch_by_stage if old else None),
    ):
        total += _mapping_bytes(mapping, old_mapping)
    for histogram, old_histogram in (
        (engine.prompt_tokens, old.prompt_tokens if old else None),
        (engine.generation_tokens, old.generation_tokens if old else None),
        (engine.request_params_n, old.request_params_n if old else None),
    ):
        total += _histogram_bytes(histogram, old_histogram)
    config = engine.cache_config
    if config is not None and (old is None or old.cache_config is not config):
        total += _CACHE_CONFIG + sum(
            text_bytes(k) + text_bytes(v) + _DICT_ENTRY for k, v in config.labels.items()
        )
    return total


def _mapping_bytes(mapping: Mapping[str, float], old: Mapping[str, float] | None) -> int:
    if mapping is old:
        return 0
    total = _DICT + (_DICT_ENTRY + _FLOAT) * len(mapping)
    shared = {id(key) for key in old} if old else set()
    return total + sum(text_bytes(key) for key in mapping if id(key) not in shared)


def _histogram_bytes(histogram: Histogram | None, old: Histogram | None) -> int:
    if histogram is None or histogram is old:
        return 0
    buckets = len(histogram.cumulative)
    total = _HISTOGRAM + _TUPLE + (8 + _FLOAT) * buckets
    if old is None or histogram.bounds is not old.bounds:
        total += _TUPLE + (8 + _FLOAT) * len(histogram.bounds)
    return total


#: A poller between polls, whatever its engines: the TargetPoller, its window, lock, client and
#: predictor, the health of its sources, its view's small parts and its place in the fleet.
#: Measured (tracemalloc, a one-engine target after two polls): about 11 KiB.
_POLLER: Final = 11 * 1024
#: A RestartBaseline, its tuple of engine names and its array of counters (headers).
_BASELINE: Final = 56 + _TUPLE + 80
#: An engine in the baseline: its name's place in the tuple and six doubles.
_BASELINE_ENGINE: Final = 8 + 6 * 8
#: An EngineDerived (41 slots) and its place in the target's tuple.
_DERIVED: Final = 16 + 8 * 41 + 8
#: The floats an engine's figures hold, most of them set, and its three (most often empty)
#: mappings of split labels.
_DERIVED_FIGURES: Final = 28 * _FLOAT + 3 * _DICT
#: A ContextEstimate (7 slots), its quantiles (a dict of three) and its numbers.
_CONTEXT: Final = 16 + 8 * 7 + 232 + 8 * _FLOAT
#: A GpuMemoryView (11 slots), its numbers and its three strings.
_GPU: Final = 16 + 8 * 11 + 8 * _FLOAT + 3 * 64


def state_bytes(
    baseline: RestartBaseline | None,
    previous: TargetDerived | None,
    held: TargetDerived | None = None,
    *,
    gpus: int = 0,
    info: TargetInfo | None = None,
) -> int:
    """Estimated bytes a target holds between polls besides its window's samples.

    ``baseline``: its restart baseline; ``previous``: what the next derivation reads of the
    last one; ``held``: the figures held for scrapes (the sidecar's; None in fleet mode);
    ``gpus``: the GPUs its view shows; ``info``: what ``/v1/models`` and ``/version`` said (its
    strings are the target's own, each up to the client's cap). Engine names and model names
    are counted where the figures are (they are the window's objects while its window holds
    samples).
    """
    total = _POLLER + _GPU * gpus
    if info is not None:
        total += _info_bytes(info)
    if baseline is not None:
        total += _BASELINE + _BASELINE_ENGINE * len(baseline.engines)
        total += sum(text_bytes(name) for name in baseline.engines)
    if previous is not None:
        for engine in previous.engines:
            # Its context figures are the held figures' objects, where those are held.
            total += _DERIVED + (_context_bytes(engine.context) if held is None else 0)
    if held is not None:
        total += _TUPLE + 8 * 16
        # Its admission rates by reason (a few: the parser's cap), keyed by the window's strs.
        if reasons := len(held.admission_rejections_by_reason_per_second):
            total += _DICT + (_DICT_ENTRY + _FLOAT) * reasons
        for engine in held.engines:
            total += _DERIVED + _DERIVED_FIGURES + _context_bytes(engine.context)
            for mapping in (
                engine.prompt_tokens_cached_ratio_by_source,
                engine.prompt_tokens_ratio_by_source,
                engine.requests_waiting_by_reason,
            ):
                total += (_DICT_ENTRY + _FLOAT) * len(mapping)
                total += sum(text_bytes(key) for key in mapping)
    return total


def _context_bytes(context: ContextEstimate | None) -> int:
    return _CONTEXT if context is not None else 0


def _info_bytes(info: TargetInfo) -> int:
    """The strings of a TargetInfo (its object is counted in the poller's share)."""
    texts = (info.model_id, info.model_root, info.vllm_version)
    return sum(text_bytes(text) for text in texts if text is not None)
