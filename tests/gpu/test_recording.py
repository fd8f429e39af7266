"""Specification of exporter/gpu/recording.py: the recording format, its fixtures, replay."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import pynvml
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.core.reasons import GpuErrorReason, UnavailableReason
from exporter.errors import UsageError
from exporter.gpu.memory import SplitUnknownReason, split_snapshot
from exporter.gpu.model import (
    ALL_GPUS,
    GpuReading,
    GpuSnapshot,
    IndexSelector,
    MemoryApi,
    MigIndexSelector,
    NvmlCall,
    NvmlUnavailable,
    UuidSelector,
)
from exporter.gpu.recording import (
    RECORDING_FORMAT,
    NvmlRecordingError,
    RecordedFailure,
    RecordedGpuReader,
    RecordedSample,
    Recording,
    load_recording,
    parse_recording,
    recording_to_json,
    replay_sample,
    sample_from_snapshot,
)
from tests import paths
from tests.gpu.fakes import (
    UUID_A,
    UUID_B,
    FakeDevice,
    GiB,
    MiB,
    make_reader,
    processes_strategy,
    two_gpus,
)

if TYPE_CHECKING:
    from pathlib import Path

FIXTURES = paths.NVML


def fixture_paths() -> list[Path]:
    """Every recorded-NVML fixture file."""
    return sorted(FIXTURES.glob("*.json"))


def test_every_fixture_recording_loads_and_says_it_is_synthetic() -> None:
    """All recorded fixtures parse, and none pretends to be a hardware capture."""
    paths = fixture_paths()
    assert len(paths) >= 5
    for path in paths:
        recording = load_recording(path)
        assert recording.source == "synthetic"
        assert recording.samples


def test_fixture_files_are_exactly_what_the_writer_produces() -> None:
    """Each fixture is in canonical form: parsing then writing gives the same text back."""
    for path in fixture_paths():
        text = path.read_text()
        assert recording_to_json(parse_recording(text)) == text


def test_single_h100_recording_shows_vllm_using_72_gib() -> None:
    """The H100 recording attributes 72 GiB to vLLM's engine and the small rest to foreign."""
    reader = RecordedGpuReader.from_file(FIXTURES / "h100-vllm-72gib.json")
    snapshot = reader.read((UuidSelector(UUID_A),))
    [split] = split_snapshot(snapshot, {7, 45})
    assert split.vllm_bytes == 72 * GiB
    assert split.foreign_bytes == 40 * MiB
    assert snapshot.gpus[0].total_bytes - snapshot.gpus[0].free_bytes > 72 * GiB


def test_shared_gpu_recording_shows_a_growing_foreign_process() -> None:
    """Replaying the shared-GPU recording, foreign memory grows while vLLM's stays put."""
    reader = RecordedGpuReader.from_file(FIXTURES / "shared-gpu-foreign.json")
    first = split_snapshot(reader.read(ALL_GPUS), {45})[0]
    second = split_snapshot(reader.read(ALL_GPUS), {45})[0]
    assert first.vllm_bytes == second.vllm_bytes == 60 * GiB
    assert first.foreign_bytes is not None
    assert second.foreign_bytes is not None
    assert second.foreign_bytes > first.foreign_bytes
    assert (first.foreign_process_count, second.foreign_process_count) == (1, 2)


def test_lost_gpu_recording_goes_from_read_to_lost_to_not_found() -> None:
    """Selecting both GPUs by UUID: GPU B reads, then is gpu_lost, then is not found; A reads on."""
    reader = RecordedGpuReader.from_file(FIXTURES / "gpu-lost-mid-run.json")
    selection = (UuidSelector(UUID_A), UuidSelector(UUID_B))
    timeline = [reader.read(selection) for _ in range(4)]
    assert [len(s.gpus) for s in timeline] == [2, 1, 1, 1]
    assert [s.fault_key for s in timeline] == [
        (),
        (f"{UUID_B}:memory:gpu_lost",),
        (f"{UUID_B}:lookup:not_found",),
        (f"{UUID_B}:lookup:not_found",),  # the last sample holds
    ]


