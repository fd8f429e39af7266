"""GPU memory from NVIDIA's dcgm-exporter, as the same readings the NVML reader gives.

Where the sidecar cannot use NVML on vLLM's GPUs (the chart gives it no GPU; GPUs injected
through CDI leave nothing in vLLM's environment to name them), the node's dcgm-exporter already
reads them. Its ``/metrics`` has, per GPU (or MIG instance), ``DCGM_FI_DEV_FB_USED``,
``DCGM_FI_DEV_FB_FREE`` and, from dcgm-exporter 4.3.1-4.4.0 on, ``DCGM_FI_DEV_FB_RESERVED`` in
MiB (its ``etc/default-counters.csv``), labelled ``gpu`` (index), ``UUID`` (``uuid`` with
``--use-old-namespace``), ``modelName``, ``GPU_I_ID``/``GPU_I_PROFILE`` on MIG instances, and,
with its Kubernetes pod mapping (kubelet pod-resources), ``pod``/``namespace``/``container``
(``pod_name``/``pod_namespace``/``container_name`` in the old namespace) of the pod holding it.

This pod's GPUs are picked, in order: by the ``gpus`` setting (GPU UUIDs or indices); by the pod
mapping (``pod_name``/``pod_namespace`` settings, from the downward API); by the GPU UUIDs of
vLLM's ``NVIDIA_VISIBLE_DEVICES`` when the process table shows them. Never "every GPU of the
answer": a node of 8 GPUs of which vLLM holds 2 must read as 2.

What DCGM cannot tell: which process holds the memory. Readings have ``processes=None``, so
vLLM's share and the foreign share are unknown (never 0) and memory on vLLM's GPU beyond what
vLLM claims is read as *unexplained* memory (docs/kubernetes.md, "Choosing the GPU source",
for the error bound).

This module is the pure core: :func:`read_dcgm_samples` (an answer's memory samples to
devices), :func:`pick_devices`, :meth:`DcgmDevice.reading`. The shell, in
:mod:`exporter.service.dcgm`, parses the answer with the project's parser, reads the endpoint
(bounded) and is the poller's GPU source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

from exporter.core.reasons import DcgmReason
from exporter.errors import SourceError
from exporter.gpu.model import GpuReading, IndexSelector, MemoryApi, UuidSelector

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from exporter.gpu.model import GpuSelector

FB_USED: Final = "DCGM_FI_DEV_FB_USED"
FB_FREE: Final = "DCGM_FI_DEV_FB_FREE"
#: In dcgm-exporter's default counters from 4.3.1-4.4.0; add it to older counters files.
FB_RESERVED: Final = "DCGM_FI_DEV_FB_RESERVED"
#: Not a default counter; read when a counters file adds it.
FB_TOTAL: Final = "DCGM_FI_DEV_FB_TOTAL"
#: The families read from an answer (exact names: DCGM fields are gauges).
FAMILIES: Final = (FB_USED, FB_FREE, FB_RESERVED, FB_TOTAL)

MIB: Final = 1024 * 1024
#: The largest memory figure believed, in MiB (16 TiB): beyond it the answer is not a GPU's.
MAX_MIB: Final = 16 * 1024 * 1024
#: Memory samples read from one answer at most: 4 fields of 64 GPUs of 7 MIG instances each,
#: twice over (a GPU shared by time-slicing is listed once per pod with dcgm-exporter's
#: ``--kubernetes-virtual-gpus``).
MAX_SAMPLES: Final = 4 * 64 * 7 * 2

#: Longest UUID label believed (``GPU-`` and 36 characters; old MIG forms a few more): it is
#: exported as the ``uuid`` label.
MAX_UUID_CHARS: Final = 96

#: Label names, current and old (dcgm-exporter's ``--use-old-namespace`` renames both).
_UUID_LABELS: Final = ("UUID", "uuid")
_POD_LABELS: Final = (("pod", "namespace"), ("pod_name", "pod_namespace"))


def check_kubernetes_name(value: str) -> str:
    """``value`` stripped if it can be a Kubernetes name; else :class:`ValueError` saying why."""
    text = value.strip()
    if (
        not text
        or len(text) > 253
        or not text.isascii()
        or not all(c.isalnum() or c in "-." for c in text)
    ):
        msg = "is not a Kubernetes name (lower-case letters, digits, '-' and '.')"
        raise ValueError(msg)
    return text


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod by name and namespace (the downward API's ``metadata.name``/``.namespace``)."""

    name: str
    namespace: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class DcgmDevice:
    """One GPU or MIG instance of a dcgm-exporter answer, with its memory fields in MiB.

    ``instance`` is ``GPU_I_ID`` on a MIG instance (``uuid`` is then the parent GPU's, as
    dcgm-exporter labels it). A field the answer lacks is ``None``. ``pods`` are the pods
    dcgm-exporter maps the device to (several when time-slicing shares it and dcgm-exporter
    runs with ``--kubernetes-virtual-gpus``; else one of them).
    """

    gpu: int
    uuid: str
    model_name: str = ""
    instance: str | None = None
    profile: str | None = None
    used_mib: float | None = None
    free_mib: float | None = None
    reserved_mib: float | None = None
    total_mib: float | None = None
    pods: frozenset[PodIdentity] = field(default_factory=frozenset)
    #: Why its memory cannot be read (a value no GPU has), or None; its fields are then None.
    unreadable: str | None = None

    @property
    def key(self) -> tuple[int, str, str | None]:
        """What tells two devices of one answer apart."""
        return (self.gpu, self.uuid, self.instance)

    @property
    def label_uuid(self) -> str:
        """The ``uuid`` label of its gauges: the GPU's UUID, ``/gi<N>`` added on a MIG instance.

        dcgm-exporter gives a MIG instance its parent's UUID (not the ``MIG-…`` UUID NVML
        has); the instance ID keeps two instances of one GPU apart.
        """
        return self.uuid if self.instance is None else f"{self.uuid}/gi{self.instance}"

    @property
    def complete(self) -> bool:
        """Whether both ``FB_USED`` and ``FB_FREE`` were read."""
        return self.used_mib is not None and self.free_mib is not None

    def reading(self) -> GpuReading:
        """The device as a :class:`GpuReading` in bytes (it must be :attr:`complete`).

        ``total`` is ``FB_TOTAL`` when exported, else ``used + free + reserved``: DCGM reads
        NVML's v2 memory call, whose ``used`` leaves the reservation out. Without
        ``FB_RESERVED`` the reading is marked v1 and the reservation is estimated downstream
        (:data:`~exporter.gpu.memory.DEFAULT_RESERVED_BYTES`).
        """
        used = _bytes(self.used_mib)
        free = _bytes(self.free_mib)
        reserved = _bytes(self.reserved_mib) if self.reserved_mib is not None else None
        if self.total_mib is not None:
            total = _bytes(self.total_mib)
        else:
            total = used + free + (reserved or 0)
        name = self.model_name if self.profile is None else f"{self.model_name} MIG {self.profile}"
        return GpuReading(
            index=self.gpu,
            uuid=self.label_uuid,
            name=name,
            total_bytes=total,
            used_bytes=used,
            free_bytes=free,
            reserved_bytes=reserved,
            memory_api=MemoryApi.V2 if reserved is not None else MemoryApi.V1,
            processes=None,  # DCGM does not say which process holds the memory
        )


