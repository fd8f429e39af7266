"""Specification of exporter.gpu.visibility: which GPUs are vLLM's, and vLLM's PIDs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from exporter.cli.logsetup import configure_logging
from exporter.core.reasons import VisibilityState
from exporter.errors import UsageError
from exporter.gpu import visibility as visibility_module
from exporter.gpu.memory import split_snapshot
from exporter.gpu.model import ALL_GPUS, GpuSelector, IndexSelector, MigIndexSelector, UuidSelector
from exporter.gpu.recording import RecordedGpuReader
from exporter.gpu.visibility import (
    CUDA_VISIBLE_DEVICES,
    NVIDIA_VISIBLE_DEVICES,
    DeviceListKind,
    GpuSelectorError,
    GpuVisibility,
    ProcessEntry,
    discover_gpu_visibility,
    is_vllm_server,
    parse_gpu_selectors,
    parse_selector,
    parse_visible_devices,
    read_visibility_environ,
    resolve_visible_devices,
    scan_processes,
    vllm_process_tree,
)
from exporter.service.launch import ProcessLaunchSource
from tests import paths

if TYPE_CHECKING:
    from pathlib import Path

FIXTURES = paths.FIXTURES
PROC = FIXTURES / "proc"
UUID_A = "GPU-3f8a2c1e-7b4d-4e9a-8c2f-5d6e7f809a1b"
UUID_B = "GPU-9c1d4e2f-3a5b-4c6d-8e7f-0a1b2c3d4e5f"
MIG = "MIG-1a2b3c4d-0000-5e6f-7a8b-9c0d1e2f3a4b"
NOT_US = 999_999  # a self PID that is in no fixture


# --------------------------------------------------------------------------------------------
# One GPU, one list
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (UUID_A, UuidSelector(UUID_A)),
        (f"  {UUID_A} ", UuidSelector(UUID_A)),
        ("GPU-3f8a2c1e", UuidSelector("GPU-3f8a2c1e")),  # a UUID prefix, as CUDA accepts
        (MIG, UuidSelector(MIG)),
        (f"MIG-{UUID_A}/1/0", UuidSelector(f"MIG-{UUID_A}/1/0")),  # pre-R470 MIG name
        ("0", IndexSelector(0)),
        ("12", IndexSelector(12)),
        ("0:1", MigIndexSelector(0, 1)),
        ("-1", None),
        ("", None),
        ("gpu0", None),
        ("GPU-not-hex!", None),
        ("all", None),
        ("1.5", None),
    ],
)
def test_parse_selector_knows_each_runtime_form(token: str, expected: GpuSelector | None) -> None:
    """UUIDs, MIG UUIDs, indices and MIG indices parse; anything else is not a GPU."""
    assert parse_selector(token) == expected


def test_parse_gpu_selectors_keeps_order_and_drops_duplicates() -> None:
    """A settings list keeps the user's order and each GPU once."""
    assert parse_gpu_selectors([UUID_B, "0", UUID_B, " 0 ", "1:0"]) == (
        UuidSelector(UUID_B),
        IndexSelector(0),
        MigIndexSelector(1, 0),
    )


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["0", "gpu1"], r"'gpu1' is not a GPU: use GPU UUIDs"),
        (["all"], r"'all' is not a GPU list; .* gpu_discovery=all"),
        ([], r"gpus is empty"),
        (["  "], r"is not a GPU"),
    ],
)
def test_bad_gpu_settings_are_one_line_usage_errors(entries: list[str], message: str) -> None:
    """A malformed gpus setting raises a UsageError naming the entry and the fix, on one line."""
    with pytest.raises(GpuSelectorError, match=message) as caught:
        parse_gpu_selectors(entries)
    assert isinstance(caught.value, UsageError)
    assert "\n" not in str(caught.value)


gpu_tokens = st.one_of(
    st.integers(min_value=0, max_value=64).map(str),
    st.uuids().map(lambda u: f"GPU-{u}"),
    st.uuids().map(lambda u: f"MIG-{u}"),
    st.tuples(st.integers(0, 8), st.integers(0, 6)).map(lambda t: f"{t[0]}:{t[1]}"),
)


