"""Compatibility: the schedule parser moved to :mod:`amps_py.actions.schedule`.

Kept while ``amps_py.config`` still imports it from here; import
:mod:`amps_py.actions.schedule` in new code. Remove this module once nothing imports it.
"""

from amps_py.actions.schedule import Schedule, ScheduleError, parse_every

__all__ = ["Schedule", "ScheduleError", "parse_every"]