def _bytes(mib: float | None) -> int:
    return round((mib or 0.0) * MIB)


@dataclass(frozen=True, slots=True)
class DcgmAnswer:
    """What :func:`read_dcgm_samples` read: the devices, and whether any is mapped to a pod."""

    devices: tuple[DcgmDevice, ...]
    pod_mapped: bool
    #: Memory lines skipped unread for their length (the parser's ``too_long``): a pod's GPU
    #: may be among them, so a failed pick says so rather than "not found".
    too_long: int = 0


# --------------------------------------------------------------------------------------------
# Parsing (pure)
# --------------------------------------------------------------------------------------------


class DcgmSample(Protocol):
    """One sample of a memory family, as the exposition parser gives it."""

    @property
    def family(self) -> str:
        """The metric name (one of :data:`FAMILIES`)."""
        ...

    @property
    def labels(self) -> Mapping[str, str]:
        """Its labels."""
        ...

    @property
    def value(self) -> float:
        """Its value, in MiB."""
        ...

    @property
    def lineno(self) -> int:
        """Its line in the answer, for error messages."""
        ...


def read_dcgm_samples(samples: Iterable[DcgmSample], *, too_long: int = 0) -> DcgmAnswer:
    """The devices of an answer's memory samples. Raises :class:`SourceError`.

    ``samples`` are those of :data:`FAMILIES` only, at most :data:`MAX_SAMPLES` of them (the
    parser stops there); ``too_long``: the memory lines the parser skipped for their length.

    Devices are told apart as they are exported, by ``gpu`` and :attr:`DcgmDevice.label_uuid`:
    two that would export the same labels (a whole GPU labelled ``UUID="GPU-a/gi1"`` and MIG
    instance 1 of ``GPU-a``) are one device, unreadable, whatever their order: never two
    series of one name and labels, which Prometheus would refuse with the whole scrape.
    """
    devices: dict[tuple[int, str], _Fields] = {}
    pod_mapped = False
    for sample in samples:
        labels = sample.labels
        gpu, uuid, instance = _device_key(labels, sample.family, sample.lineno)
        key = (gpu, uuid if instance is None else f"{uuid}/gi{instance}")
        value = sample.value
        fields = devices.get(key)
        if fields is None:
            profile = labels.get("GPU_I_PROFILE") or None if instance is not None else None
            fields = devices[key] = _Fields(
                labels.get("modelName", ""), profile, uuid, instance, sample.lineno
            )
        elif (fields.uuid, fields.instance) != (uuid, instance) and fields.unreadable is None:
            first, second = sorted((_named(fields.uuid, fields.instance), _named(uuid, instance)))
            fields.unreadable = (
                f"lines {fields.lineno} and {sample.lineno} name GPU {gpu} {key[1]} both as "
                f"{first} and as {second}: not dcgm-exporter's labels"
            )
        pod = _pod_of(labels)  # whatever the value: the pod learns why its GPU is unread
        if pod is not None:
            pod_mapped = True
            fields.pods.add(pod)
        if not math.isfinite(value) or not 0 <= value <= MAX_MIB:
            # This device alone is unreadable (an unsupported field's sentinel, say): the
            # answer's other GPUs, other pods' and other targets' in fleet mode, still count.
            if fields.unreadable is None:
                fields.unreadable = (
                    f"line {sample.lineno}: {sample.family} of GPU {key[0]} is {value!r} MiB"
                )
            continue
        fields.mib.setdefault(sample.family, value)  # a copy per pod (time-slicing): same value
    if not any(FB_USED in f.mib or FB_FREE in f.mib for f in devices.values()):
        unreadable = next((f.unreadable for f in devices.values() if f.unreadable), None)
        if unreadable is not None:
            raise SourceError(DcgmReason.PARSE_ERROR, unreadable)
        msg = (
            f"no {FB_USED} or {FB_FREE} series: not dcgm-exporter, or its counters file "
            "leaves the memory fields out"
        )
        if too_long:
            raise SourceError(DcgmReason.PARSE_ERROR, _too_long_message(too_long, "dcgm-exporter"))
        raise SourceError(DcgmReason.NOT_DCGM, msg)
    return DcgmAnswer(tuple(f.device(key[0]) for key, f in devices.items()), pod_mapped, too_long)