@given(st.lists(gpu_tokens, min_size=1, max_size=8))
def test_runtime_lists_round_trip_through_the_parser(tokens: list[str]) -> None:
    """Any comma list of GPU forms parses to those GPUs, once each, in order."""
    parsed = parse_visible_devices(NVIDIA_VISIBLE_DEVICES, ",".join(tokens))
    assert parsed.kind is DeviceListKind.LIST
    assert [str(s) for s in parsed.selectors] == list(dict.fromkeys(tokens))


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (None, DeviceListKind.UNSET),
        ("all", DeviceListKind.ALL),
        ("ALL", DeviceListKind.ALL),
        ("none", DeviceListKind.NONE),
        ("void", DeviceListKind.NONE),
        ("", DeviceListKind.NONE),
        (f"{UUID_A},{UUID_B}", DeviceListKind.LIST),
        ("0,1", DeviceListKind.LIST),
        ("0,gpu1", DeviceListKind.INVALID),
    ],
)
def test_nvidia_visible_devices_values(value: str | None, kind: DeviceListKind) -> None:
    """NVIDIA_VISIBLE_DEVICES: all, none/void/empty, lists, and anything else invalid."""
    assert parse_visible_devices(NVIDIA_VISIBLE_DEVICES, value).kind is kind


@pytest.mark.parametrize(
    ("value", "kind", "selectors"),
    [
        ("0,1", DeviceListKind.LIST, (IndexSelector(0), IndexSelector(1))),
        ("2,-1,3", DeviceListKind.LIST, (IndexSelector(2),)),  # CUDA stops at the first invalid
        ("-1", DeviceListKind.NONE, ()),
        ("", DeviceListKind.NONE, ()),
        ("x,0", DeviceListKind.NONE, ()),
        (f"{UUID_B},0", DeviceListKind.LIST, (UuidSelector(UUID_B), IndexSelector(0))),
        ("0:1", DeviceListKind.NONE, ()),  # not a CUDA form
    ],
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(
    value: str, kind: DeviceListKind, selectors: tuple[GpuSelector, ...]
) -> None:
    """CUDA_VISIBLE_DEVICES: entries up to the first invalid one; none valid means no GPU."""
    parsed = parse_visible_devices(CUDA_VISIBLE_DEVICES, value)
    assert (parsed.kind, parsed.selectors) == (kind, selectors)


# --------------------------------------------------------------------------------------------
# An environment decides the GPUs
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "state", "selectors"),
    [
        (
            {NVIDIA_VISIBLE_DEVICES: f"{UUID_A},{UUID_B}"},
            VisibilityState.FROM_PROCESS,
            (UuidSelector(UUID_A), UuidSelector(UUID_B)),
        ),
        ({NVIDIA_VISIBLE_DEVICES: "all"}, VisibilityState.ALL_GPUS, ()),
        ({}, VisibilityState.ALL_GPUS, ()),
        ({NVIDIA_VISIBLE_DEVICES: "void"}, VisibilityState.NO_GPUS, ()),
        ({NVIDIA_VISIBLE_DEVICES: "none"}, VisibilityState.NO_GPUS, ()),
        ({NVIDIA_VISIBLE_DEVICES: "0,bogus"}, VisibilityState.INVALID, ()),
        ({CUDA_VISIBLE_DEVICES: "-1"}, VisibilityState.NO_GPUS, ()),
        (
            {CUDA_VISIBLE_DEVICES: "2,3"},
            VisibilityState.FROM_PROCESS,
            (IndexSelector(2), IndexSelector(3)),
        ),
        (
            {NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: "1"},
            VisibilityState.FROM_PROCESS,
            (IndexSelector(1),),
        ),
        (
            # CUDA indices count the container's GPUs in PCI order: 0 is node GPU 3 here.
            {NVIDIA_VISIBLE_DEVICES: "5,3", CUDA_VISIBLE_DEVICES: "0"},
            VisibilityState.FROM_PROCESS,
            (IndexSelector(3),),
        ),
        (
            {NVIDIA_VISIBLE_DEVICES: "5,3", CUDA_VISIBLE_DEVICES: "2"},
            VisibilityState.AMBIGUOUS,
            (),
        ),
        (
            {NVIDIA_VISIBLE_DEVICES: f"{UUID_A},{UUID_B}", CUDA_VISIBLE_DEVICES: "1,0"},
            VisibilityState.FROM_PROCESS,
            (UuidSelector(UUID_A), UuidSelector(UUID_B)),
        ),
        (
            # One of two UUIDs by position: which one depends on a PCI order we cannot see.
            {NVIDIA_VISIBLE_DEVICES: f"{UUID_A},{UUID_B}", CUDA_VISIBLE_DEVICES: "1"},
            VisibilityState.AMBIGUOUS,
            (),
        ),
        (
            {NVIDIA_VISIBLE_DEVICES: f"{UUID_A},{UUID_B}", CUDA_VISIBLE_DEVICES: UUID_B},
            VisibilityState.FROM_PROCESS,
            (UuidSelector(UUID_B),),
        ),
        (
            {NVIDIA_VISIBLE_DEVICES: f"{UUID_A}", CUDA_VISIBLE_DEVICES: ""},
            VisibilityState.NO_GPUS,
            (),
        ),
        ({NVIDIA_VISIBLE_DEVICES: MIG}, VisibilityState.FROM_PROCESS, (UuidSelector(MIG),)),
    ],
)
def test_resolve_visible_devices(
    environ: dict[str, str], state: VisibilityState, selectors: tuple[GpuSelector, ...]
) -> None:
    """The two variables together decide the GPUs, or say plainly why they cannot."""
    visibility = resolve_visible_devices(environ, vllm_pids=frozenset({7}))
    assert (visibility.state, visibility.selectors) == (state, selectors)
    assert visibility.vllm_pids == {7}
    assert visibility.detail
    assert "\n" not in visibility.detail


