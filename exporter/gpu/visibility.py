"""Which GPUs are vLLM's: from settings, or from the vLLM process's own environment.

In Kubernetes the NVIDIA device plugin gives GPUs only to the container that requests them, and
sets ``NVIDIA_VISIBLE_DEVICES`` in that container (GPU UUIDs by default). A sidecar sees those
GPUs only if it is told which they are. Two honest ways, in order of preference:

1. Explicit GPU UUIDs or indices in settings (:func:`parse_gpu_selectors`).
2. The vLLM server's environment, read through a shared process namespace
   (``shareProcessNamespace: true``): find the process in ``/proc/<pid>/cmdline``, read
   ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` from ``/proc/<pid>/environ``
   (:func:`discover_gpu_visibility`). Reading another container's ``environ`` needs the same UID
   as vLLM (or ``CAP_SYS_PTRACE``); when it is refused, the result says so.

Never "every GPU of the node" by accident: ``all``, or no variable at all, is the explicit state
:attr:`VisibilityState.ALL_GPUS`, and the caller decides (a settings switch) whether to read all.

Where GPUs reach vLLM through CDI (Container Device Interface: the GPU Operator's CDI mode, or
the device plugin's ``cdi-annotations``/``cdi-cri`` strategies), vLLM's environment names none:
``NVIDIA_VISIBLE_DEVICES`` is unset, or ``void`` as nvidia-ctk's CDI specs set it. Its processes
then hold ``/dev/nvidia<N>`` open (``/proc/<pid>/fd``), which says GPUs are there but not which
GPUs NVML would call them from the sidecar: :attr:`VisibilityState.CDI_DEVICES`, whose line
names the device nodes and the fix (``gpu_source=dcgm``, or the ``gpus`` setting).

Both ways also return vLLM's PIDs (the server and every descendant: engine cores, TP workers),
which :func:`exporter.gpu.split_gpu_memory` needs to tell vLLM's memory from foreign memory.
Only the two variables are kept from the environment; nothing else of it is stored or logged.

Pure core: :func:`parse_visible_devices`, :func:`resolve_visible_devices`,
:func:`is_vllm_server`, :func:`vllm_process_tree`. Shell: :func:`scan_processes`,
:func:`read_visibility_environ`, :func:`discover_gpu_visibility` (proc root injectable, as
prometheus_client's ``ProcessCollector`` does for its fake ``/proc`` in tests).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Final

from exporter.core.reasons import VisibilityState
from exporter.errors import UsageError
from exporter.gpu.model import (
    ALL_GPUS,
    GpuSelection,
    GpuSelector,
    IndexSelector,
    MigIndexSelector,
    UuidSelector,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

#: The container runtime's variable (nvidia-container-toolkit, set by the device plugin).
NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
#: CUDA's own variable, applied inside whatever the container exposes.
CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
VISIBILITY_VARIABLES: Final = (NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES)

#: vLLM retitles its child processes ``VLLM::EngineCore``, ``VLLM::Worker_TP0``... (setproctitle,
#: prefix ``VLLM_PROCESS_NAME_PREFIX``, default ``VLLM``).
VLLM_TITLE_PREFIX: Final = "VLLM::"

_GPU_UUID = re.compile(r"GPU-[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*")
_MIG_UUID = re.compile(r"MIG-[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*")
# Before driver R470 MIG devices were named MIG-<GPU UUID>/<GI>/<CI>.
_LEGACY_MIG = re.compile(r"MIG-GPU-[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*/\d+/\d+")
_INDEX = re.compile(r"\d+")
_MIG_INDEX = re.compile(r"(\d+):(\d+)")


class GpuSelectorError(UsageError):
    """A GPU list in settings is malformed; the message names the entry and the fix."""


@dataclass(frozen=True, slots=True)
class GpuVisibility:
    """Which GPUs to watch, how that was decided, and vLLM's PIDs.

    ``selectors`` is non-empty exactly in states ``explicit`` and ``from_process``. ``detail`` is
    one line for the log: what was found and, when nothing can be watched, what to set.
    ``vllm_pids`` is empty when no vLLM process was found (then foreign memory is unknown).
    """

    state: VisibilityState
    selectors: tuple[GpuSelector, ...] = ()
    vllm_pids: frozenset[int] = field(default_factory=frozenset)
    detail: str = ""

    def selection(self, *, allow_all: bool) -> GpuSelection | None:
        """What to read: the selectors, all GPUs (only if ``allow_all``), or ``None`` (nothing)."""
        if self.selectors:
            return self.selectors
        if self.state in (VisibilityState.ALL_GPUS, VisibilityState.CDI_DEVICES) and allow_all:
            return ALL_GPUS
        return None


# --------------------------------------------------------------------------------------------
# Parsing GPU lists (pure)
# --------------------------------------------------------------------------------------------


def parse_selector(token: str) -> GpuSelector | None:
    """One GPU as the container runtime writes it, or ``None`` if ``token`` is not one.

    ``GPU-<uuid>``, ``MIG-<uuid>`` (and the pre-R470 ``MIG-GPU-<uuid>/<gi>/<ci>``), an index
    ``0``, or a MIG index ``0:1``. UUID prefixes (which CUDA accepts) are kept as written.
    """
    token = token.strip()
    if _GPU_UUID.fullmatch(token) or _MIG_UUID.fullmatch(token) or _LEGACY_MIG.fullmatch(token):
        return UuidSelector(token)
    if _INDEX.fullmatch(token):
        return IndexSelector(int(token))
    mig = _MIG_INDEX.fullmatch(token)
    if mig:
        return MigIndexSelector(int(mig.group(1)), int(mig.group(2)))
    return None


def parse_gpu_selectors(entries: Sequence[str]) -> tuple[GpuSelector, ...]:
    """The GPUs listed in settings (entries already split on commas), without duplicates.

    Raises :class:`GpuSelectorError` naming the first bad entry; ``all`` is refused here because
    reading every GPU is a separate, deliberate switch.
    """
    selectors: list[GpuSelector] = []
    for raw in entries:
        entry = raw.strip()
        if entry.lower() == "all":
            msg = (
                "'all' is not a GPU list; to read every GPU NVML sees, set "
                "gpu_discovery=all instead"
            )
            raise GpuSelectorError(msg)
        selector = parse_selector(entry)
        if selector is None:
            msg = (
                f"{entry!r} is not a GPU: use GPU UUIDs (GPU-…, MIG-…, as "
                "nvidia-smi -L prints them) or NVML indices such as 0,1"
            )
            raise GpuSelectorError(msg)
        if selector not in selectors:
            selectors.append(selector)
    if not selectors:
        msg = "gpus is empty: list GPU UUIDs or indices, or leave it unset"
        raise GpuSelectorError(msg)
    return tuple(selectors)


class DeviceListKind(StrEnum):
    """What one visibility variable says."""

    UNSET = "unset"
    ALL = "all"
    NONE = "none"
    LIST = "list"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class DeviceList:
    """The parsed value of one visibility variable."""

    kind: DeviceListKind
    selectors: tuple[GpuSelector, ...] = ()
    raw: str = ""


def parse_visible_devices(variable: str, value: str | None) -> DeviceList:
    """Parse ``NVIDIA_VISIBLE_DEVICES`` or ``CUDA_VISIBLE_DEVICES`` as the runtime or CUDA would.

    ``NVIDIA_VISIBLE_DEVICES``: ``all``; ``none``/``void``/empty (no GPU); a comma list of
    UUIDs, indices and MIG indices; anything else is invalid. ``CUDA_VISIBLE_DEVICES``: CUDA
    reads entries up to the first invalid one (``-1`` included) and ignores the rest, so this
    does too; empty (or invalid from the start) means no GPU.
    """
    if value is None:
        return DeviceList(DeviceListKind.UNSET)
    if variable == CUDA_VISIBLE_DEVICES:
        return _parse_cuda_list(value)
    return _parse_runtime_list(value)


def _parse_cuda_list(value: str) -> DeviceList:
    selectors: list[GpuSelector] = []
    for token in value.split(","):
        selector = parse_selector(token)
        if selector is None or isinstance(selector, MigIndexSelector):
            break
        selectors.append(selector)
    if not selectors:
        return DeviceList(DeviceListKind.NONE, raw=value)
    return DeviceList(DeviceListKind.LIST, tuple(dict.fromkeys(selectors)), raw=value)


def _parse_runtime_list(value: str) -> DeviceList:
    text = value.strip().lower()
    if text == "all":
        return DeviceList(DeviceListKind.ALL, raw=value)
    if text in ("", "none", "void"):
        return DeviceList(DeviceListKind.NONE, raw=value)
    parsed = [parse_selector(token) for token in value.split(",")]
    clean = [selector for selector in parsed if selector is not None]
    if len(clean) != len(parsed):
        return DeviceList(DeviceListKind.INVALID, raw=value)
    return DeviceList(DeviceListKind.LIST, tuple(dict.fromkeys(clean)), raw=value)


# What a resolution decides: state, the detail line, the GPUs.
_Decision = tuple[VisibilityState, str, tuple[GpuSelector, ...]]


def resolve_visible_devices(
    environ: Mapping[str, str], *, vllm_pids: frozenset[int] = frozenset(), where: str = "vLLM"
) -> GpuVisibility:
    """Which GPUs a process with ``environ`` (only the two variables matter) uses.

    ``CUDA_VISIBLE_DEVICES`` applies inside what ``NVIDIA_VISIBLE_DEVICES`` exposes. Its UUIDs
    are unambiguous. Its indices count the container's GPUs in PCI order (vLLM itself assumes
    they are NVML indices): they are node indices when the container sees every GPU, positions
    among ``NVIDIA_VISIBLE_DEVICES`` indices when that lists indices, and among its UUIDs only
    when all of them are selected (their PCI order is not known from here).
    """
    nvidia = parse_visible_devices(NVIDIA_VISIBLE_DEVICES, environ.get(NVIDIA_VISIBLE_DEVICES))
    cuda = parse_visible_devices(CUDA_VISIBLE_DEVICES, environ.get(CUDA_VISIBLE_DEVICES))
    decision: _Decision
    if nvidia.kind is DeviceListKind.INVALID:
        decision = (
            VisibilityState.INVALID,
            f"{NVIDIA_VISIBLE_DEVICES}={nvidia.raw!r} is not a GPU list; set the gpus setting",
            (),
        )
    elif nvidia.kind is DeviceListKind.NONE:
        decision = (
            VisibilityState.NO_GPUS,
            f"{NVIDIA_VISIBLE_DEVICES}={nvidia.raw!r}: no GPU through the NVIDIA runtime; if "
            f"GPUs reach vLLM another way (CDI), set gpu_source=dcgm (dcgm-exporter's pod "
            "mapping) or the gpus setting to their UUIDs",
            (),
        )
    elif cuda.kind is DeviceListKind.NONE:
        decision = (
            VisibilityState.NO_GPUS,
            f"{CUDA_VISIBLE_DEVICES}={cuda.raw!r}",
            (),
        )
    elif cuda.kind is DeviceListKind.UNSET:
        decision = _runtime_only(nvidia)
    else:
        decision = _with_cuda(nvidia, cuda)
    state, detail, selectors = decision
    return GpuVisibility(state, selectors, vllm_pids, f"{where}: {detail}")


def _runtime_only(nvidia: DeviceList) -> _Decision:
    if nvidia.kind is DeviceListKind.LIST:
        return (
            VisibilityState.FROM_PROCESS,
            f"{NVIDIA_VISIBLE_DEVICES}={nvidia.raw}",
            nvidia.selectors,
        )
    said = (
        f"{NVIDIA_VISIBLE_DEVICES}=all"
        if nvidia.kind is DeviceListKind.ALL
        else f"neither {NVIDIA_VISIBLE_DEVICES} nor {CUDA_VISIBLE_DEVICES} is set"
    )
    return (
        VisibilityState.ALL_GPUS,
        f"{said}: vLLM sees every GPU of its container; set the gpus setting to its GPU UUIDs, "
        f"or gpu_discovery=all if this container sees exactly vLLM's GPUs",
        (),
    )


def _with_cuda(nvidia: DeviceList, cuda: DeviceList) -> _Decision:
    resolved = _apply_cuda(nvidia, cuda)
    if resolved is None:
        return (
            VisibilityState.AMBIGUOUS,
            f"{CUDA_VISIBLE_DEVICES}={cuda.raw} picks GPUs by position among "
            f"{NVIDIA_VISIBLE_DEVICES}={nvidia.raw}, whose PCI order is unknown here; "
            f"set the gpus setting to vLLM's GPU UUIDs",
            (),
        )
    said = f"{CUDA_VISIBLE_DEVICES}={cuda.raw}"
    if nvidia.kind is DeviceListKind.LIST:
        said += f" within {NVIDIA_VISIBLE_DEVICES}={nvidia.raw}"
    return VisibilityState.FROM_PROCESS, said, resolved


def _apply_cuda(nvidia: DeviceList, cuda: DeviceList) -> tuple[GpuSelector, ...] | None:
    """CUDA's selection as GPUs the sidecar can look up, or ``None`` where it is ambiguous."""
    if nvidia.kind is not DeviceListKind.LIST:
        # The container sees every GPU, so a CUDA index is an NVML index (vLLM assumes the same).
        return cuda.selectors
    exposed = nvidia.selectors
    indices = [s.index for s in cuda.selectors if isinstance(s, IndexSelector)]
    if not indices:
        return cuda.selectors
    if all(isinstance(s, IndexSelector) for s in exposed):
        # Host NVML indices are in PCI order, as the container's are: sorting maps one to the other.
        in_pci_order = sorted(exposed, key=_index_key)
        picked: list[GpuSelector] = []
        for selector in cuda.selectors:
            if not isinstance(selector, IndexSelector):
                picked.append(selector)
            elif selector.index < len(in_pci_order):
                picked.append(in_pci_order[selector.index])
            else:
                return None
        return tuple(dict.fromkeys(picked))
    # UUIDs: their PCI order is unknown here, so only "every exposed GPU" can be resolved.
    if len(indices) == len(cuda.selectors) and sorted(indices) == list(range(len(exposed))):
        return exposed
    return None