def _too_long_message(count: int, where: str) -> str:
    return (
        f"{where}: {count} memory line(s) were skipped unread for their length (over 64 Ki "
        "characters: no dcgm-exporter label is that long)"
    )


def _named(uuid: str, instance: str | None) -> str:
    return f"whole GPU {uuid}" if instance is None else f"MIG instance {instance} of {uuid}"


@dataclass(slots=True)
class _Fields:
    """What one device's samples said so far."""

    model: str
    profile: str | None
    uuid: str
    instance: str | None
    #: The line of its first sample.
    lineno: int
    mib: dict[str, float] = field(default_factory=dict)
    pods: set[PodIdentity] = field(default_factory=set)
    #: The first memory value that cannot be a GPU's, or why its labels are not one device's
    #: (the device is then not complete).
    unreadable: str | None = None

    def device(self, gpu: int) -> DcgmDevice:
        mib = {} if self.unreadable is not None else self.mib
        return DcgmDevice(
            gpu=gpu,
            uuid=self.uuid,
            model_name=self.model,
            instance=self.instance,
            profile=self.profile,
            used_mib=mib.get(FB_USED),
            free_mib=mib.get(FB_FREE),
            reserved_mib=mib.get(FB_RESERVED),
            total_mib=mib.get(FB_TOTAL),
            pods=frozenset(self.pods),
            unreadable=self.unreadable,
        )


