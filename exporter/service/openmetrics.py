"""The OpenMetrics text that ``/probe`` answers Prometheus with, rendered in one pass.

prometheus_client's ``openmetrics.generate_latest`` escapes every sample name a character at a
time in Python (``escaping=underscores``, what Prometheus asks for): a fifth of a fleet
exporter's CPU went there (benchmarks/README.md, ``fleet_cost.py``). Here the names, which come
from a small fixed vocabulary, are escaped once and remembered, and the rest is the same
formatting: the bytes are client_python's, byte for byte (tests/service/test_openmetrics.py
compares them). What this does not cover (another escaping, exemplars, native histograms) is
left to prometheus_client's encoder. The probe's own families are written with the same
helpers straight from their values (``exporter.service.collector.Families``).
"""

from __future__ import annotations

import functools
import re
from functools import partial
from typing import TYPE_CHECKING

from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.utils import floatToGoString
from prometheus_client.validation import (
    METRIC_LABEL_NAME_RE,
    METRIC_NAME_RE,
    RESERVED_METRIC_LABEL_NAME_RE,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

#: Names in the legacy character sets are kept as they are (prometheus_client's own checks);
#: in others, a character outside a label name's set (a digit only first), escaped to ``_``.
_NOT_LABEL_RUNE = re.compile(r"[^a-zA-Z0-9_]|^[0-9]")
_NOT_METRIC_RUNE = re.compile(r"[^a-zA-Z0-9_:]|^[0-9]")
#: Distinct names remembered (the exporter's vocabulary is a few hundred).
_NAMES_CACHED = 4096


@functools.lru_cache(maxsize=_NAMES_CACHED)
def sample_name(name: str) -> str:
    """A sample's name escaped as client_python does: every rune outside a label name's set."""
    return _NOT_LABEL_RUNE.sub("_", name)


@functools.lru_cache(maxsize=_NAMES_CACHED)
def _family_name(name: str) -> str:
    """A family's name in HELP, TYPE and UNIT: kept when a legacy metric name, else escaped."""
    if not name or METRIC_NAME_RE.match(name):
        return name
    return _NOT_METRIC_RUNE.sub("_", name)


@functools.lru_cache(maxsize=_NAMES_CACHED)
def label_name(name: str) -> str:
    """A label's name: kept when a legacy label name (not reserved), else escaped."""
    if not name:
        return name
    if METRIC_LABEL_NAME_RE.match(name) and not RESERVED_METRIC_LABEL_NAME_RE.match(name):
        return name
    return _NOT_LABEL_RUNE.sub("_", name)


def text(value: str) -> str:
    """A label value or a HELP text: backslash, newline and double quote escaped."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_set(labels: Mapping[str, str]) -> str:
    """A sample's labels as written after its name: ``{a="1",b="2"}``, sorted; "" for none."""
    if not labels:
        return ""
    return "{" + ",".join(f'{label_name(k)}="{text(v)}"' for k, v in sorted(labels.items())) + "}"


def headers(families: Iterable[Metric]) -> Iterator[str]:
    """Each family's ``# HELP``, ``# TYPE`` (and ``# UNIT``) lines."""
    for metric in families:
        name = _family_name(metric.name)
        head = f"# HELP {name} {text(metric.documentation)}\n# TYPE {name} {metric.type}\n"
        yield f"{head}# UNIT {name} {metric.unit}\n" if metric.unit else head


def is_fast(encoder: Callable[[Collector], bytes]) -> bool:
    """Whether ``encoder`` (from ``choose_encoder``) is what :func:`render` reproduces."""
    return (
        isinstance(encoder, partial)
        and encoder.func is openmetrics.generate_latest
        and not encoder.args
        and encoder.keywords.get("escaping") == openmetrics.UNDERSCORES
    )


def render(registry: Collector) -> bytes | None:
    """OpenMetrics 1.0 with underscore escaping, or None where a sample needs client_python.

    None for exemplars and native histograms (the exporter has neither): the caller renders
    with prometheus_client's encoder instead.
    """
    out: list[str] = []
    append = out.append
    for metric in registry.collect():
        (header,) = headers([metric])
        append(header)
        for s in metric.samples:
            if s.exemplar or s.native_histogram:
                return None
            labels = label_set(s.labels)
            value = floatToGoString(s.value) if s.value is not None else ""  # type: ignore[no-untyped-call]
            stamp = f" {s.timestamp}" if s.timestamp is not None else ""
            append(f"{sample_name(s.name)}{labels} {value}{stamp}\n")
    append("# EOF\n")
    return "".join(out).encode("utf-8")
