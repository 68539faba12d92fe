"""Actions: ``Actions/Action`` from the config, run by the instance.

Each Action has one or more On modules (when), any number of If modules (whether) and
one or more Do modules (what). When an On fires, the If modules are checked in file
order; the first that does not hold skips the Do modules of that run (counted in
``skipped``). Otherwise the Do modules run in file order; a Do that fails is logged and
stops the rest of that run. ``{{NAME}}`` in an option is replaced from the run's
variables (``AMPS_INSTANCE_NAME``, ``AMPS_DATETIME``, ``AMPS_UNIX_TIMESTAMP`` and those
of the event, e.g. ``AMPS_DESTINATION_NAME`` for a downgrade, ``AMPS_CLIENT_NAME`` for a
client connecting); an unknown name becomes "".

If modules: ``if-condition`` holds when its ``Condition``, an AMPS content filter
evaluated against an empty message once the variables are substituted, is TRUE (e.g.
``'{{AMPS_CLIENT_NAME}}' LIKE '^important'``); ``if-file-system-usage`` holds when the
used share of the file system holding ``Path`` is above ``GreaterThan`` and/or below
``LessThan`` (percentages, measured like ``df``).

Client events: ``on-connect-client`` fires when a connection is accepted, before logon,
so its ``AMPS_CLIENT_NAME`` is the connection name (as in AMPS);
``on-disconnect-client`` fires when it closes, with the client name it logged on with
and ``AMPS_AUTHENTICATION_ID``. Both also set ``AMPS_CONNECTION_NAME`` and, an amps-py
addition, ``AMPS_REMOTE_ADDRESS`` (``host:port``). ``on-offline-start`` /
``on-offline-stop`` fire when a slow client is offlined to disk and when it is online
again, with the same variables as ``on-disconnect-client``.

The journal modules (``do-archive-journal``, ``-compress-journal``, ``-remove-journal``)
ask the instance to archive, compress or remove the journal files older than ``Age``;
when that cannot be done the Do fails with the instance's explanation.

The replication modules implement AMPS's automatic downgrade: ``do-downgrade-
replication`` makes every sync destination whose oldest unacknowledged message is older
than ``Age`` async (persisted acks stop waiting for it at once), after an optional
``GracePeriod`` from startup; ``do-upgrade-replication`` makes such a downgraded
destination sync again once its lag is below its own ``Age`` and it has caught up. With
the upgrade Age well below the downgrade Age (AMPS recommends half), a lag that
oscillates between the two never flips the mode back and forth.

The package: :mod:`.runner` (:class:`ActionRunner`, which the instance runs, and the
module helpers), whose names this module re-exports, and :mod:`.host` (what the
runner needs of the instance and of a client session: narrow views, so this package
imports nothing of :mod:`amps_py.server`). When an ``amps-action-on-schedule``
fires is decided by :mod:`amps_py.schedule`, a pure leaf module outside this package:
the config checks ``Every`` with it, and the config must not import this package (which
imports the config: the two would form an import cycle).
"""

from .runner import (
    JOURNAL_MAINTENANCE,
    SIGNALS,
    ActionFailed,
    ActionRunner,
    ActionStatistics,
    admin_path,
    client_variables,
    condition_holds,
    file_system_usage,
    required_parameters,
    substitute,
)

__all__ = [
    "JOURNAL_MAINTENANCE",
    "SIGNALS",
    "ActionFailed",
    "ActionRunner",
    "ActionStatistics",
    "admin_path",
    "client_variables",
    "condition_holds",
    "file_system_usage",
    "required_parameters",
    "substitute",
]