def test_all_gpus_detail_tells_the_user_what_to_set() -> None:
    """When vLLM sees every GPU, the detail names both ways out: UUIDs or gpu_discovery=all."""
    detail = resolve_visible_devices({NVIDIA_VISIBLE_DEVICES: "all"}).detail
    assert "gpus setting" in detail
    assert "gpu_discovery=all" in detail


def test_selection_reads_all_gpus_only_when_allowed() -> None:
    """ALL_GPUS becomes a read of every GPU only with allow_all; other empty states read nothing."""
    everything = GpuVisibility(VisibilityState.ALL_GPUS)
    assert everything.selection(allow_all=False) is None
    assert everything.selection(allow_all=True) == ALL_GPUS
    nothing = GpuVisibility(VisibilityState.NO_GPUS)
    assert nothing.selection(allow_all=True) is None
    listed = GpuVisibility(VisibilityState.FROM_PROCESS, (IndexSelector(0),))
    assert listed.selection(allow_all=False) == (IndexSelector(0),)


# --------------------------------------------------------------------------------------------
# Finding vLLM among processes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", "meta-llama/Llama-3.1-8B"],
        ["/usr/local/bin/vllm", "serve"],
        ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "/models/x"],
        ["python3", "-u", "-X", "dev", "/opt/venv/bin/vllm", "serve"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "x"],
        ["python", "-O", "-m", "vllm.entrypoints.cli.main", "serve"],
        ["VLLM::EngineCore"],
        ["VLLM::Worker_TP1"],
    ],
)
def test_vllm_servers_are_recognised(argv: list[str]) -> None:
    """Every way vLLM's server and its retitled children appear in cmdline is recognised."""
    assert is_vllm_server(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["/usr/local/bin/vllm-headroom", "serve"],
        ["/usr/local/bin/python", "/usr/local/bin/vllm-headroom", "serve"],
        ["grep", "vllm", "serve"],
        ["/bin/sh", "-c", "vllm serve model"],
        ["vllm", "bench", "serve"],
        ["vllm"],
        ["python3", "-c", "import vllm", "vllm", "serve"],
        ["python3", "-m", "pytest", "vllm", "serve"],
        ["python3", "-m"],
        ["python3", "train.py", "--model", "vllm"],
    ],
)
def test_other_processes_are_not_vllm(argv: list[str]) -> None:
    """Our own sidecar, shells, grep, other vLLM subcommands and other programs do not match."""
    assert not is_vllm_server(argv)