def _device_key(labels: Mapping[str, str], family: str, lineno: int) -> tuple[int, str, str | None]:
    gpu = labels.get("gpu", "")
    uuid = next((labels[name] for name in _UUID_LABELS if labels.get(name)), "")
    if not gpu.isascii() or not gpu.isdigit() or len(gpu) > 6 or not uuid:
        msg = f"line {lineno}: {family} has no gpu index or UUID label"
        raise SourceError(DcgmReason.MISSING_FIELDS, msg)
    instance = labels.get("GPU_I_ID") or None
    # Both become the exported uuid label: bounded, as no GPU's are longer.
    if len(uuid) > MAX_UUID_CHARS:
        msg = (
            f"line {lineno}: {family} has a UUID of {len(uuid)} characters (more than "
            f"{MAX_UUID_CHARS}): no GPU's"
        )
        raise SourceError(DcgmReason.PARSE_ERROR, msg)
    if instance is not None and not (
        instance.isascii() and instance.isdigit() and len(instance) <= 3
    ):
        msg = f"line {lineno}: {family} has a GPU_I_ID of {instance[:20]!r}: no MIG instance ID"
        raise SourceError(DcgmReason.PARSE_ERROR, msg)
    return (int(gpu), uuid, instance)


def _pod_of(labels: Mapping[str, str]) -> PodIdentity | None:
    for pod_label, namespace_label in _POD_LABELS:
        name, namespace = labels.get(pod_label), labels.get(namespace_label)
        if name and namespace:
            return PodIdentity(name, namespace)
    return None


# --------------------------------------------------------------------------------------------
# Which devices are this pod's (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PickFixes:
    """What an error line of a pick tells to do: the sidecar's settings, or a fleet probe's."""

    #: How to name the right dcgm-exporter (the pod's node's).
    node: str
    #: How to name vLLM's GPUs instead of the pod mapping, where there is a way.
    uuids: str | None
    #: How to name the pod whose GPUs the pod mapping gives.
    pod: str


SIDECAR_FIXES: Final = PickFixes(
    node="dcgm_url must be the dcgm-exporter of this pod's node (http://$(NODE_IP):9400/metrics)",
    uuids="set the gpus setting to vLLM's GPU UUIDs",
    pod="set pod_name and pod_namespace (the downward API)",
)
#: Fleet mode: the probe names the exporter; no setting can name one target's GPUs.
FLEET_FIXES: Final = PickFixes(
    node="the probe's dcgm= must be the dcgm-exporter of the pod's node "
    "(http://<its host IP>:9400/metrics)",
    uuids=None,
    pod="give the probe pod= and namespace= (the target's pod)",
)


def _matches(device: DcgmDevice, selector: GpuSelector) -> bool:
    if isinstance(selector, UuidSelector):
        old_mig = _old_mig_uuid(selector.uuid)
        if old_mig is not None:
            return (device.uuid, device.instance) == old_mig
        return device.uuid == selector.uuid
    if isinstance(selector, IndexSelector):
        return device.gpu == selector.index
    return False  # MIG indices and today's MIG UUIDs do not appear in dcgm-exporter's labels


