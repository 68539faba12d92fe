"""The trio server: an :class:`Instance` with its listeners, sessions, journal writer,
subscriptions and bookmark replay. Start one with :func:`serve_instance`."""

from amps_py.statistics import InstanceStatistics

from .instance import Instance
from .run import serve_instance

__all__ = ["Instance", "InstanceStatistics", "serve_instance"]