def test_process_tree_finds_roots_and_every_descendant() -> None:
    """The top-most vLLM process is the root; engine, workers and helpers are its PIDs."""
    table = [
        ProcessEntry(1, 0, ("/pause",)),
        ProcessEntry(7, 1, ("vllm", "serve", "m")),
        ProcessEntry(45, 7, ("VLLM::EngineCore",)),
        ProcessEntry(80, 45, ("VLLM::Worker_TP0",)),
        ProcessEntry(96, 7, ("python3", "-c", "resource_tracker")),
        ProcessEntry(120, 1, ("vllm-headroom", "serve")),
    ]
    tree = vllm_process_tree(table)
    assert tree.roots == (7,)
    assert tree.pids == {7, 45, 80, 96}


def test_process_tree_survives_parent_loops_and_excludes_ourselves() -> None:
    """A PID cycle in a racy table does not hang, and the excluded PID is never a root."""
    table = [
        ProcessEntry(10, 11, ("VLLM::EngineCore",)),
        ProcessEntry(11, 10, ("VLLM::Worker_TP0",)),
        ProcessEntry(12, 1, ("vllm", "serve")),
    ]
    tree = vllm_process_tree(table, exclude=12)
    assert 12 not in tree.roots
    assert tree.pids <= {10, 11}


@given(
    st.lists(
        st.tuples(
            st.integers(1, 30),
            st.integers(0, 30),
            st.sampled_from([("vllm", "serve"), ("VLLM::EngineCore",), ("bash",)]),
        ),
        max_size=25,
        unique_by=lambda t: t[0],
    )
)
def test_process_tree_property_roots_are_matching_and_pids_are_their_descendants(
    rows: list[tuple[int, int, tuple[str, ...]]],
) -> None:
    """Roots always match and have no matching ancestor; every PID descends from a root."""
    table = [ProcessEntry(pid, ppid, argv) for pid, ppid, argv in rows]
    by_pid = {p.pid: p for p in table}
    tree = vllm_process_tree(table)
    assert set(tree.roots) <= tree.pids
    for root in tree.roots:
        assert is_vllm_server(by_pid[root].argv)
    for pid in tree.pids - set(tree.roots):
        assert by_pid[pid].ppid in tree.pids


# --------------------------------------------------------------------------------------------
# Reading a (fake) /proc
# --------------------------------------------------------------------------------------------


def test_scan_reads_cmdline_and_parent_and_skips_what_is_not_a_process() -> None:
    """Numeric entries with a cmdline become processes; kernel threads and other files do not."""
    table = {p.pid: p for p in scan_processes(PROC / "k8s-sidecar-tp2")}
    assert sorted(table) == [1, 7, 45, 80, 81, 96, 120, 200]
    assert table[7].argv[:3] == ("/usr/bin/python3", "/usr/local/bin/vllm", "serve")
    assert table[81].ppid == 45
    assert table[200].ppid == 1  # its comm holds ") (": the parent comes after the last ')'


def test_scan_of_a_missing_proc_root_is_empty(tmp_path: Path) -> None:
    """Without a /proc (not Linux, nothing mounted) the table is empty, not an error."""
    assert scan_processes(tmp_path / "nope") == ()


def test_scan_skips_processes_that_vanish_mid_scan(tmp_path: Path) -> None:
    """A process whose files disappear between listing and reading is skipped."""
    (tmp_path / "5").mkdir()  # listed, but cmdline and stat are gone
    make_process(tmp_path, 6, 1, ["vllm", "serve"], environ={})
    assert [p.pid for p in scan_processes(tmp_path)] == [6]


def test_environ_keeps_only_the_two_visibility_variables() -> None:
    """Reading vLLM's environment keeps the GPU variables and nothing else (no tokens)."""
    environ = read_visibility_environ(PROC / "k8s-sidecar-tp2", 7)
    assert environ == {NVIDIA_VISIBLE_DEVICES: f"{UUID_A},{UUID_B}"}
    assert "hf_secret" not in repr(discover_gpu_visibility(proc_root=PROC / "k8s-sidecar-tp2"))


def test_kubernetes_sidecar_finds_vllm_gpus_by_uuid_and_all_its_pids() -> None:
    """In a pod with a shared process namespace the vLLM container's UUIDs and PIDs are found."""
    visibility = discover_gpu_visibility(proc_root=PROC / "k8s-sidecar-tp2", self_pid=120)
    assert visibility.state is VisibilityState.FROM_PROCESS
    assert visibility.selectors == (UuidSelector(UUID_A), UuidSelector(UUID_B))
    assert visibility.vllm_pids == {7, 45, 80, 81, 96}
    assert "PID 7" in visibility.detail


