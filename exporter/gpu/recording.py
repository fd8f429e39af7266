"""Recorded NVML readings: the JSON format, and a reader that replays them.

``scripts/record-nvml.py`` writes recordings on a machine with a driver; tests replay them
through the same :class:`~exporter.gpu.model.GpuReader` seam as the real reader. The format is
defined here, by :func:`recording_to_json` and :func:`parse_recording`.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from exporter.core.reasons import GpuErrorReason, UnavailableReason
from exporter.errors import UsageError
from exporter.gpu.model import (
    ALL_GPUS,
    AllGpus,
    GpuError,
    GpuProcess,
    GpuReading,
    GpuSnapshot,
    IndexSelector,
    MemoryApi,
    NvmlCall,
    NvmlUnavailable,
    UuidSelector,
)
from exporter.validation import first_problem

if TYPE_CHECKING:
    from pathlib import Path

    from exporter.gpu.model import GpuSelection, GpuSelector

#: The ``format`` field of every recording this module reads and writes.
RECORDING_FORMAT: Final = "vllm-headroom/nvml-recording/v1"


class NvmlRecordingError(UsageError):
    """A recorded-NVML JSON file cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class RecordedFailure:
    """A failed call on one GPU in a recorded sample, identified by its index and/or UUID.

    With ``call=processes`` the GPU also has a reading (its ``processes`` is ``None``); with
    any other call it has none. Both identities ``None``: a failure for all GPUs (``count``).
    """

    index: int | None
    uuid: str | None
    call: NvmlCall
    reason: GpuErrorReason
    detail: str


@dataclass(frozen=True, slots=True)
class RecordedSample:
    """One recorded read of every GPU: readings and failures, or NVML unavailable."""

    t: float
    gpus: tuple[GpuReading, ...] = ()
    failures: tuple[RecordedFailure, ...] = ()
    unavailable: NvmlUnavailable | None = None


@dataclass(frozen=True, slots=True)
class Recording:
    """A sequence of samples, as :func:`parse_recording` reads it from one file.

    ``source`` says where the numbers come from: ``synthetic`` or ``captured`` (by
    ``scripts/record-nvml.py`` on real hardware, with the driver version in ``description``).
    """

    source: str
    description: str
    samples: tuple[RecordedSample, ...]


def replay_sample(sample: RecordedSample, selection: GpuSelection) -> GpuSnapshot:
    """What a reader would have returned for ``selection`` when ``sample`` was recorded.

    A selected GPU absent from the sample is ``not_found``, as NVML reports a GPU that has left
    the bus. MIG index selectors match nothing (recordings identify MIG devices by UUID).
    """
    if sample.unavailable is not None:
        return GpuSnapshot(unavailable=sample.unavailable)
    gpus: list[GpuReading] = []
    errors: list[GpuError] = []
    if isinstance(selection, AllGpus):
        gpus.extend(sample.gpus)
        errors.extend(
            GpuError(_recorded_name(f.index, f.uuid), f.call, f.reason, f.detail)
            for f in sample.failures
        )
        return GpuSnapshot(gpus=tuple(gpus), errors=tuple(errors))
    for selector in selection:
        name = str(selector)
        readings = [r for r in sample.gpus if _matches(selector, r.index, r.uuid)]
        failures = [f for f in sample.failures if _matches(selector, f.index, f.uuid)]
        gpus.extend(readings[:1])
        errors.extend(GpuError(name, f.call, f.reason, f.detail) for f in failures)
        if not readings and not failures:
            detail = "not in the recorded sample"
            errors.append(GpuError(name, NvmlCall.LOOKUP, GpuErrorReason.NOT_FOUND, detail))
    return GpuSnapshot(gpus=tuple(gpus), errors=tuple(errors))


def _matches(selector: GpuSelector, index: int | None, uuid: str | None) -> bool:
    if isinstance(selector, UuidSelector):
        return uuid is not None and uuid == selector.uuid
    if isinstance(selector, IndexSelector):
        return index is not None and index == selector.index
    return False


def _recorded_name(index: int | None, uuid: str | None) -> str:
    if index is not None:
        return str(index)
    return uuid if uuid is not None else str(ALL_GPUS)