def test_per_gpu_failure_recording_replays_both_failures() -> None:
    """A refused process list keeps GPU 0's reading; GPU 1's memory timeout is an error only."""
    snapshot = RecordedGpuReader.from_file(FIXTURES / "per-gpu-call-failure.json").read(
        (IndexSelector(0), IndexSelector(1))
    )
    assert [(r.index, r.processes) for r in snapshot.gpus] == [(0, None)]
    assert [(e.selector, e.call, e.reason) for e in snapshot.errors] == [
        ("0", NvmlCall.PROCESSES, GpuErrorReason.NO_PERMISSION),
        ("1", NvmlCall.MEMORY, GpuErrorReason.TIMEOUT),
    ]
    [split] = split_snapshot(snapshot, {80})
    assert split.unknown_reason is SplitUnknownReason.PROCESS_LIST_UNAVAILABLE


def test_no_driver_recording_is_unavailable() -> None:
    """The no-driver recording replays as NVML unavailable, library_not_found."""
    snapshot = RecordedGpuReader.from_file(FIXTURES / "no-driver.json").read(ALL_GPUS)
    assert snapshot.unavailable is not None
    assert snapshot.unavailable.reason is UnavailableReason.LIBRARY_NOT_FOUND


def test_recorded_reader_loops_when_asked() -> None:
    """With loop=True the reader starts the sequence over after the last sample."""
    reader = RecordedGpuReader.from_file(FIXTURES / "gpu-lost-mid-run.json", loop=True)
    counts = [len(reader.read(ALL_GPUS).gpus) for _ in range(5)]
    assert counts == [2, 1, 1, 2, 1]


def test_replay_filters_by_selection_and_reports_missing_gpus() -> None:
    """A recorded sample answers only for the selected GPUs; unknown ones are not_found."""
    sample = load_recording(FIXTURES / "tp2-vllm.json").samples[0]
    snapshot = replay_sample(
        sample, (IndexSelector(1), UuidSelector("GPU-feed"), MigIndexSelector(0, 0))
    )
    assert [r.index for r in snapshot.gpus] == [1]
    assert [(e.selector, e.reason) for e in snapshot.errors] == [
        ("GPU-feed", GpuErrorReason.NOT_FOUND),
        ("0:0", GpuErrorReason.NOT_FOUND),
    ]


def test_a_recorded_reader_needs_at_least_one_sample() -> None:
    """An empty recording is refused with a usage error."""
    with pytest.raises(NvmlRecordingError, match="at least one sample"):
        RecordedGpuReader(Recording("synthetic", "", ()))


def test_sample_from_a_live_snapshot_replays_to_the_same_snapshot() -> None:
    """Recording a read of all GPUs and replaying it for all GPUs gives the same snapshot back."""
    nvml = two_gpus()
    nvml.devices[0].fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NO_PERMISSION
    nvml.devices.append(
        FakeDevice(
            2, "GPU-lost", fail={"nvmlDeviceGetMemoryInfo_v2": pynvml.NVML_ERROR_GPU_IS_LOST}
        )
    )
    live = make_reader(nvml).read(ALL_GPUS)
    sample = sample_from_snapshot(live, t=0.0)
    recording = Recording("captured", "fake", (sample,))
    replayed = replay_sample(parse_recording(recording_to_json(recording)).samples[0], ALL_GPUS)
    assert replayed.gpus == live.gpus
    assert sorted(replayed.errors, key=str) == sorted(live.errors, key=str)