def test_legacy_api_server_with_all_gpus_is_the_explicit_all_state() -> None:
    """NVIDIA_VISIBLE_DEVICES=all is not silently every GPU: it is the all_gpus state."""
    visibility = discover_gpu_visibility(proc_root=PROC / "legacy-api-server-all", self_pid=NOT_US)
    assert visibility.state is VisibilityState.ALL_GPUS
    assert visibility.selectors == ()
    assert visibility.vllm_pids == {1, 33}
    assert visibility.selection(allow_all=False) is None


def test_bare_metal_cuda_indices_are_nvml_indices() -> None:
    """Without a container runtime, CUDA_VISIBLE_DEVICES=2,3 means NVML GPUs 2 and 3."""
    visibility = discover_gpu_visibility(
        proc_root=PROC / "bare-metal-cuda-indices", self_pid=NOT_US
    )
    assert visibility.selectors == (IndexSelector(2), IndexSelector(3))
    assert visibility.vllm_pids == {3012, 3100, 3150, 3151}  # not the trainer (4000)


def test_no_vllm_process_says_how_to_fix_it() -> None:
    """Without a vLLM process the state says so and names shareProcessNamespace and the setting."""
    visibility = discover_gpu_visibility(proc_root=PROC / "no-vllm", self_pid=1)
    assert visibility.state is VisibilityState.VLLM_NOT_FOUND
    assert visibility.vllm_pids == frozenset()
    assert "shareProcessNamespace" in visibility.detail
    assert "gpus setting" in visibility.detail


def test_explicit_gpus_win_but_vllm_pids_are_still_found() -> None:
    """Settings decide the GPUs; the process scan still supplies vLLM's PIDs for the split."""
    visibility = discover_gpu_visibility(
        explicit=(IndexSelector(0),), proc_root=PROC / "k8s-sidecar-tp2", self_pid=120
    )
    assert visibility.state is VisibilityState.EXPLICIT
    assert visibility.selectors == (IndexSelector(0),)
    assert visibility.vllm_pids == {7, 45, 80, 81, 96}


def test_explicit_gpus_without_any_vllm_process() -> None:
    """Explicit GPUs work without a process namespace; vLLM's PIDs are then empty."""
    visibility = discover_gpu_visibility(
        explicit=(UuidSelector(UUID_A),), proc_root=PROC / "no-vllm", self_pid=1
    )
    assert visibility.state is VisibilityState.EXPLICIT
    assert visibility.vllm_pids == frozenset()
    assert "no vLLM process" in visibility.detail


def test_an_unreadable_environ_is_its_own_state(tmp_path: Path) -> None:
    """When vLLM's environ is refused (another UID), the state says so and what to do."""

    def refuse_environ(path: Path) -> bytes:
        if path.name == "environ":
            raise PermissionError(13, "Permission denied")
        return path.read_bytes()

    visibility = discover_gpu_visibility(
        proc_root=PROC / "k8s-sidecar-tp2", self_pid=120, read_bytes=refuse_environ
    )
    assert visibility.state is VisibilityState.ENVIRON_UNREADABLE
    assert visibility.vllm_pids == {7, 45, 80, 81, 96}
    assert "Permission denied" in visibility.detail
    assert "vLLM's user" in visibility.detail


def test_our_own_process_is_never_taken_for_vllm(tmp_path: Path) -> None:
    """The scanning process is excluded even if its cmdline would match."""
    make_process(tmp_path, 50, 1, ["vllm", "serve"], environ={NVIDIA_VISIBLE_DEVICES: "0"})
    visibility = discover_gpu_visibility(proc_root=tmp_path, self_pid=50)
    assert visibility.state is VisibilityState.VLLM_NOT_FOUND


def test_default_self_pid_is_this_process(tmp_path: Path) -> None:
    """Without self_pid the current process is excluded."""
    make_process(tmp_path, os.getpid(), 1, ["vllm", "serve"], environ={})
    assert discover_gpu_visibility(proc_root=tmp_path).state is VisibilityState.VLLM_NOT_FOUND