class RecordedGpuReader:
    """Replays a recording: each :meth:`read` returns the next sample, filtered by ``selection``.

    After the last sample it keeps returning the last one, or starts over with ``loop=True``.
    """

    def __init__(self, recording: Recording, *, loop: bool = False) -> None:
        if not recording.samples:
            msg = "an NVML recording needs at least one sample"
            raise NvmlRecordingError(msg)
        self._samples = recording.samples
        self._loop = loop
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path, *, loop: bool = False) -> RecordedGpuReader:
        """A reader over the recording in ``path``; a bad file raises NvmlRecordingError."""
        return cls(load_recording(path), loop=loop)

    def read(self, selection: GpuSelection) -> GpuSnapshot:
        """The next recorded sample, as NVML would have answered for ``selection``."""
        with self._lock:
            sample = self._samples[self._next]
            if self._next + 1 < len(self._samples):
                self._next += 1
            elif self._loop:
                self._next = 0
        return replay_sample(sample, selection)

    def close(self) -> None:
        """Nothing to release."""


def sample_from_snapshot(snapshot: GpuSnapshot, t: float) -> RecordedSample:
    """The sample to record for ``snapshot`` (a read of every GPU), taken ``t`` seconds in."""
    if snapshot.unavailable is not None:
        return RecordedSample(t=t, unavailable=snapshot.unavailable)
    failures: list[RecordedFailure] = []
    for error in snapshot.errors:
        index: int | None = int(error.selector) if error.selector.isdigit() else None
        uuid: str | None = error.selector if error.selector.startswith(("GPU-", "MIG-")) else None
        if error.call is NvmlCall.PROCESSES:
            # Identify it by the reading it belongs to, whichever way it was selected.
            for reading in snapshot.gpus:
                if reading.uuid == uuid or (index is not None and reading.index == index):
                    index, uuid = reading.index, reading.uuid
                    break
        failures.append(RecordedFailure(index, uuid, error.call, error.reason, error.detail))
    return RecordedSample(t=t, gpus=snapshot.gpus, failures=tuple(failures))


def load_recording(path: Path) -> Recording:
    """Read and check a recording file; problems raise :class:`NvmlRecordingError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"cannot read NVML recording {path}: {exc}"
        raise NvmlRecordingError(msg) from exc
    return parse_recording(text, origin=str(path))


def recording_to_json(recording: Recording) -> str:
    """The JSON text of ``recording``: the inverse of :func:`parse_recording`."""
    document = {
        "format": RECORDING_FORMAT,
        "source": recording.source,
        "description": recording.description,
        "samples": [_sample_json(sample) for sample in recording.samples],
    }
    return json.dumps(document, indent=1) + "\n"


def _sample_json(sample: RecordedSample) -> dict[str, Any]:
    if sample.unavailable is not None:
        unavailable = {
            "reason": str(sample.unavailable.reason),
            "detail": sample.unavailable.detail,
        }
        return {"t": sample.t, "unavailable": unavailable}
    gpus: list[dict[str, Any]] = []
    for reading in sample.gpus:
        memory: dict[str, Any] = {
            "api": str(reading.memory_api),
            "total": reading.total_bytes,
            "free": reading.free_bytes,
            "used": reading.used_bytes,
        }
        if reading.reserved_bytes is not None:
            memory["reserved"] = reading.reserved_bytes
        processes = (
            None
            if reading.processes is None
            else [{"pid": p.pid, "used": p.used_bytes} for p in reading.processes]
        )
        gpus.append(
            {
                "index": reading.index,
                "uuid": reading.uuid,
                "name": reading.name,
                "memory": memory,
                "processes": processes,
            }
        )
    failures = [
        {
            "index": f.index,
            "uuid": f.uuid,
            "call": str(f.call),
            "reason": str(f.reason),
            "detail": f.detail,
        }
        for f in sample.failures
    ]
    return {"t": sample.t, "gpus": gpus, "failures": failures}


def parse_recording(text: str, *, origin: str = "recording") -> Recording:
    """Parse a recording's JSON; an error names ``origin`` and the offending field, on one line."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{origin}: not JSON ({exc.msg} at line {exc.lineno}); expected an NVML recording"
        raise NvmlRecordingError(msg) from exc
    try:
        parsed = _DOCUMENT.validate_python(document)
    except ValidationError as exc:
        raise NvmlRecordingError(f"{origin}: {_describe(exc)}") from None
    return parsed.to_recording()


# --- the JSON format, as pydantic models -----------------------------------------------------
# Each field's description is what it must be: error messages quote it, so the format is
# documented once, where it is checked.

_WHOLE = "a non-negative integer"
Whole = Annotated[int, Field(strict=True, ge=0, description=_WHOLE)]
OptionalWhole = Annotated[int | None, Field(strict=True, ge=0, description=_WHOLE)]
Text = Annotated[str, Field(strict=True, description="a string")]