def test_an_unavailable_snapshot_records_and_replays_as_unavailable() -> None:
    """An unavailable read is recorded as such (without the retry delay)."""
    live = GpuSnapshot(unavailable=NvmlUnavailable(UnavailableReason.DRIVER_NOT_LOADED, "x", 5.0))
    sample = sample_from_snapshot(live, t=1.5)
    text = recording_to_json(Recording("captured", "", (sample,)))
    replayed = replay_sample(parse_recording(text).samples[0], ALL_GPUS)
    assert replayed.unavailable == NvmlUnavailable(UnavailableReason.DRIVER_NOT_LOADED, "x")


GOOD_READING: dict[str, Any] = {
    "index": 0,
    "uuid": UUID_A,
    "name": "H100",
    "memory": {"api": "v2", "total": 100, "free": 30, "used": 60, "reserved": 10},
    "processes": [{"pid": 45, "used": 60}],
}


def document(**sample_changes: Any) -> dict[str, Any]:
    """A valid one-sample recording document, with the sample's fields changed as given."""
    sample: dict[str, Any] = {"t": 0, "gpus": [json.loads(json.dumps(GOOD_READING))]}
    sample.update(sample_changes)
    return {"format": RECORDING_FORMAT, "source": "synthetic", "samples": [sample]}


def with_reading(**changes: Any) -> dict[str, Any]:
    """A valid document whose reading has fields (``memory_<field>`` for memory) changed."""
    reading = json.loads(json.dumps(GOOD_READING))
    for key, value in changes.items():
        if key.startswith("memory_"):
            reading["memory"][key.removeprefix("memory_")] = value
        else:
            reading[key] = value
    return document(gpus=[reading])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not JSON"),
        ("[]", "the document must be a JSON object"),
        (json.dumps({**document(), "format": "other/v9"}), "format must be"),
        (json.dumps({**document(), "samples": []}), "samples must be a non-empty list"),
        (
            json.dumps({k: v for k, v in document().items() if k != "source"}),
            "source must be a string",
        ),
        (json.dumps(document(t="soon")), r"samples\[0\]\.t must be a number"),
        (json.dumps(document(t=float("inf"))), r"samples\[0\]\.t must be a finite number"),
        (
            json.dumps(with_reading(memory_total=-1)),
            r"gpus\[0\]\.memory\.total must be a non-negative",
        ),
        (json.dumps(with_reading(memory_used=True)), r"memory\.used must be a non-negative"),
        (json.dumps(with_reading(memory_api="v3")), r"memory\.api must be one of v2, v1"),
        (json.dumps(with_reading(memory_reserved=None)), r"memory\.reserved must be"),
        (json.dumps(with_reading(processes={"pid": 1})), r"processes must be a list or null"),
        (json.dumps(with_reading(processes=[{"used": 1}])), r"processes\[0\]\.pid must be"),
        (json.dumps(with_reading(uuid=7)), r"gpus\[0\]\.uuid must be a string"),
        (
            json.dumps(document(failures=[{"call": "memory", "reason": "melted"}])),
            r"failures\[0\]\.reason must be one of",
        ),
        (
            json.dumps(document(unavailable={"reason": "bad"})),
            r"unavailable\.reason must be one of",
        ),
    ],
)
def test_malformed_recordings_fail_with_one_line_naming_the_field(text: str, message: str) -> None:
    """Every malformed recording raises a UsageError whose single line names file and field."""
    with pytest.raises(NvmlRecordingError, match=message) as caught:
        parse_recording(text, origin="rec.json")
    assert isinstance(caught.value, UsageError)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("rec.json: ")


def test_an_unreadable_recording_file_is_a_usage_error(tmp_path: Path) -> None:
    """A missing file raises NvmlRecordingError naming the path."""
    with pytest.raises(NvmlRecordingError, match="cannot read NVML recording"):
        load_recording(tmp_path / "absent.json")


