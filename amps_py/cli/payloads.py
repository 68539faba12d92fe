"""What ``amps-py publish`` sends: DATA, or the non-blank lines of ``--file`` read as
they come (a regular file directly, a pipe in a worker thread), each checked to be a
JSON object on a json transport, with a ``--delimiter`` turned into SOH. A payload
that is refused is named by its line (:func:`check_payloads`, :func:`file_lines`)."""

from __future__ import annotations

import os
import stat
from typing import Any

import trio
import trio.lowlevel

from amps_py.cli.common import fail
from amps_py.cli.connect import CommandFailed


async def delimited(lines: Any, delimiter: bytes, file_: Any) -> Any:
    """``lines(file_)`` with ``delimiter`` written as SOH, the FIX field separator."""
    async for line, done in lines(file_):
        yield line.replace(delimiter, b"\x01"), done


async def file_lines(file_: Any, check_json: bool = False) -> Any:
    """The non-blank lines of ``file_`` (binary) without their line ends, with the
    bytes read so far: ``(line, bytes_read)``. A regular file is read directly; a pipe
    or terminal in a worker thread, so waiting for input does not stall the client.

    With ``check_json``, a line that is not a JSON object raises
    :class:`~amps_py.cli.connect.CommandFailed` (saying which line, and how many were
    yielded before it) instead of being yielded.
    """
    regular = file_size(file_) is not None
    read = 0
    number = yielded = 0
    pending = b""

    def checked(line: bytes) -> bytes:
        nonlocal yielded
        if check_json:
            _check_line(file_, number, line, yielded)
        yielded += 1
        return line

    while True:
        if regular:
            chunk = file_.read(1 << 16)
        else:
            chunk = await trio.to_thread.run_sync(
                getattr(file_, "read1", file_.read), 1 << 16, abandon_on_cancel=True
            )
        if not chunk:
            break
        read += len(chunk)
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            number += 1
            line = line.rstrip(b"\r")
            if line.strip():
                yield checked(line), read - len(pending)
        await trio.lowlevel.checkpoint()
    if pending.strip():
        number += 1
        yield checked(pending.rstrip(b"\r")), read


def _check_line(file_: Any, number: int, line: bytes, sent: int) -> None:
    """Raise :class:`CommandFailed` when line ``number`` of ``file_`` is not a JSON
    object."""
    from amps_py.cli.client import json_problem, json_refusal

    problem = json_problem(line)
    if problem is not None:
        raise CommandFailed(json_refusal(problem, f"{_file_label(file_)} line {number}", sent))


def _file_label(file_: Any) -> str:
    name = str(getattr(file_, "name", "") or "-")
    return "standard input" if name in ("-", "<stdin>") else name


def check_payloads(data: str | None, file_: Any) -> bool:
    """Refuse DATA, or a regular --file with a line, that is not a JSON object (exit
    status 1, nothing sent). Returns whether the lines must still be checked as they
    are read (a pipe, which cannot be read ahead)."""
    from amps_py.cli.client import json_problem, json_refusal

    if data is not None:
        problem = json_problem(data.encode())
        if problem is not None:
            fail(json_refusal(problem, "DATA"))
        return False
    if file_size(file_) is None:
        return True
    start = file_.tell()
    for number, raw_line in enumerate(file_, start=1):
        line = raw_line.rstrip(b"\n").rstrip(b"\r")
        if line.strip():
            problem = json_problem(line)
            if problem is not None:
                fail(json_refusal(problem, f"{_file_label(file_)} line {number}"))
    file_.seek(start)
    return False


def file_size(file_: Any) -> int | None:
    """The size of ``file_`` when it is a regular file (None: a pipe, a terminal)."""
    try:
        info = os.fstat(file_.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return info.st_size if stat.S_ISREG(info.st_mode) else None