def test_two_vllm_servers_seeing_different_gpus_are_ambiguous(tmp_path: Path) -> None:
    """Two vLLM servers with different GPUs in one namespace: the state is ambiguous."""
    make_process(tmp_path, 10, 1, ["vllm", "serve", "a"], environ={NVIDIA_VISIBLE_DEVICES: "0"})
    make_process(tmp_path, 20, 1, ["vllm", "serve", "b"], environ={NVIDIA_VISIBLE_DEVICES: "1"})
    visibility = discover_gpu_visibility(proc_root=tmp_path, self_pid=NOT_US)
    assert visibility.state is VisibilityState.AMBIGUOUS
    assert visibility.vllm_pids == {10, 20}
    assert "10,20" in visibility.detail


def test_two_vllm_servers_seeing_the_same_gpus_agree(tmp_path: Path) -> None:
    """Two vLLM servers with identical visibility (data parallel on shared GPUs) are fine."""
    for pid in (10, 20):
        make_process(tmp_path, pid, 1, ["vllm", "serve"], environ={NVIDIA_VISIBLE_DEVICES: UUID_A})
    visibility = discover_gpu_visibility(proc_root=tmp_path, self_pid=NOT_US)
    assert visibility.state is VisibilityState.FROM_PROCESS
    assert visibility.selectors == (UuidSelector(UUID_A),)
    assert visibility.vllm_pids == {10, 20}


def test_visibility_and_recorded_nvml_together_give_vllm_and_foreign_memory() -> None:
    """The pod's UUIDs select both recorded GPUs and its PIDs attribute each worker's memory."""
    visibility = discover_gpu_visibility(proc_root=PROC / "k8s-sidecar-tp2", self_pid=120)
    selection = visibility.selection(allow_all=False)
    assert selection is not None
    reader = RecordedGpuReader.from_file(FIXTURES / "nvml" / "tp2-vllm.json")
    splits = split_snapshot(reader.read(selection), visibility.vllm_pids)
    assert [s.uuid for s in splits] == [UUID_A, UUID_B]
    for split in splits:
        assert split.unknown_reason is None
        assert split.vllm_bytes is not None
        assert split.foreign_bytes is not None
        assert split.vllm_bytes + split.foreign_bytes == split.allocated_bytes
        assert split.foreign_process_count == 0


def make_process(
    root: Path, pid: int, ppid: int, argv: list[str], *, environ: dict[str, str]
) -> None:
    """Write one process into a fake /proc under ``root``."""
    directory = root / str(pid)
    directory.mkdir(parents=True)
    (directory / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    (directory / "stat").write_bytes(f"{pid} (x) S {ppid} 0 0 0\n".encode())
    (directory / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))


# --------------------------------------------------------------------------------------------
# Nothing but the named facts: vLLM's secrets never reach what the sidecar keeps or logs
# --------------------------------------------------------------------------------------------

#: What vLLM's process may hold that the sidecar must never keep, log or show.
SECRETS = ("hf_SECRET_FROM_ENVIRON", "sk-SECRET-FROM-ENVIRON", "sk-SECRET-ON-THE-COMMAND-LINE")


def vllm_with_secrets(root: Path, *, visible: str = UUID_A) -> Path:
    """A fake /proc whose vLLM has HF_TOKEN and VLLM_API_KEY in its environment, a key in argv."""
    make_process(
        root,
        40,
        1,
        ["vllm", "serve", "m", "--api-key", SECRETS[2], "--max-num-seqs", "8"],
        environ={
            "HF_TOKEN": SECRETS[0],
            "VLLM_API_KEY": SECRETS[1],
            NVIDIA_VISIBLE_DEVICES: visible,
        },
    )
    return root


@pytest.mark.parametrize("visible", [UUID_A, "all", "not-a-gpu", ""])
def test_vllms_secrets_never_reach_what_the_sidecar_keeps(tmp_path: Path, visible: str) -> None:
    """Whatever vLLM's GPU list says, the visibility and the flags kept name no secret of it."""
    proc = vllm_with_secrets(tmp_path, visible=visible)
    visibility = discover_gpu_visibility(proc_root=proc, self_pid=1)
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert flags.max_num_seqs == 8
    kept = f"{visibility!r} {visibility.detail} {flags!r}"
    assert not [secret for secret in SECRETS if secret in kept]