reading_strategy = st.builds(
    GpuReading,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.text(min_size=1, max_size=20),
    name=st.text(max_size=20),
    total_bytes=st.integers(min_value=0, max_value=2**50),
    used_bytes=st.integers(min_value=0, max_value=2**50),
    free_bytes=st.integers(min_value=0, max_value=2**50),
    reserved_bytes=st.integers(min_value=0, max_value=2**40),
    memory_api=st.just(MemoryApi.V2),
    processes=st.one_of(st.none(), processes_strategy.map(tuple)),
) | st.builds(
    GpuReading,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.text(min_size=1, max_size=20),
    name=st.text(max_size=20),
    total_bytes=st.integers(min_value=0, max_value=2**50),
    used_bytes=st.integers(min_value=0, max_value=2**50),
    free_bytes=st.integers(min_value=0, max_value=2**50),
    reserved_bytes=st.none(),
    memory_api=st.just(MemoryApi.V1),
    processes=st.one_of(st.none(), processes_strategy.map(tuple)),
)
failure_strategy = st.builds(
    RecordedFailure,
    index=st.one_of(st.none(), st.integers(min_value=0, max_value=15)),
    uuid=st.one_of(st.none(), st.text(max_size=20)),
    call=st.sampled_from(NvmlCall),
    reason=st.sampled_from(GpuErrorReason),
    detail=st.text(max_size=30),
)
sample_strategy = st.builds(
    RecordedSample,
    t=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    gpus=st.lists(reading_strategy, max_size=3).map(tuple),
    failures=st.lists(failure_strategy, max_size=2).map(tuple),
) | st.builds(
    RecordedSample,
    t=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    unavailable=st.builds(
        NvmlUnavailable, reason=st.sampled_from(UnavailableReason), detail=st.text(max_size=30)
    ),
)


@given(
    recording=st.builds(
        Recording,
        source=st.sampled_from(["synthetic", "captured"]),
        description=st.text(max_size=40),
        samples=st.lists(sample_strategy, min_size=1, max_size=3).map(tuple),
    )
)
def test_recording_json_round_trips(recording: Recording) -> None:
    """Writing any recording and parsing it back gives the same recording."""
    assert parse_recording(recording_to_json(recording)) == recording


def test_the_recorder_script_writes_a_recording_the_replayer_reads(tmp_path: Path) -> None:
    """scripts/record-nvml.py writes a captured recording; exit 1 only if NVML was never usable."""
    import subprocess

    out = tmp_path / "capture.json"
    script = paths.REPO / "scripts" / "record-nvml.py"
    done = subprocess.run(
        [sys.executable, str(script), "--samples", "2", "--interval", "0", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    recording = load_recording(out)
    assert recording.source == "captured"
    assert len(recording.samples) == 2
    never_available = all(s.unavailable is not None for s in recording.samples)
    assert done.returncode == (1 if never_available else 0), done.stderr
    assert f"wrote {out}" in done.stderr


@pytest.mark.parametrize(
    ("gpus", "error"),
    [
        (["--gpu", "0"], None),
        (["--gpu", "0", "--gpu", "1"], None),
        (["--gpu", "all"], "--gpu all: leave --gpu out to record every GPU NVML sees"),
        (["--gpu", "GPU-bad!"], "'GPU-bad!' is not a GPU"),
    ],
)
def test_the_recorder_script_records_chosen_gpus_or_names_a_bad_one(
    tmp_path: Path, gpus: list[str], error: str | None
) -> None:
    """--gpu picks GPUs by index or UUID; a bad entry is one line naming it, exit 2."""
    import subprocess

    out = tmp_path / "capture.json"
    script = paths.REPO / "scripts" / "record-nvml.py"
    argv = [sys.executable, str(script), *gpus, "--samples", "1", "--interval", "0"]
    done = subprocess.run(
        [*argv, "--out", str(out)], capture_output=True, text=True, timeout=120, check=False
    )
    assert "Traceback" not in done.stderr
    if error is None:
        assert load_recording(out).source == "captured", done.stderr
        assert done.returncode in {0, 1}, done.stderr
    else:
        assert done.returncode == 2
        assert done.stderr.strip().splitlines()[-1].startswith(f"record-nvml.py: error: {error}")
        assert not out.exists()
