"""Bounded reads of local files: at most a cap, within a deadline, whatever the path names.

A path given on the command line or in a setting may name a device (``/dev/zero`` never ends), a
FIFO (whose writer may never come, or never stop), a socket, a procfs file (whose size says 0
whatever it holds) or a directory. ``Path.read_bytes`` reads a device until memory runs out and
blocks for ever on a FIFO without a writer; :func:`read_bounded` instead opens without blocking
and without taking a terminal, reads at most ``max_bytes`` (one chunk more tells "larger"),
waits for data at most ``timeout_s`` in all, and refuses with a one-line
:class:`FileReadError` naming the path, what it is and what went wrong. Every command and
setting that reads a file the user names reads it here: one helper, not one per command.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import stat
import time
from typing import TYPE_CHECKING

from exporter.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

#: Bytes asked of the kernel per read.
CHUNK_BYTES = 64 * 1024


class FileReadError(UsageError):
    """A local file could not be read within its bounds (one line: the path and why)."""

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        #: The file held more than the cap (as opposed to: missing, unreadable, slow, a FIFO).
        self.too_large = too_large


def _kind(mode: int) -> str:
    """What a file is, in the words a message uses."""
    for test, word in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return word
    return "not a regular file"


def _size_text(size: int) -> str:
    if size >= 2**20 and size % 2**20 == 0:
        return f"{size // 2**20} MiB"
    if size >= 2**10 and size % 2**10 == 0:
        return f"{size // 2**10} KiB"
    return f"{size} bytes"


def _open(path: Path | str, *, follow_symlinks: bool) -> int:
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        return os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise FileReadError(f"{path} is a symbolic link; it is not followed") from None
        if exc.errno == errno.ENXIO:
            # A socket (or a device without a driver): open() cannot read it at all.
            with contextlib.suppress(OSError):
                kind = _kind(os.stat(path).st_mode)
                raise FileReadError(f"cannot read {path}: it is {kind}, not a file") from None
        raise FileReadError(f"cannot read {path}: {exc.strerror or exc}") from None


def _wait_readable(fd: int, seconds: float) -> bool:
    """Whether ``fd`` has data (or an end) within ``seconds``."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(seconds * 1000) + 1)))


def read_bounded(
    path: Path | str,
    *,
    max_bytes: int,
    timeout_s: float,
    follow_symlinks: bool = True,
    regular_only: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """At most ``max_bytes`` of ``path``, read within ``timeout_s``; FileReadError otherwise.

    ``regular_only`` refuses anything but a regular file before reading a byte;
    ``follow_symlinks=False`` refuses a symbolic link as the last component (O_NOFOLLOW).
    A FIFO whose writer does not come within the deadline is refused, as is one that says
    nothing at all.
    """
    fd = _open(path, follow_symlinks=follow_symlinks)
    try:
        mode = os.fstat(fd).st_mode
        kind = _kind(mode)
        if stat.S_ISDIR(mode):
            raise FileReadError(f"cannot read {path}: it is a directory; give a file")
        if regular_only and not stat.S_ISREG(mode):
            raise FileReadError(f"cannot read {path}: it is {kind}; give a regular file")
        if stat.S_ISREG(mode) and os.fstat(fd).st_size > max_bytes:
            raise FileReadError(f"{path} is larger than {_size_text(max_bytes)}", too_large=True)
        return _read_all(fd, path, kind=kind, max_bytes=max_bytes, timeout_s=timeout_s, clock=clock)
    finally:
        os.close(fd)


def _read_all(
    fd: int,
    path: Path | str,
    *,
    kind: str,
    max_bytes: int,
    timeout_s: float,
    clock: Callable[[], float],
) -> bytes:
    deadline = clock() + timeout_s
    data = bytearray()
    waited_for_writer = False
    while True:
        left = deadline - clock()
        if left <= 0:
            raise FileReadError(
                f"{path} ({kind}) gave {len(data)} bytes and no end within {timeout_s:g} s"
            )
        try:
            chunk = os.read(fd, CHUNK_BYTES)  # whole chunks: some procfs files want them
        except BlockingIOError:
            _wait_readable(fd, left)  # the deadline check above refuses a silent one
            continue
        except OSError as exc:
            raise FileReadError(f"cannot read {path} ({kind}): {exc.strerror or exc}") from None
        if chunk:
            data += chunk
            if len(data) > max_bytes:
                msg = f"{path} ({kind}) is larger than {_size_text(max_bytes)}"
                raise FileReadError(msg, too_large=True)
            continue
        if kind == "a FIFO" and not data and not waited_for_writer:
            # No writer yet: a FIFO's first reader sees an end at once. Wait for one.
            waited_for_writer = True
            if not _wait_readable(fd, left):
                raise FileReadError(f"{path} is a FIFO with no writer for {timeout_s:g} s")
            continue
        return bytes(data)
