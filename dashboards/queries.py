"""PromQL building blocks shared by the dashboards: selectors and version-tolerant fragments.

Our sidecar's series carry Prometheus's ``job`` and ``instance`` (and in Kubernetes
``namespace``, ``pod``); per-engine gauges add ``model_name`` and ``engine``; GPU gauges ``gpu``
and ``uuid``. vLLM's own series carry ``model_name`` (and ``engine`` from vLLM 0.8.3) plus the
labels of *their* scrape job, matched to the sidecar by host (see
:data:`dashboards.templating.VLLM_INSTANCE`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dashboards.templating import VLLM_INSTANCE, datasource_variable, label_variable

if TYPE_CHECKING:
    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.models import dashboard as dm

#: Labels that identify one engine of one instance in tables (``pod`` only in Kubernetes).
ENGINE_KEY = "namespace, pod, instance, model_name, engine"


def selector(*matchers: str) -> str:
    """``{a, b, ...}`` from label matchers."""
    return "{" + ", ".join(matchers) + "}"


#: The cluster of multi-cluster Prometheus, Thanos or Mimir (absent elsewhere: All is .*).
CLUSTER = 'cluster=~"$cluster"'
JOB = 'job=~"$job"'
NAMESPACE = 'namespace=~"$namespace"'
INSTANCE = 'instance=~"$instance"'
MODEL = 'model_name=~"$model"'
ENGINE = 'engine=~"$engine"'

#: Per-target series of the selected sidecars (no model or engine labels).
TARGET = selector(CLUSTER, JOB, NAMESPACE, INSTANCE)
#: Per-engine series of the selected sidecars and models (fleet: every engine).
FLEET_ENGINE = selector(CLUSTER, JOB, NAMESPACE, INSTANCE, MODEL)
#: Per-engine series of the selected instance's selected engines.
ENGINE_SERIES = selector(CLUSTER, JOB, NAMESPACE, INSTANCE, MODEL, ENGINE)
#: vLLM's own series of the selected instance (matched by host), model and engines.
VLLM = selector(CLUSTER, NAMESPACE, VLLM_INSTANCE, MODEL, ENGINE)


def metric(name: str, sel: str) -> str:
    """``name{...}``."""
    return f"{name}{sel}"


def rate(name: str, sel: str, window: str = "$__rate_interval") -> str:
    """``rate(name{...}[window])``: per-second, reset-safe."""
    return f"rate({name}{sel}[{window}])"


def prefer(newer: str, older: str) -> str:
    """``newer`` where it has any series, else ``older``: one of two names vLLM renamed.

    Unlike a bare ``or``, a label set present under both names cannot mix: when ``newer``
    returns anything, ``older`` is dropped entirely.
    """
    return f"({newer}) or (({older}) unless on () ({newer}))"


def histogram_quantile(q: float, buckets_by_le: str) -> str:
    """``histogram_quantile(q, ...)`` over buckets already summed ``by (le)``."""
    return f"histogram_quantile({q:g}, {buckets_by_le})"


def bucket_rate(name: str, sel: str) -> str:
    """Per-second bucket increase of histogram ``name`` summed over engines, by ``le``."""
    return f"sum by (le) ({rate(name + '_bucket', sel)})"


#: The limits of vLLM's scheduler that the sidecar's one-hot ``headroom_p95_*_limited_by{limit}``
#: gauges name, with the text and colour a panel shows for each. :func:`binding_limit` gives the
#: one at 1 the code of its position here (1, 2, 3...), so that one value per engine can say
#: which limit binds (a table cell, a state timeline band).
SCHEDULER_LIMITS = (
    ("kv_cache", "KV cache", "green"),
    ("max_num_seqs", "max_num_seqs", "orange"),
    ("engine_asleep", "asleep", "blue"),
    ("queue_cap", "queue cap", "red"),
)


def with_matchers(sel: str, *matchers: str) -> str:
    """``sel`` (a ``{...}`` selector) with ``matchers`` added."""
    return sel.removesuffix("}") + ", " + ", ".join(matchers) + "}"


def binding_limit(name: str, sel: str, by: str) -> str:
    """The limit whose one-hot series of ``name`` is 1, as its code in :data:`SCHEDULER_LIMITS`.

    ``max by (by)`` over ``(name{limit="<limit>"} == 1) * <code>`` for every limit: one series
    per ``by`` group whose value a value mapping turns back into the limit's name.
    """
    codes = []
    for code, (limit, _, _) in enumerate(SCHEDULER_LIMITS, start=1):
        one_hot = metric(name, with_matchers(sel, f'limit="{limit}"'))
        codes.append(f"({one_hot} == 1) * {code}")
    return f"max by ({by}) ({' or '.join(codes)})"


def per_engine(instance_level: str, engines: str) -> str:
    """Attach an instance-level value (e.g. GPU memory) to every engine row of the instance.

    ``engines`` selects the per-engine series that define the rows; the result carries their
    labels (normalised to :data:`ENGINE_KEY`) and ``instance_level``'s value.
    """
    rows = f"group by (job, {ENGINE_KEY}) ({engines})"
    return f"max by ({ENGINE_KEY}) (({instance_level}) * on (job, instance) group_right () {rows})"


def scope_variables() -> list[cogbuilder.Builder[dm.VariableModel]]:
    """The variables both dashboards start with: data source, cluster, job and namespace.

    Their queries are the label values of our own series, so the pickers list only what the
    vllm-headroom exporters report.
    """
    return [
        datasource_variable(),
        label_variable(
            "cluster",
            label="Cluster",
            query="label_values(headroom_target_up, cluster)",
            description=(
                "Cluster label of a multi-cluster Prometheus, Thanos or Mimir (absent on a "
                "single Prometheus: keep All, which matches series without it too)."
            ),
        ),
        label_variable(
            "job",
            label="Job",
            query=f"label_values(headroom_target_up{{{CLUSTER}}}, job)",
            description="Prometheus job(s) scraping the vllm-headroom sidecars or probes.",
        ),
        label_variable(
            "namespace",
            label="Namespace",
            query=f"label_values(headroom_target_up{{{CLUSTER}, {JOB}}}, namespace)",
            description="Kubernetes namespace (empty outside Kubernetes: keep All).",
        ),
    ]
