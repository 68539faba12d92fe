"""Stable event codes for log lines (``CC-NNNN``), in one catalogue.

Operators grep and alert on these, so a code keeps its meaning forever; add new codes,
never reuse one. The logging setup prints the code after the level.
"""

from __future__ import annotations

from typing import Final

INSTANCE_STARTING: Final = "00-0001"
INSTANCE_READY: Final = "00-0002"
INSTANCE_STOPPING: Final = "00-0003"
INSTANCE_STOPPED: Final = "00-0004"
INSTANCE_FAILED: Final = "00-0005"
#: The config loads and runs but leaves the instance open: a replication port without
#: authentication beyond loopback, a password or key file others may read, a rules file
#: others may change (``amps_py.config.security_warnings``); logged once at start
CONFIG_SECURITY_WARNING: Final = "00-0020"

TRANSPORT_LISTENING: Final = "02-0001"
TRANSPORT_STOPPED: Final = "02-0002"
NAME_IN_USE: Final = "02-0025"
#: The owner of a client name could not be recorded (the client-name store's disk is
#: full or read-only): the logon goes on, the name stays with its earlier owner or none
NAME_OWNER_UNRECORDED: Final = "02-0040"
#: An administrator handed a client name to a user, or released it (amps-py names)
NAME_HANDED_OVER: Final = "02-0041"
#: A connection to a tcps / amps-replication-secure transport failed its TLS handshake
#: (e.g. a plain-TCP client, or a client that rejects the certificate); only that
#: connection is closed.
TRANSPORT_TLS_HANDSHAKE_FAILED: Final = "02-0026"
#: A listener cannot accept connections: the process has no file descriptor left
#: (EMFILE), the system none (ENFILE), or the kernel no memory for sockets; logged at
#: once, then at most every ACCEPT_REPORT_INTERVAL with the count of failed accepts
TRANSPORT_ACCEPT_FAILED: Final = "02-0027"
#: A listener accepts connections again after such failures
TRANSPORT_ACCEPTING_AGAIN: Final = "02-0028"
#: A connection was closed as soon as it was accepted: its transport had its
#: MaxConnections open; at most one line per transport every 10 s, with the count
TRANSPORT_CONNECTION_LIMIT: Final = "02-0030"

JOURNAL_OPENED: Final = "05-0001"
JOURNAL_COMMIT_FAILED: Final = "05-0002"
JOURNAL_CORRUPT_RECORD: Final = "05-0003"
#: journal segments compressed, archived, marked for removal or removed
JOURNAL_MAINTENANCE: Final = "05-0004"
#: a background journal maintenance step failed; it is retried
JOURNAL_MAINTENANCE_FAILED: Final = "05-0005"
#: one record could not be stored (a field longer than the journal stores); the rest
#: of its commit was stored
JOURNAL_RECORD_REJECTED: Final = "05-0010"
#: journal writes are accepted again after a failed commit (e.g. space returned)
JOURNAL_WRITES_RESUMED: Final = "05-0011"
#: the journal was refused at start (damaged or truncated files, an empty journal where
#: one existed, a damaged newest record, held by another process); the instance exits
JOURNAL_OPEN_REFUSED: Final = "05-0020"
#: ``--allow-empty-journal`` started an empty journal where one existed
JOURNAL_STARTED_EMPTY: Final = "05-0021"

CLIENT_CONNECTED: Final = "07-0001"
CLIENT_LOGON: Final = "07-0002"
CLIENT_LOGON_FAILED: Final = "07-0003"
CLIENT_PROTOCOL_ERROR: Final = "07-0010"
CLIENT_COMMAND_FAILED: Final = "07-0011"
CLIENT_DISCONNECTED: Final = "07-0013"
CLIENT_HEARTBEAT_MISSED: Final = "07-0042"
#: A logon was refused by the authentication module (wrong password, unknown user), or
#: without a check while its user or address is backed off after failed logons; logged
#: with the user name (cut to 64 characters) and the peer, never the password (past a
#: few per 10 s from one address, summed into one AUTH_FAILURES_SUMMARY line). The
#: connection is closed.
CLIENT_AUTH_FAILED: Final = "07-0050"
#: A command was refused by the entitlement module (reason ``not entitled``); the
#: connection stays open.
CLIENT_NOT_ENTITLED: Final = "07-0051"
#: An admin API request was refused before it did anything: an unknown Host header
#: (421), a cross-site Origin or a missing X-AMPS-Admin header on an administrator
#: action (403); logged with the peer address, the path and the user it named
#: (never the password). A 401 is logged as CLIENT_AUTH_FAILED, a missing admin
#: right as CLIENT_NOT_ENTITLED.
ADMIN_REQUEST_REFUSED: Final = "07-0052"
#: A connection did not log on within its transport's LogonTimeout; it is closed.
CLIENT_LOGON_TIMEOUT: Final = "07-0070"
#: A client did not finish a frame within its transport's IncompleteMessageTimeout;
#: the connection is closed.
CLIENT_INCOMPLETE_MESSAGE_TIMEOUT: Final = "07-0071"
#: Partial frames of all connections passed IncompleteMessageMemoryLimit; the connection
#: holding the largest one is closed.
CLIENT_INCOMPLETE_MESSAGE_MEMORY: Final = "07-0072"
#: A client was disconnected as a slow client (its ClientMaxCapacity, or the biggest
#: backlog when MessageMemoryLimit was passed); AMPS's code for the same event.
CLIENT_SLOW_DISCONNECTED: Final = "70-0004"
#: A client was offlined: the most bytes waiting in memory when MessageMemoryLimit was
#: passed; its backlog spills to a file under MessageDiskPath until it catches up.
CLIENT_OFFLINE_START: Final = "70-0005"
#: An offlined client caught up with its spilled backlog and is online again (its spill
#: file removed).
CLIENT_OFFLINE_STOP: Final = "70-0006"

