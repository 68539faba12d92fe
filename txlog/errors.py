"""The journal's exceptions (shared by :mod:`txlog.journal`, :mod:`txlog.opening` and
:mod:`txlog.maintenance`; :mod:`txlog` re-exports them)."""

from __future__ import annotations


class JournalError(Exception):
    """The journal cannot be opened or used as asked; the message says how to fix it."""


class JournalDamaged(JournalError):
    """The journal's files are damaged (truncated, empty where a journal was, a damaged
    page or newest record); the message names the file and what to do. The open that
    raised it changed nothing in ``data.mdb`` or the segment files."""
