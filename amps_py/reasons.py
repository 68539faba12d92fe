"""Failure reasons, in one catalogue: the short, stable strings a failure is named by.

Three kinds, each used where the failure is detected and nowhere spelled again:

* **Ack reasons**: the ``reason`` of a failure ack the server sends a client. These are
  AMPS's spellings where AMPS has the failure: client libraries match on them, so a
  reason keeps its spelling forever (``tests/test_wire_clients.py`` checks them on the
  wire). The ``detail`` field beside it says what exactly went wrong and how to fix it.
* **Close reasons**: why the server closed a client connection (logs, the admin's
  client list); an ack reason when the close follows a failure ack.
* **Replication link reasons**: the ``reason`` of a
  :class:`amps_py.replication.link.LinkError` and of a ``repl_refuse`` frame between
  instances (the peer logs it, and may be an older or newer amps-py: keep them too).

Like :mod:`amps_py.events`, add new names, never reuse or respell one. Pure: imports
nothing.
"""

from __future__ import annotations

from typing import Final

# ------------------------------------------------------------------ client acks
#: the command is not one the server knows
UNKNOWN_COMMAND: Final = "unknown command"
#: a command other than logon on a connection that has not logged on
LOGON_REQUIRED: Final = "logon required"
#: a second logon on a connection
INVALID_LOGON: Final = "invalid logon"
#: wrong credentials, or no client name where the journal needs one
AUTH_FAILURE: Final = "auth failure"
#: another connection holds the client name
NAME_IN_USE: Final = "name in use"
#: the entitlement module refuses the topic (or, for replication, the logon)
NOT_ENTITLED: Final = "not entitled"
#: a client name longer than the journal stores
INVALID_CLIENT_NAME: Final = "invalid client name"
#: a correlation id longer than the journal stores
INVALID_CORRELATION_ID: Final = "invalid correlation id"
#: an unknown ack type or option, or a bad option value
INVALID_OPTIONS: Final = "invalid options"
#: a publish seq that is not an integer in 0..2**64-1
INVALID_SEQ: Final = "invalid seq"
#: a publish or subscribe without a topic
NO_TOPIC: Final = "no topic"
#: a topic the command cannot use (too long, not journaled, no SOW, ...)
INVALID_TOPIC: Final = "invalid topic"
#: a regex topic that does not compile
BAD_REGEX_TOPIC: Final = "bad regex topic"
#: a content filter that does not parse
BAD_FILTER: Final = "bad filter"
#: a subscribe with a sub_id this connection already uses
SUBID_IN_USE: Final = "subid in use"
#: a ``bm`` value in none of the accepted forms
INVALID_BOOKMARK: Final = "invalid bookmark"
#: no bookmark of the subscribe is held, with ``bookmark_not_found=fail``
BOOKMARK_NOT_FOUND: Final = "bookmark not found"
#: a replay met a damaged record
JOURNAL_CORRUPT: Final = "journal corrupt"
#: a journaled publish while journal writes are failing (also a replication reason)
JOURNAL_UNAVAILABLE: Final = "journal unavailable"
#: a publish was queued but its journal write failed (persisted failure ack)
JOURNAL_WRITE_FAILED: Final = "journal write failed"
#: a message of a SOW topic whose key cannot be read from it (not JSON, or a Key
#: field missing)
PARSE_ERROR: Final = "parse error"
#: a SOW key (``k``) that is missing where the topic has no Key, or not a valid key
BAD_SOW_KEY: Final = "bad sow key"
#: a SOW query met a store it cannot read (a damaged page of its LMDB file); the
#: detail names the store and the fix (it is rebuilt from the journal)
SOW_STORE_UNREADABLE: Final = "sow store unreadable"
#: a logon naming a message type the instance does not load, or one its transport
#: does not accept
INVALID_MESSAGE_TYPE: Final = "invalid message type"
#: no logon within the transport's LogonTimeout (then the connection closes)
LOGON_TIMEOUT: Final = "logon timeout"
#: a frame unfinished after IncompleteMessageTimeout (then the connection closes)
INCOMPLETE_MESSAGE_TIMEOUT: Final = "incomplete message timeout"
#: the client read too slowly; its subscriptions are dropped and it is disconnected
SLOW_CLIENT: Final = "slow client"

# ------------------------------------------------------------------ client closes
#: the connection ended (the client or the server closed it)
CONNECTION_CLOSED: Final = "connection closed"
#: a logon failed authentication (after an ``auth failure`` ack)
AUTH: Final = "auth"
#: the zlib stream of a compressed connection is damaged
BAD_COMPRESSION: Final = "bad compression"
#: partial frames of all connections passed IncompleteMessageMemoryLimit
INCOMPLETE_MESSAGE_MEMORY_LIMIT: Final = "incomplete message memory limit"

# ------------------------------------------------------------------ replication links
#: bytes that are not replication frames (or a frame too large for a handshake)
NOT_A_REPLICATION_PEER: Final = "not a replication peer"
#: a frame the peer may not send now, or with a bad header or payload
PROTOCOL_VIOLATION: Final = "protocol violation"
#: the peer speaks another replication protocol version
PROTOCOL_VERSION: Final = "protocol version"
#: a hello with a field of the wrong shape
MALFORMED_HELLO: Final = "malformed hello"
#: a welcome with a field of the wrong shape
MALFORMED_WELCOME: Final = "malformed welcome"
#: a data frame whose records do not decode, or that skips records
BAD_DATA: Final = "bad data"
#: a compressed data frame that inflates past the frame limit
DATA_TOO_LARGE: Final = "data too large"
#: a frame over the replication frame limit
FRAME_TOO_LARGE: Final = "frame too large"
#: nothing received for longer than the silence limit
PEER_SILENT: Final = "peer silent"
#: this end's hello is larger than a peer accepts before the handshake
HELLO_TOO_LARGE: Final = "hello too large"
#: this end's own code used the link wrongly (a bug)
LINK_MISUSE: Final = "link misuse"
#: a refusal that named no reason
REFUSED: Final = "refused"
#: the peer closed the connection
CLOSED: Final = "closed"
#: the upstream sent no valid hello in time
NO_HELLO: Final = "no hello"
#: connections that have not completed their replication handshake together buffer
#: more than the instance allows; the one holding the most is closed
HANDSHAKE_MEMORY_LIMIT: Final = "handshake memory limit"
#: the downstream's validation of the replicated topics failed
VALIDATION_FAILED: Final = "validation failed"
#: the destination's Authenticator could not give credentials
CREDENTIALS_UNAVAILABLE: Final = "credentials unavailable"
#: the peer is not in the Group the destination expects
GROUP_MISMATCH: Final = "group mismatch"
#: a destination reaches this same instance
REPLICATES_TO_ITSELF: Final = "replicates to itself"
#: the TLS handshake of a secure destination failed
TLS: Final = "tls"