class _Model(BaseModel):
    # validate_default: a missing required field fails on its default (None) with the same
    # message as a field of the wrong type, which names what the field must be.
    model_config = ConfigDict(frozen=True, extra="ignore", validate_default=True)


class _Process(_Model):
    pid: Whole = None  # type: ignore[assignment]
    used: OptionalWhole = None

    def to_process(self) -> GpuProcess:
        return GpuProcess(pid=self.pid, used_bytes=self.used)


class _Memory(_Model):
    api: Annotated[MemoryApi, Field(description=f"one of {', '.join(MemoryApi)}")] = None  # type: ignore[assignment]
    total: Whole = None  # type: ignore[assignment]
    free: Whole = None  # type: ignore[assignment]
    used: Whole = None  # type: ignore[assignment]
    reserved: OptionalWhole = None

    @model_validator(mode="after")
    def _reserved_with_v2(self) -> _Memory:
        # v2 reports the driver's reservation; a v2 reading without it is not one.
        if self.api is MemoryApi.V2 and self.reserved is None:
            raise PydanticCustomError("reserved", "reserved")
        return self


class _Reading(_Model):
    index: OptionalWhole = None
    uuid: Text = None  # type: ignore[assignment]
    name: Text = None  # type: ignore[assignment]
    memory: _Memory = None  # type: ignore[assignment]
    processes: Annotated[list[_Process] | None, Field(description="a list or null")] = None

    def to_reading(self) -> GpuReading:
        memory = self.memory
        return GpuReading(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            total_bytes=memory.total,
            used_bytes=memory.used,
            free_bytes=memory.free,
            reserved_bytes=memory.reserved if memory.api is MemoryApi.V2 else None,
            memory_api=memory.api,
            processes=(
                None if self.processes is None else tuple(p.to_process() for p in self.processes)
            ),
        )


class _Failure(_Model):
    index: OptionalWhole = None
    uuid: Annotated[str | None, Field(strict=True, description="a string or null")] = None
    call: Annotated[NvmlCall, Field(description=f"one of {', '.join(NvmlCall)}")] = None  # type: ignore[assignment]
    reason: Annotated[GpuErrorReason, Field(description=f"one of {', '.join(GpuErrorReason)}")] = (
        None  # type: ignore[assignment]
    )
    detail: Text = ""

    def to_failure(self) -> RecordedFailure:
        return RecordedFailure(self.index, self.uuid, self.call, self.reason, self.detail)


class _Unavailable(_Model):
    reason: Annotated[
        UnavailableReason, Field(description=f"one of {', '.join(UnavailableReason)}")
    ] = None  # type: ignore[assignment]
    detail: Text = ""


class _Sample(_Model):
    t: Annotated[float, Field(strict=True, allow_inf_nan=False, description="a number")] = None  # type: ignore[assignment]
    gpus: Annotated[list[_Reading], Field(description="a list")] = Field(default_factory=list)
    failures: Annotated[list[_Failure], Field(description="a list")] = Field(default_factory=list)
    unavailable: _Unavailable | None = None

    def to_sample(self) -> RecordedSample:
        if self.unavailable is not None:
            return RecordedSample(
                t=self.t,
                unavailable=NvmlUnavailable(self.unavailable.reason, self.unavailable.detail),
            )
        return RecordedSample(
            t=self.t,
            gpus=tuple(g.to_reading() for g in self.gpus),
            failures=tuple(f.to_failure() for f in self.failures),
        )


class _Document(_Model):
    format: Annotated[
        Literal["vllm-headroom/nvml-recording/v1"], Field(description=repr(RECORDING_FORMAT))
    ] = None  # type: ignore[assignment]
    source: Text = None  # type: ignore[assignment]
    description: Text = ""
    samples: Annotated[
        list[_Sample],
        Field(min_length=1, description="a non-empty list (record at least one sample)"),
    ] = None  # type: ignore[assignment]

    def to_recording(self) -> Recording:
        return Recording(
            source=self.source,
            description=self.description,
            samples=tuple(s.to_sample() for s in self.samples),
        )


_DOCUMENT: Final = TypeAdapter(_Document)


def _describe(exc: ValidationError) -> str:
    """``where must be what`` for the first problem, from the fields' descriptions."""
    where, expected = first_problem(exc, _Document, custom={"reserved": ("reserved", _WHOLE)})
    return f"{where or 'the document'} must be {expected}"