def _index_key(selector: GpuSelector) -> int:
    return selector.index if isinstance(selector, IndexSelector) else -1


# --------------------------------------------------------------------------------------------
# Finding vLLM among processes (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProcessEntry:
    """One process of the table: PID, parent PID and argv (``/proc/<pid>/cmdline``)."""

    pid: int
    ppid: int
    argv: tuple[str, ...]


def is_vllm_server(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is a vLLM server or one of its retitled children.

    Matches the console script ``vllm serve …`` (also as ``python [options] /…/vllm serve …``),
    ``python [options] -m vllm.entrypoints.…`` (the API server of older images), and the titles
    ``VLLM::…`` vLLM gives its engine and worker processes. Not ``vllm-headroom``, not a shell
    or ``grep`` whose arguments mention vLLM.
    """
    if not argv:
        return False
    if argv[0].startswith(VLLM_TITLE_PREFIX):
        return True
    program = os.path.basename(argv[0])
    if program == "vllm":
        return list(argv[1:2]) == ["serve"]
    return program.startswith("python") and _python_runs_vllm(list(argv[1:]))


# Interpreter options that take the next argument as their value.
_PYTHON_OPTIONS_WITH_VALUE: Final = frozenset({"-X", "-W"})


def _python_runs_vllm(args: list[str]) -> bool:
    # Skip the interpreter's options up to the script or module it runs.
    position = 0
    while position < len(args) and args[position].startswith("-") and args[position] != "-m":
        if args[position] == "-c":
            return False
        position += 2 if args[position] in _PYTHON_OPTIONS_WITH_VALUE else 1
    rest = args[position:]
    if rest[:1] == ["-m"]:
        return len(rest) > 1 and rest[1].startswith("vllm.entrypoints")
    return len(rest) > 1 and os.path.basename(rest[0]) == "vllm" and rest[1] == "serve"


@dataclass(frozen=True, slots=True)
class VllmProcesses:
    """The vLLM servers found (top-most matching processes) and every PID of their trees."""

    roots: tuple[int, ...]
    pids: frozenset[int]


def vllm_process_tree(
    processes: Iterable[ProcessEntry], *, exclude: int | None = None
) -> VllmProcesses:
    """Find vLLM servers and all their descendants (PIDs that may hold GPU memory).

    A root is a matching process whose ancestors do not match (``vllm serve`` rather than its
    ``VLLM::EngineCore`` child). ``exclude`` (our own PID) is never a root.
    """
    table = {p.pid: p for p in processes}
    children: dict[int, list[int]] = {}
    for process in table.values():
        children.setdefault(process.ppid, []).append(process.pid)
    matching = {pid for pid, p in table.items() if pid != exclude and is_vllm_server(p.argv)}

    def has_matching_ancestor(pid: int) -> bool:
        seen: set[int] = set()
        parent = table[pid].ppid
        while parent in table and parent not in seen:
            if parent in matching:
                return True
            seen.add(parent)
            parent = table[parent].ppid
        return False

    roots = sorted(pid for pid in matching if not has_matching_ancestor(pid))
    pids: set[int] = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in pids:
            continue
        pids.add(pid)
        stack.extend(children.get(pid, ()))
    return VllmProcesses(tuple(roots), frozenset(pids))


# --------------------------------------------------------------------------------------------
# Reading /proc (the shell)
# --------------------------------------------------------------------------------------------


def _read_bytes(path: Path) -> bytes:
    return path.read_bytes()


def scan_processes(
    proc_root: Path, *, read_bytes: Callable[[Path], bytes] = _read_bytes
) -> tuple[ProcessEntry, ...]:
    """Every process of ``proc_root`` whose ``cmdline`` and ``stat`` can be read.

    Processes that exit during the scan, kernel threads (empty ``cmdline``) and entries hidden
    from us are skipped; a missing ``proc_root`` gives an empty table.
    """
    try:
        names = sorted(entry.name for entry in proc_root.iterdir() if entry.name.isdigit())
    except OSError:
        return ()
    found: list[ProcessEntry] = []
    for name in names:
        directory = proc_root / name
        try:
            cmdline = read_bytes(directory / "cmdline")
            stat = read_bytes(directory / "stat")
        except OSError:
            continue
        argv = tuple(_decode(part) for part in cmdline.split(b"\0") if part)
        ppid = _parent_pid(stat)
        if argv and ppid is not None:
            found.append(ProcessEntry(int(name), ppid, argv))
    return tuple(found)


def read_visibility_environ(
    proc_root: Path, pid: int, *, read_bytes: Callable[[Path], bytes] = _read_bytes
) -> dict[str, str]:
    """The visibility variables of process ``pid`` (only those two). Raises ``OSError``."""
    raw = read_bytes(proc_root / str(pid) / "environ")
    wanted = {name.encode(): name for name in VISIBILITY_VARIABLES}
    found: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in wanted:
            found[wanted[key]] = _decode(value)
    return found


#: ``/dev/nvidia<N>``: one GPU (N is its minor number, NVML's ``nvmlDeviceGetMinorNumber``).
_GPU_NODE = re.compile(r"/dev/nvidia(\d+)")
#: ``/dev/nvidia-caps/nvidia-cap<N>``: a MIG instance's access capability.
_MIG_CAP = re.compile(r"/dev/nvidia-caps/nvidia-cap\d+")
#: Open files looked at per process at most: a vLLM worker holds a few hundred.
MAX_FDS_PER_PROCESS: Final = 4096


@dataclass(frozen=True, slots=True)
class GpuDeviceNodes:
    """The GPU device nodes a set of processes holds open."""

    minors: frozenset[int] = frozenset()
    mig: bool = False

    def __str__(self) -> str:
        nodes = ",".join(f"/dev/nvidia{minor}" for minor in sorted(self.minors))
        return nodes + (" and MIG capabilities" if self.mig else "")


def _read_link(path: Path) -> str:
    return os.readlink(path)


def open_gpu_devices(
    proc_root: Path,
    pids: Iterable[int],
    *,
    read_link: Callable[[Path], str] = _read_link,
) -> GpuDeviceNodes:
    """The ``/dev/nvidia<N>`` (and MIG capability) nodes open in ``pids``, from ``<pid>/fd``.

    Processes or descriptors that vanish, or that we may not look at, are skipped: the answer
    is what could be seen (empty when nothing could).
    """
    minors: set[int] = set()
    mig = False
    for pid in sorted(pids):
        directory = proc_root / str(pid) / "fd"
        try:
            names = sorted(os.listdir(directory))[:MAX_FDS_PER_PROCESS]
        except OSError:
            continue
        for name in names:
            try:
                target = read_link(directory / name)
            except OSError:
                continue
            node = _GPU_NODE.fullmatch(target)
            if node:
                minors.add(int(node.group(1)))
            elif _MIG_CAP.fullmatch(target):
                mig = True
    return GpuDeviceNodes(frozenset(minors), mig)


def _cdi_injected(
    environ: Mapping[str, str],
    result: GpuVisibility,
    proc_root: Path,
    pids: frozenset[int],
    read_link: Callable[[Path], str],
) -> GpuVisibility | None:
    """``result`` recast as CDI_DEVICES where the environment names no GPU but vLLM holds some."""
    if result.state not in (VisibilityState.ALL_GPUS, VisibilityState.NO_GPUS):
        return None
    runtime = parse_visible_devices(NVIDIA_VISIBLE_DEVICES, environ.get(NVIDIA_VISIBLE_DEVICES))
    cuda = parse_visible_devices(CUDA_VISIBLE_DEVICES, environ.get(CUDA_VISIBLE_DEVICES))
    if runtime.kind not in (DeviceListKind.UNSET, DeviceListKind.NONE):
        return None
    if cuda.kind is DeviceListKind.NONE:
        return None  # vLLM was told to use no GPU: whatever it holds open is not for CUDA
    devices = open_gpu_devices(proc_root, pids, read_link=read_link)
    if not devices.minors:
        return None
    said = (
        f"{NVIDIA_VISIBLE_DEVICES}={runtime.raw!r}"
        if runtime.kind is DeviceListKind.NONE
        else f"no {NVIDIA_VISIBLE_DEVICES}"
    )
    return GpuVisibility(
        VisibilityState.CDI_DEVICES,
        vllm_pids=pids,
        detail=(
            f"vLLM holds {devices} open with {said}: its GPUs were injected through CDI (or it "
            "sees the host's devices), and NVML in the sidecar cannot tell which GPUs these "
            "are; set gpu_source=dcgm (dcgm-exporter's pod mapping), or the gpus setting to "
            "vLLM's GPU UUIDs, or gpu_discovery=all where the sidecar sees exactly vLLM's GPUs"
        ),
    )


def discover_gpu_visibility(
    *,
    explicit: Sequence[GpuSelector] = (),
    proc_root: Path = Path("/proc"),
    self_pid: int | None = None,
    read_bytes: Callable[[Path], bytes] = _read_bytes,
    read_link: Callable[[Path], str] = _read_link,
) -> GpuVisibility:
    """Decide which GPUs to watch, and find vLLM's PIDs either way. Never raises.

    ``explicit`` (from :func:`parse_gpu_selectors`) wins when given; the process table is still
    scanned for the PIDs. ``self_pid`` defaults to this process, which is never taken for vLLM.
    """
    own = os.getpid() if self_pid is None else self_pid
    vllm = vllm_process_tree(scan_processes(proc_root, read_bytes=read_bytes), exclude=own)
    if explicit:
        found = f"vLLM PIDs {_pid_list(vllm.roots)}" if vllm.roots else "no vLLM process found"
        return GpuVisibility(
            VisibilityState.EXPLICIT, tuple(explicit), vllm.pids, f"gpus setting; {found}"
        )
    if not vllm.roots:
        return GpuVisibility(
            VisibilityState.VLLM_NOT_FOUND,
            detail=(
                f"no vLLM server process in {proc_root}: share the pod's process namespace "
                f"(shareProcessNamespace: true) or set the gpus setting to vLLM's GPU UUIDs"
            ),
        )
    results: list[GpuVisibility] = []
    for root in vllm.roots:
        try:
            environ = read_visibility_environ(proc_root, root, read_bytes=read_bytes)
        except OSError as exc:
            return GpuVisibility(
                VisibilityState.ENVIRON_UNREADABLE,
                vllm_pids=vllm.pids,
                detail=(
                    f"cannot read {proc_root / str(root) / 'environ'} ({exc.strerror or exc}): "
                    f"run the sidecar as vLLM's user, or set the gpus setting to vLLM's GPU UUIDs"
                ),
            )
        resolved = resolve_visible_devices(environ, vllm_pids=vllm.pids, where=f"vLLM PID {root}")
        cdi = _cdi_injected(environ, resolved, proc_root, vllm.pids, read_link)
        results.append(cdi or resolved)
    distinct = {(r.state, r.selectors) for r in results}
    if len(distinct) > 1:
        return GpuVisibility(
            VisibilityState.AMBIGUOUS,
            vllm_pids=vllm.pids,
            detail=(
                f"vLLM servers {_pid_list(vllm.roots)} see different GPUs; set the gpus setting"
            ),
        )
    return results[0]


def _parent_pid(stat: bytes) -> int | None:
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so cut at the last ')'.
    _, sep, rest = stat.rpartition(b")")
    fields = rest.split()
    if not sep or len(fields) < 2 or not fields[1].isdigit():
        return None
    return int(fields[1])


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _pid_list(pids: Iterable[int]) -> str:
    return ",".join(str(pid) for pid in pids)