def test_a_crash_while_reading_vllms_environment_logs_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A traceback from the frame holding vLLM's raw environ shows no local: no HF_TOKEN in logs."""
    proc = vllm_with_secrets(tmp_path)

    def crash(raw: bytes) -> str:
        raise ValueError("undecodable")

    monkeypatch.setattr(visibility_module, "_decode", crash)
    for fmt in ("json", "console"):
        configure_logging(fmt=fmt)
        try:
            log = structlog.get_logger()
            try:
                read_visibility_environ(proc, 40)
            except ValueError:
                log.exception("gpu_discovery_crashed")
        finally:
            structlog.reset_defaults()
        logged = capsys.readouterr().err
        assert "gpu_discovery_crashed" in logged
        assert "read_visibility_environ" in logged, "the traceback itself is kept"
        assert not [secret for secret in SECRETS if secret in logged], fmt


# --- CDI-era discovery (recorded layouts: tests/fixtures/proc/README.md) ------------------------


@pytest.mark.parametrize("layout", ["k8s-cdi-void", "k8s-cdi-unset"])
def test_gpus_injected_through_cdi_are_named_and_the_fix_is_dcgm(layout: str) -> None:
    """No GPU in vLLM's environment, /dev/nvidia2 and 5 open: cdi_devices, never all GPUs."""
    visibility = discover_gpu_visibility(proc_root=PROC / layout, self_pid=120)
    assert visibility.state is VisibilityState.CDI_DEVICES
    assert visibility.selection(allow_all=False) is None
    assert visibility.vllm_pids == {7, 45, 80, 81}
    assert "/dev/nvidia2,/dev/nvidia5" in visibility.detail
    assert "gpu_source=dcgm" in visibility.detail
    assert "\n" not in visibility.detail


def test_a_cdi_mig_instance_is_named_with_its_capabilities() -> None:
    """CDI with MIG: the parent GPU's node and the MIG capability devices are open."""
    visibility = discover_gpu_visibility(proc_root=PROC / "k8s-cdi-mig", self_pid=120)
    assert visibility.state is VisibilityState.CDI_DEVICES
    assert "/dev/nvidia0 and MIG capabilities" in visibility.detail


def test_the_legacy_runtime_names_its_gpus_whatever_is_open() -> None:
    """The same pod under the legacy runtime: the environment's UUIDs win, no CDI state."""
    visibility = discover_gpu_visibility(proc_root=PROC / "k8s-legacy-runtime-fds", self_pid=120)
    assert visibility.state is VisibilityState.FROM_PROCESS
    assert visibility.selectors == (UuidSelector(UUID_A), UuidSelector(UUID_B))


def test_no_gpu_and_no_device_open_is_still_no_gpus(tmp_path: Path) -> None:
    """void without any /dev/nvidia<N> seen open: no GPUs, and the line names the other sources.

    A CPU build of vLLM, or CDI where the sidecar runs as another user and cannot read vLLM's
    file descriptors (the chart's case): the line says how to name the GPUs instead.
    """
    layout = tmp_path / "proc"
    for pid in ("7", "45"):
        source = PROC / "k8s-cdi-void" / pid
        (layout / pid).mkdir(parents=True)
        for name in ("cmdline", "stat", "environ"):
            (layout / pid / name).write_bytes((source / name).read_bytes())
    visibility = discover_gpu_visibility(proc_root=layout, self_pid=NOT_US)
    assert visibility.state is VisibilityState.NO_GPUS
    assert "gpu_source=dcgm" in visibility.detail
    assert "gpus setting" in visibility.detail


def test_cdi_devices_are_read_when_discovery_is_told_to_read_all() -> None:
    """gpu_discovery=all (the sidecar sees exactly vLLM's GPUs) still reads them."""
    visibility = discover_gpu_visibility(proc_root=PROC / "k8s-cdi-void", self_pid=120)
    assert visibility.selection(allow_all=True) is ALL_GPUS


def test_open_devices_skip_what_cannot_be_read(tmp_path: Path) -> None:
    """A process gone, an fd gone, a link refused: skipped, the rest still read."""

    def read_link(path: Path) -> str:
        if path.name == "6":
            raise PermissionError(path)
        return os.readlink(path)

    devices = visibility_module.open_gpu_devices(
        PROC / "k8s-cdi-void", [45, 80, 4242], read_link=read_link
    )
    assert devices.minors == {2}
    assert not devices.mig