def _old_mig_uuid(uuid: str) -> tuple[str, str] | None:
    """``(GPU UUID, GPU_I_ID)`` of a MIG UUID of the old form ``MIG-GPU-<uuid>/<gi>/<ci>``.

    Drivers before R470 named MIG devices so; today's ``MIG-<uuid>`` says nothing of its GPU.
    """
    if not uuid.startswith("MIG-GPU-"):
        return None
    parts = uuid.removeprefix("MIG-").split("/")
    if len(parts) != 3 or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return parts[0], parts[1]


def _split_by_mig(
    picked: list[DcgmDevice], pod: PodIdentity | None, where: str
) -> tuple[list[DcgmDevice], SourceError | None]:
    """Whole GPUs as picked; of a GPU split into MIG instances, only the pod's instances.

    vLLM runs on one MIG instance of such a GPU, never on the whole: a GPU UUID or index
    picks every instance, other pods' included, and cannot say which is vLLM's.
    """
    split = [d for d in picked if d.instance is not None]
    if not split:
        return picked, None
    mine = [d for d in split if pod is not None and pod in d.pods]
    if mine:
        return [d for d in picked if d.instance is None] + mine, None
    gpu = split[0]
    instances = ", ".join(f"gi{d.instance}" for d in split if d.uuid == gpu.uuid)
    whom = (
        f"none of them mapped to pod {pod}" if pod is not None else "pod_name/pod_namespace unset"
    )
    return [], SourceError(
        DcgmReason.GPUS_NOT_FOUND,
        f"{where} lists GPU {gpu.gpu} ({gpu.uuid}) of the gpus setting as MIG instances "
        f"({instances}; {whom}): a GPU UUID or index cannot say which instance is vLLM's; "
        "leave gpus unset and set pod_name/pod_namespace (the pod mapping)",
    )


def pick_devices(
    answer: DcgmAnswer,
    *,
    explicit: Sequence[GpuSelector] = (),
    pod: PodIdentity | None = None,
    discovered: Callable[[], tuple[tuple[GpuSelector, ...], str]] | None = None,
    where: str = "dcgm-exporter",
    fixes: PickFixes = SIDECAR_FIXES,
) -> tuple[tuple[DcgmDevice, ...], SourceError | None]:
    """The devices of ``answer`` that are this pod's, and the failure if any.

    A partial pick (a device without one of its fields) keeps the complete devices.

    ``explicit`` (the ``gpus`` setting) wins; then ``pod`` through dcgm-exporter's pod mapping;
    then ``discovered()``: vLLM's GPUs from its environment, and a line saying how they were
    found (called only when needed: it scans ``/proc``).

    Where the answer had memory lines too long to read, a failure to find or complete the
    pod's GPUs is a ``parse_error`` that says so: they may be among those lines.
    """
    picked, failure = _pick(
        answer, explicit=explicit, pod=pod, discovered=discovered, where=where, fixes=fixes
    )
    if failure is not None and answer.too_long and failure.reason in _MAYBE_SKIPPED:
        failure = SourceError(
            DcgmReason.PARSE_ERROR,
            f"{_too_long_message(answer.too_long, where)}, and then: {failure}",
        )
    return picked, failure


#: Failures a skipped line may explain (the pod's GPU, its pod label or a field was on it).
_MAYBE_SKIPPED: Final = frozenset(
    {
        DcgmReason.POD_NOT_FOUND,
        DcgmReason.NO_POD_MAPPING,
        DcgmReason.GPUS_NOT_FOUND,
        DcgmReason.MISSING_FIELDS,
    }
)


