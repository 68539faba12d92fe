"""The open LMDB environment of a journal: its sub-databases, codec and settings.

:class:`JournalEnv` is what every part of an open journal reads and writes through
(:mod:`txlog.reading`, :mod:`txlog.maintenance`, :mod:`txlog.inspection`,
:mod:`txlog.writing`); :class:`txlog.journal.Journal` opens it and owns it. It holds
nothing that changes while the journal is open: the in-memory state that does is
:class:`txlog.state.JournalState`.

The sub-databases are listed in :mod:`txlog.journal`; those newer versions added
(``segments``, ``destinations``, ``floors``, ``holdings``) are ``None`` when a
read-only open finds an older journal without them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import lmdb

from .errors import JournalDamaged
from .opening import LMDB_DAMAGE_ERRORS, check_format_and_owner, lmdb_damage
from .record import Record, RecordCodec
from .segments import Segment

_U64 = struct.Struct(">Q")


class JournalEnv:
    """The LMDB environment ``env`` of the journal in ``path``, opened with its
    sub-databases (created when ``readonly`` is false), its format and owner checked
    (:func:`txlog.opening.check_format_and_owner`).

    Raises:
        JournalError: the journal is of another format or instance.
        lmdb.Error: LMDB cannot open a sub-database.
    """

    __slots__ = (
        "archive_directory",
        "bookmarks",
        "codec",
        "compression",
        "destinations_db",
        "durability",
        "env",
        "floors_db",
        "holdings_db",
        "instance_name",
        "meta",
        "origins",
        "path",
        "publishers",
        "records",
        "segment_size",
        "segments_db",
        "times",
        "upstreams",
    )

    def __init__(
        self,
        env: lmdb.Environment,
        path: Path,
        *,
        instance_name: str | None,
        readonly: bool,
        durability: str,
        compression: str,
        segment_size: int,
        archive_directory: Path | None,
    ) -> None:
        create = not readonly
        self.env = env
        self.path = path
        self.archive_directory = archive_directory
        self.durability = durability
        self.compression = compression
        self.segment_size = segment_size
        self.records = env.open_db(b"records", create=create)
        self.bookmarks = env.open_db(b"bookmarks", create=create)
        self.publishers = env.open_db(b"publishers", create=create)
        self.origins = env.open_db(b"origins", create=create)
        self.times = env.open_db(b"times", create=create)
        self.meta = env.open_db(b"meta", create=create)
        self.upstreams = env.open_db(b"upstreams", create=create)
        self.segments_db = self._open_optional_db(b"segments", create)
        self.destinations_db = self._open_optional_db(b"destinations", create)
        self.floors_db = self._open_optional_db(b"floors", create)
        self.holdings_db = self._open_optional_db(b"holdings", create)
        self.codec = RecordCodec(compress=compression == "zstd")
        #: the owning instance (as stored in the journal when opened with ``None``)
        self.instance_name: str = check_format_and_owner(
            env, self.meta, path, instance_name, readonly
        )

    def _open_optional_db(self, name: bytes, create: bool) -> lmdb._Database | None:
        """A sub-database newer versions added; ``None`` when a read-only open finds an
        older journal without it."""
        try:
            return self.env.open_db(name, create=create)
        except lmdb.NotFoundError:
            return None

    def newest_key(self, db: lmdb._Database, readonly: bool) -> tuple[int, JournalDamaged | None]:
        """The highest (u64) key of ``db``, 0 when empty. A read-only open (the tools)
        survives a damaged LMDB page here, so ``verify`` can still list the damage: the
        segment table, written with every commit, then gives the newest txid (the
        damage is returned with 0).

        Raises:
            lmdb.Error: LMDB cannot read the newest page (a writer's open).
        """
        try:
            with self.env.begin(db=db) as txn:
                cur = txn.cursor()
                return (int(_U64.unpack(cur.key())[0]) if cur.last() else 0), None
        except LMDB_DAMAGE_ERRORS as exc:
            if not readonly:
                raise
            return 0, lmdb_damage(self.path, exc)

    def segment_path(self, seg: Segment) -> Path:
        """Where ``seg``'s file is: files in the journal directory are recorded by name
        (the directory can be moved or restored elsewhere), others (archived) by
        absolute path."""
        path = Path(seg.file)
        return path if path.is_absolute() else self.path / path

    def check_holdings(self, last_txid: int, readonly: bool) -> bool:
        """Whether the ``holdings`` database accounts for every record (see
        :mod:`txlog.holdings`) of a journal whose newest is ``last_txid``: it does when
        every write since the journal was created kept it, which the
        ``holdings_through`` meta entry shows (the newest txid it covers). A journal
        written before holdings existed, or written since by an amps-py that did not
        keep them, never has them again (marked ``off``): a resync without a cursor
        then sends everything, as before."""
        if self.holdings_db is None:
            return False
        with self.env.begin(db=self.meta) as txn:
            state = txn.get(b"holdings")
            raw = txn.get(b"holdings_through")
        if state == b"off":
            return False
        through = _U64.unpack(raw)[0] if raw is not None and len(raw) == 8 else None
        valid = through == last_txid if through is not None else last_txid == 0
        through_now = _U64.pack(last_txid)
        # write only what changes: an open that changes nothing leaves the files as
        # they were (a start refused over a damaged record must not touch the journal)
        if not readonly and (raw != through_now if valid else state != b"off"):
            with self.env.begin(write=True, db=self.meta) as txn:
                if valid:
                    txn.put(b"holdings_through", through_now)
                else:
                    txn.put(b"holdings", b"off")
        return valid

    def load_segments(
        self,
        last_txid: int,
        readonly: bool,
        first_lmdb_record: Callable[[], Record | None],
        record: Callable[[int], Record | None],
    ) -> list[Segment]:
        """The segment table as stored, oldest first. A journal from before segments
        (records up to ``last_txid``, none in the table) gets segment 1 holding all,
        from its oldest record in LMDB (``first_lmdb_record()``) to ``record(last_txid)``
        (stored, unless ``readonly``)."""
        segments: list[Segment] = []
        if self.segments_db is not None:
            with self.env.begin(db=self.segments_db) as txn:
                for key, value in txn.cursor():
                    segments.append(Segment.decode(_U64.unpack(key)[0], value))
        if segments or last_txid == 0:
            return segments
        # a journal from before segments: everything so far is segment 1
        first = first_lmdb_record()
        last = record(last_txid)
        with self.env.begin() as txn:
            stat = txn.stat(self.records)
        pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
        seg = Segment(
            1,
            first.txid if first else 1,
            last_txid,
            first.local_ts if first else 0,
            last.local_ts if last else 0,
            pages * stat["psize"],
            stat["entries"],
        )
        if not readonly and self.segments_db is not None:
            with self.env.begin(write=True, db=self.segments_db) as txn:
                txn.put(_U64.pack(seg.id), seg.encode())
        return [seg]