SUBSCRIPTION_REPLAY_FAILED: Final = "08-0001"

REPLICATION_CONNECTED: Final = "15-0001"
REPLICATION_DISCONNECTED: Final = "15-0002"
REPLICATION_REFUSED: Final = "15-0003"
REPLICATION_LINK_ERROR: Final = "15-0004"
REPLICATION_RESYNC_FULL: Final = "15-0005"
REPLICATION_HOLE: Final = "15-0006"
REPLICATION_WAITING: Final = "15-0007"
REPLICATION_VALIDATION_FAILED: Final = "15-0008"
#: a sync destination now acknowledges async (persisted acks stop waiting for it)
REPLICATION_DOWNGRADED: Final = "15-0009"
#: a downgraded destination is sync again
REPLICATION_UPGRADED: Final = "15-0010"
#: a replicated record's publisher seq is far above (SequenceGapThreshold) the highest
#: this instance held for that publisher; stored, logged and counted (a forged record
#: from an unauthenticated peer looks like this)
REPLICATION_SEQUENCE_GAP: Final = "15-0011"
#: a destination cannot be reached (connect fails, or the connection drops before its
#: handshake): logged at its first failure, then at growing intervals with the count of
#: failed attempts since the line before (the log of an outage; see
#: amps_py/replication/outage.py); ``amps-py admin status`` shows it while it lasts
REPLICATION_UNREACHABLE: Final = "15-0012"

#: a Do module of an Action failed (the rest of that run is skipped)
ACTION_FAILED: Final = "16-0001"
#: an action was run by an administrator (amps-action-on-admin)
ACTION_RUN: Final = "16-0002"


#: a SOW topic's store was (re)built from the journal, or set aside as unreadable
SOW_STORE_REBUILT: Final = "17-0001"
#: a journaled SOW record could not be applied (it names the record and why)
SOW_RECORD_UNREADABLE: Final = "17-0002"
#: expired SOW records could not be removed from their store (retried next sweep)
SOW_EXPIRY_FAILED: Final = "17-0003"
#: a SOW query (sow, sow_and_subscribe, sow_delete by filter) met a store it cannot
#: read: that command got a failure ack (``sow store unreadable``); the line names the
#: store file and the fix
SOW_QUERY_FAILED: Final = "17-0004"
#: a conflated topic was filled from its underlying SOW topic at start
CONFLATED_TOPIC_FILLED: Final = "17-0005"
#: a conflated topic's interval update could not be written (retried next interval)
CONFLATED_TOPIC_FAILED: Final = "17-0006"

#: the queues were rebuilt from the journal at start (how many messages wait)
QUEUES_REBUILT: Final = "18-0001"
#: a journaled queue record could not be applied (it names the record and why)
QUEUE_RECORD_UNREADABLE: Final = "18-0002"
#: proxied transfer was enabled or disabled, or claimed messages of an unreachable owner
QUEUE_PROXIED_CLAIM: Final = "18-0003"


#: Authentication (all entry points: client transports, replication, the admin API).
#: A request to the admin API was refused: its HTTP Basic credentials failed the
#: Authentication module, or its user or address is backed off (status 401); logged
#: with the user name (cut to 64 characters) and the peer, never the password.
ADMIN_AUTH_FAILED: Final = "20-0001"
#: An upstream's replication hello failed authentication (wrong or no credentials, or
#: backed off); logged like ADMIN_AUTH_FAILED. The hello is refused.
REPLICATION_AUTH_FAILED: Final = "20-0002"
#: A user name or a peer address reached the failed-logon threshold: attempts are
#: refused without checking the password for a growing time (see "Security" in
#: docs/GUARANTEES.md); logged once per user or address, when its first back-off starts.
AUTH_BACKOFF_STARTED: Final = "20-0003"
#: Failed logons from one address beyond the first few per 10 s, counted into one line
#: ("N more failed logons from ADDR in the last 10 s") instead of a line each.
AUTH_FAILURES_SUMMARY: Final = "20-0004"


def extra(code: str) -> dict[str, str]:
    """The ``extra=`` mapping that tags a log record with an event code."""
    return {"code": code}