def _pick(
    answer: DcgmAnswer,
    *,
    explicit: Sequence[GpuSelector],
    pod: PodIdentity | None,
    discovered: Callable[[], tuple[tuple[GpuSelector, ...], str]] | None,
    where: str,
    fixes: PickFixes,
) -> tuple[tuple[DcgmDevice, ...], SourceError | None]:
    if explicit:
        return _pick_explicit(answer, explicit, pod, where)
    if pod is not None:
        picked = [d for d in answer.devices if pod in d.pods]
        if picked:
            return _complete(picked, where)
    selectors, how = discovered() if discovered is not None else ((), "")
    usable = tuple(s for s in selectors if isinstance(s, UuidSelector))
    if usable:
        return _pick_discovered(answer, usable, how, where)
    return (), _not_mapped(answer, pod, where, fixes)


def _pick_explicit(
    answer: DcgmAnswer, explicit: Sequence[GpuSelector], pod: PodIdentity | None, where: str
) -> tuple[tuple[DcgmDevice, ...], SourceError | None]:
    picked = [d for d in answer.devices if any(_matches(d, s) for s in explicit)]
    if not picked:
        wanted = ",".join(str(s) for s in explicit)
        return (), SourceError(
            DcgmReason.GPUS_NOT_FOUND,
            f"{where} lists none of the gpus setting ({wanted}): dcgm_url must be the "
            "dcgm-exporter of this pod's node",
        )
    picked, split = _split_by_mig(picked, pod, where)
    if split is not None:
        return (), split
    return _complete(picked, where)


def _pick_discovered(
    answer: DcgmAnswer, usable: tuple[UuidSelector, ...], how: str, where: str
) -> tuple[tuple[DcgmDevice, ...], SourceError | None]:
    picked = [d for d in answer.devices if any(_matches(d, s) for s in usable)]
    if picked:
        return _complete(picked, where)
    if all(s.uuid.startswith("MIG-") and _old_mig_uuid(s.uuid) is None for s in usable):
        return (), SourceError(
            DcgmReason.GPUS_NOT_FOUND,
            f"vLLM's GPUs are MIG instances ({how}), which {where} names by their GPU's UUID "
            "and GPU_I_ID, never by MIG UUID: set pod_name/pod_namespace (the pod mapping), "
            "or use gpu_source=nvml",
        )
    return (), SourceError(
        DcgmReason.GPUS_NOT_FOUND,
        f"{where} lists none of vLLM's GPUs ({how}): dcgm_url must be the dcgm-exporter of "
        "this pod's node",
    )


def _not_mapped(
    answer: DcgmAnswer, pod: PodIdentity | None, where: str, fixes: PickFixes
) -> SourceError:
    """Why no device could be picked when nothing but the pod mapping was left to try."""
    instead = f", or {fixes.uuids}" if fixes.uuids else ""
    if answer.pod_mapped:
        if pod is None:
            return SourceError(
                DcgmReason.POD_NOT_FOUND,
                f"{where} maps GPUs to pods, but the pod is not named: {fixes.pod}{instead}",
            )
        return SourceError(
            DcgmReason.POD_NOT_FOUND,
            f"{where} maps no GPU to pod {pod}: {fixes.node}; on a GPU shared by time-slicing "
            "it names one pod only unless run with --kubernetes-virtual-gpus" + instead,
        )
    return SourceError(
        DcgmReason.NO_POD_MAPPING,
        f"{where} maps no GPU to any pod: enable its Kubernetes pod mapping (kubelet "
        f"pod-resources socket, on with the GPU Operator){instead}",
    )


def _complete(
    picked: list[DcgmDevice], where: str
) -> tuple[tuple[DcgmDevice, ...], SourceError | None]:
    whole = tuple(d for d in picked if d.complete)
    broken = [d for d in picked if not d.complete]
    if not broken:
        return whole, None
    first = broken[0]
    if first.unreadable is not None:
        return whole, SourceError(DcgmReason.PARSE_ERROR, f"{where}: {first.unreadable}")
    missing = FB_USED if first.used_mib is None else FB_FREE
    return whole, SourceError(
        DcgmReason.MISSING_FIELDS,
        f"{where}: GPU {first.gpu} ({first.label_uuid}) has no {missing}: check the counters "
        "file of dcgm-exporter",
    )
