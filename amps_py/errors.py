"""Errors shared across packages (a leaf module: it imports nothing of amps_py)."""

from __future__ import annotations


class JournalMaintenanceError(Exception):
    """A journal maintenance request cannot be done as asked; the text says how to fix
    it (raised by the server, reported by the admin API and by actions)."""
