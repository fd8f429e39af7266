"""Specification of bounded local reads: at most the cap, within the deadline, from any kind."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import TYPE_CHECKING

import pytest

from exporter.boundedread import FileReadError, read_bounded

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

CAP = 1024 * 1024


def test_a_regular_file_under_the_cap_is_read_whole(tmp_path: Path) -> None:
    """A small regular file comes back byte for byte."""
    path = tmp_path / "capture.prom"
    path.write_bytes(b"vllm:x 1\n")
    assert read_bounded(path, max_bytes=CAP, timeout_s=1) == b"vllm:x 1\n"


def test_a_regular_file_over_the_cap_is_refused_by_its_size(tmp_path: Path) -> None:
    """A file larger than the cap is refused before any byte is read."""
    path = tmp_path / "big"
    path.write_bytes(b"x" * (CAP + 1))
    with pytest.raises(FileReadError, match=r"big \(a regular file\)|big is larger than 1 MiB"):
        read_bounded(path, max_bytes=CAP, timeout_s=1)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_an_endless_device_is_read_up_to_the_cap_only(device: str) -> None:
    """/dev/zero and /dev/urandom never end: the read stops one byte past the cap."""
    started = time.monotonic()
    with pytest.raises(FileReadError, match="a character device\\) is larger than 1 MiB"):
        read_bounded(device, max_bytes=CAP, timeout_s=5)
    assert time.monotonic() - started < 2


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    """A FIFO in a temporary directory."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _writer(path: Path, stop: threading.Event, *, endless: bool, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
        while endless and not stop.is_set():
            try:
                os.write(fd, b"vllm:x 1\n" * 1000)
            except BrokenPipeError:
                return
    finally:
        os.close(fd)


@pytest.fixture
def writers() -> Iterator[list[threading.Thread]]:
    """Writer threads, stopped and joined after the test."""
    started: list[threading.Thread] = []
    stop = threading.Event()
    yield started
    stop.set()
    for thread in started:
        thread.join(timeout=5)


def test_a_fifo_fed_without_end_is_read_up_to_the_cap_only(
    fifo: Path, writers: list[threading.Thread]
) -> None:
    """A writer that never stops: the reader stops at the cap and says so."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_writer, args=(fifo, stop), kwargs={"endless": True, "data": b""}
    )
    thread.start()
    writers.append(thread)
    try:
        with pytest.raises(FileReadError, match=r"\(a FIFO\) is larger than 1 MiB"):
            read_bounded(fifo, max_bytes=CAP, timeout_s=5)
    finally:
        stop.set()


def test_a_fifo_whose_writer_finishes_is_read_whole(
    fifo: Path, writers: list[threading.Thread]
) -> None:
    """A FIFO is a file like another when its writer writes and closes (``<(curl ...)``)."""
    stop = threading.Event()
    thread = threading.Thread(
        target=_writer, args=(fifo, stop), kwargs={"endless": False, "data": b"vllm:x 1\n"}
    )
    thread.start()
    writers.append(thread)
    assert read_bounded(fifo, max_bytes=CAP, timeout_s=5) == b"vllm:x 1\n"


def test_a_fifo_with_no_writer_is_refused_at_the_deadline(fifo: Path) -> None:
    """Nobody ever opens the other end: refused after the timeout, never a hang."""
    started = time.monotonic()
    with pytest.raises(FileReadError, match=r"is a FIFO with no writer for 0.2 s"):
        read_bounded(fifo, max_bytes=CAP, timeout_s=0.2)
    assert time.monotonic() - started < 1


def test_a_fifo_whose_writer_says_nothing_is_refused_at_the_deadline(
    fifo: Path, writers: list[threading.Thread]
) -> None:
    """A writer that holds the FIFO open and never writes: refused when the time is up."""
    fd = os.open(fifo, os.O_RDWR)  # a writer that stays silent
    try:
        with pytest.raises(FileReadError, match=r"gave 0 bytes and no end within 0.2 s"):
            read_bounded(fifo, max_bytes=CAP, timeout_s=0.2)
    finally:
        os.close(fd)


def test_a_socket_is_refused_by_its_kind(tmp_path: Path) -> None:
    """A UNIX socket cannot be opened as a file: the error says it is a socket."""
    path = tmp_path / "sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(FileReadError, match="it is a socket, not a file"):
            read_bounded(path, max_bytes=CAP, timeout_s=1)


def test_a_procfs_file_is_bounded_though_its_size_says_zero() -> None:
    """/proc/self/pagemap reports size 0 and holds gigabytes: the cap still holds."""
    with pytest.raises(FileReadError, match="is larger than 1 MiB"):
        read_bounded("/proc/self/pagemap", max_bytes=CAP, timeout_s=5)


def test_a_small_procfs_file_is_read_whole() -> None:
    """/proc/self/status (size 0, a few hundred bytes) is read to its end."""
    assert b"Name:" in read_bounded("/proc/self/status", max_bytes=CAP, timeout_s=1)


def test_a_directory_is_refused_by_its_kind(tmp_path: Path) -> None:
    """A directory is named as one."""
    with pytest.raises(FileReadError, match="it is a directory"):
        read_bounded(tmp_path, max_bytes=CAP, timeout_s=1)


def test_regular_only_refuses_a_device_before_reading(tmp_path: Path) -> None:
    """``regular_only`` refuses /dev/zero without reading a byte."""
    with pytest.raises(FileReadError, match="a character device; give a regular file"):
        read_bounded("/dev/zero", max_bytes=CAP, timeout_s=1, regular_only=True)


def test_a_symbolic_link_is_refused_when_not_followed(tmp_path: Path) -> None:
    """``follow_symlinks=False`` refuses a link as the last component."""
    target = tmp_path / "real"
    target.write_bytes(b"{}")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FileReadError, match="is a symbolic link"):
        read_bounded(link, max_bytes=CAP, timeout_s=1, follow_symlinks=False)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    """No such file: the system's words, on one line."""
    with pytest.raises(FileReadError, match=r"cannot read .*: No such file or directory"):
        read_bounded(tmp_path / "absent", max_bytes=CAP, timeout_s=1)
