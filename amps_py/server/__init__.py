"""The trio server: an :class:`Instance` with its listeners, sessions, journal writer,
subscriptions and bookmark replay. Start one with :func:`serve_instance`."""

from .instance import Instance, InstanceStatistics, serve_instance

__all__ = ["Instance", "InstanceStatistics", "serve_instance"]
