"""Specification of finding the target's vLLM command line in /proc (exporter.service.launch)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from exporter.service.launch import (
    MAX_CONFIG_BYTES,
    ProcessLaunchSource,
    choose_launch,
    target_port,
)
from exporter.vllm.launch import parse_launch_flags

if TYPE_CHECKING:
    from pathlib import Path


def fake_proc(root: Path, processes: dict[int, tuple[int, list[str]]]) -> Path:
    """A /proc of ``pid: (ppid, argv)`` entries, with the files scan_processes reads."""
    for pid, (ppid, argv) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        (directory / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (directory / "stat").write_text(f"{pid} (x) S {ppid} 0 0")
    return root


def test_the_target_port_comes_from_its_url() -> None:
    """Explicit ports, and the scheme's default otherwise."""
    assert target_port("http://127.0.0.1:8000") == 8000
    assert target_port("http://vllm") == 80
    assert target_port("https://vllm") == 443
    assert target_port("http://[::1") is None


def test_several_servers_are_told_apart_by_port() -> None:
    """Two vLLMs in one pod: the one listening on the target's port."""
    a = parse_launch_flags(["vllm", "serve", "a", "--port", "8001", "--max-num-seqs", "4"])
    b = parse_launch_flags(["vllm", "serve", "b", "--max-num-seqs", "9"])  # port 8000
    assert choose_launch([a, b], 8000) is b
    assert choose_launch([a, b], 8001) is a
    assert choose_launch([a, b], 9999) is None, "neither matches: cannot tell"


def test_one_server_is_the_one_whatever_the_port() -> None:
    """A Service may map port 80 to vLLM's 8000: with one vLLM in the pod it is the target."""
    only = parse_launch_flags(["vllm", "serve", "a", "--max-num-seqs", "4"])
    assert choose_launch([only], 80) is only
    assert choose_launch([], 8000) is None


def test_the_process_table_gives_the_server_flags_not_its_workers(tmp_path: Path) -> None:
    """vLLM's API server and its EngineCore child: the top-most server's command line."""
    proc = fake_proc(
        tmp_path,
        {
            10: (1, ["python3", "-m", "vllm.entrypoints.openai.api_server", "--max-num-seqs", "2"]),
            11: (10, ["VLLM::EngineCore"]),
            12: (1, ["bash", "-c", "grep --max-num-seqs 99 vllm serve"]),
        },
    )
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert flags.max_num_seqs == 2


def test_no_vllm_in_the_process_table_is_none(tmp_path: Path) -> None:
    """No shared process namespace (or no vLLM): None, and the caller falls back."""
    proc = fake_proc(tmp_path, {5: (1, ["sleep", "100"])})
    assert ProcessLaunchSource(proc, "http://127.0.0.1:8000").read() is None
    assert ProcessLaunchSource(tmp_path / "absent", "http://127.0.0.1:8000").read() is None


def _server_with_config(tmp_path: Path, config: str, *, relative: bool = False) -> Path:
    """A /proc with one vLLM started with --config; the file under its root (or cwd)."""
    name = "conf/v.yaml" if relative else "/etc/vllm/v.yaml"
    argv = ["vllm", "serve", "m", "--config", name]
    proc = fake_proc(tmp_path / "proc", {10: (1, argv)})
    where = proc / "10" / ("cwd" if relative else "root")
    path = where / name.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text(config)
    return proc


def test_a_config_file_is_read_through_the_server_root(tmp_path: Path) -> None:
    """--config /etc/vllm/v.yaml is read as /proc/<pid>/root/etc/vllm/v.yaml."""
    proc = _server_with_config(tmp_path, "max-num-seqs: 48\ntensor-parallel-size: 2\n")
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert (flags.max_num_seqs, flags.tensor_parallel, flags.config_problem) == (48, 2, None)


def test_a_relative_config_file_is_read_through_the_server_cwd(tmp_path: Path) -> None:
    """--config conf/v.yaml is relative to vLLM's working directory, not the sidecar's."""
    proc = _server_with_config(tmp_path, "max_num_seqs: 12\n", relative=True)
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert flags.max_num_seqs == 12


def test_the_command_line_overrides_the_config_file(tmp_path: Path) -> None:
    """As in vLLM: cli > config > defaults."""
    proc = fake_proc(
        tmp_path / "proc",
        {10: (1, ["vllm", "serve", "m", "--max-num-seqs", "3", "--config", "/c.yaml"])},
    )
    (proc / "10" / "root").mkdir()
    (proc / "10" / "root" / "c.yaml").write_text("max-num-seqs: 64\nport: 8000\n")
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert flags.max_num_seqs == 3


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read it"),
        ("max-num-seqs: [1, 2\n", "not YAML"),
        ("- max-num-seqs\n- 4\n", "not a mapping of flags"),
        ("# " + "x" * (MAX_CONFIG_BYTES + 10), "larger than"),
        ("fifo", "cannot read it"),
        ("[" * 5000, "not YAML"),
    ],
    ids=["unreadable", "not-yaml", "a-list", "too-large", "a-fifo", "nested"],
)
def test_a_config_file_that_cannot_be_used_is_reported_not_guessed(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    """The command line's flags still count; the problem is kept for the log line."""
    argv = ["vllm", "serve", "m", "--config", "/v.yaml", "--tensor-parallel-size", "2"]
    proc = fake_proc(tmp_path / "proc", {10: (1, argv)})
    if content == "fifo":  # would block the read for ever
        (proc / "10" / "root").mkdir()
        os.mkfifo(proc / "10" / "root" / "v.yaml")
    elif content is not None:
        (proc / "10" / "root").mkdir()
        (proc / "10" / "root" / "v.yaml").write_text(content)
    flags = ProcessLaunchSource(proc, "http://127.0.0.1:8000").read()
    assert flags is not None
    assert flags.max_num_seqs is None
    assert flags.tensor_parallel == 2
    assert flags.config_problem is not None
    assert flags.config_problem.startswith(problem)
