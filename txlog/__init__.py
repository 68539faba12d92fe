"""txlog: the amps-py journal library (LMDB storage, records, indexes, verify).

Usable without the server: ``amps-py txlog`` and the Spark pipeline import it directly.
Imports no trio and no sockets.
"""

from .errors import JournalDamaged, JournalError, JournalNoSpace
from .identity import BadBookmark, format_bookmark, parse_bookmark, publisher_hash
from .inspection import JournalStatistics, VerifyProblem
from .journal import DURABILITY_MODES, Journal
from .reading import EarliestAbove
from .record import (
    CorruptRecord,
    Flags,
    Kind,
    Record,
    RecordCodec,
    ReplicaReader,
    ReplicaRecord,
    UnreadableRecords,
)

__all__ = [
    "DURABILITY_MODES",
    "BadBookmark",
    "CorruptRecord",
    "EarliestAbove",
    "Flags",
    "Journal",
    "JournalDamaged",
    "JournalError",
    "JournalNoSpace",
    "JournalStatistics",
    "Kind",
    "Record",
    "RecordCodec",
    "ReplicaReader",
    "ReplicaRecord",
    "UnreadableRecords",
    "VerifyProblem",
    "format_bookmark",
    "parse_bookmark",
    "publisher_hash",
]
