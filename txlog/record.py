"""Journal records: the unit the transaction log stores, replays and replicates.

Binary layout of one record value (all integers big-endian):

    crc32      u32   CRC-32 of every byte after this field
    version    u8    record format version (1)
    kind       u8    :class:`Kind`
    flags      u16   :class:`Flags`
    txid, pub_hash, seq, origin_txid, origin_ts_us, local_ts_us       6 x u64
    lengths    7 x u16  client_name, origin, topic, message_type, sow_key,
                        correlation_id, path
    the seven UTF-8 strings, then the payload (to the end of the value)

``path`` lists the instances a replicated record went through as
``name\\x1fgroup`` entries joined by ``\\x1e``, origin first.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum, IntFlag
from functools import lru_cache
from typing import Any, Final, NamedTuple

import zstandard

from .errors import CorruptRecord as CorruptRecord  # re-exported
from .errors import UnreadableRecords as UnreadableRecords  # re-exported

FORMAT_VERSION: Final = 1

_FIXED = struct.Struct(">IBBH6Q7H")
_CRC = struct.Struct(">I")
_AFTER_CRC = struct.Struct(">BBH6Q7H")  # the fixed fields after the CRC
_FIXED_SIZE: Final = _FIXED.size
_U64_MAX: Final = (1 << 64) - 1
_UNIT_SEP: Final = "\x1f"
_RECORD_SEP: Final = "\x1e"


class Kind(IntEnum):
    """What a record stands for."""

    PUBLISH = 1
    DELTA_PUBLISH = 2
    SOW_DELETE = 3
    #: messages leaving a queue (acknowledged, expired, or sent at most once); the
    #: record's topic is the queue's name, its payload ``{"bookmarks": [...],
    #: "reason": ...}``; not a message: never delivered or replayed
    QUEUE_ACK = 4
    #: a queue's ownership traffic: a request for messages, or the owner's grant;
    #: topic the queue's name, payload ``{"op": "request"|"grant", "bookmarks":
    #: [...], "to": <instance>}``; not a message
    QUEUE_TRANSFER = 5


class Flags(IntFlag):
    NONE = 0
    #: the stored payload is zstd-compressed
    ZSTD = 1


# plain ints on the hot path (IntFlag arithmetic is slow)
_ZSTD: Final = int(Flags.ZSTD)
_NOT_ZSTD: Final = 0xFFFF & ~_ZSTD


class Record:
    """One journaled message. Mutable only until the writer assigns ``txid``."""

    __slots__ = (
        "client_name",
        "correlation_id",
        "flags",
        "kind",
        "local_ts",
        "message_type",
        "origin",
        "origin_ts",
        "origin_txid",
        "path",
        "payload",
        "pub_hash",
        "seq",
        "sow_key",
        "topic",
        "txid",
    )

    def __init__(
        self,
        *,
        topic: str,
        payload: bytes,
        pub_hash: int,
        seq: int,
        client_name: str = "",
        message_type: str = "json",
        kind: int = 1,  # Kind.PUBLISH
        origin: str = "",
        origin_txid: int = 0,
        origin_ts: int = 0,
        local_ts: int = 0,
        txid: int = 0,
        path: tuple[tuple[str, str], ...] = (),
        sow_key: str = "",
        correlation_id: str = "",
        flags: int = 0,
    ) -> None:
        self.txid = txid
        self.pub_hash = pub_hash
        self.seq = seq
        self.client_name = client_name
        self.origin = origin
        self.origin_txid = origin_txid
        self.path = path
        self.topic = topic
        self.message_type = message_type
        self.kind = kind
        self.origin_ts = origin_ts
        self.local_ts = local_ts
        self.sow_key = sow_key
        self.correlation_id = correlation_id
        self.flags = flags
        self.payload = payload

    @classmethod
    def published(
        cls,
        topic: str,
        payload: bytes,
        pub_hash: int,
        seq: int,
        client_name: str,
        message_type: str,
        origin: str,
        correlation_id: str,
    ) -> Record:
        """A new publish (the fields a client's publish sets; the rest as the
        constructor's defaults). The publish path's constructor: positional arguments
        and no defaults to resolve cost a third of the keyword constructor."""
        rec = _new_record(cls)
        rec.txid = 0
        rec.pub_hash = pub_hash
        rec.seq = seq
        rec.client_name = client_name
        rec.origin = origin
        rec.origin_txid = 0
        rec.path = ()
        rec.topic = topic
        rec.message_type = message_type
        rec.kind = 1  # Kind.PUBLISH
        rec.origin_ts = 0
        rec.local_ts = 0
        rec.sow_key = ""
        rec.correlation_id = correlation_id
        rec.flags = 0
        rec.payload = payload
        return rec

    @property
    def bookmark(self) -> str:
        """The AMPS bookmark ``<publisher hash>|<seq>|``: identical on every instance."""
        return f"{self.pub_hash}|{self.seq}|"

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (``amps-py txlog dump``); payload as UTF-8 text when it is."""
        try:
            data: Any = self.payload.decode("utf-8")
            encoding = "utf-8"
        except UnicodeDecodeError:
            data = self.payload.hex()
            encoding = "hex"
        return {
            "txid": self.txid,
            "bookmark": self.bookmark,
            "client_name": self.client_name,
            "seq": self.seq,
            "topic": self.topic,
            "message_type": self.message_type,
            "kind": Kind(self.kind).name.lower()
            if self.kind in Kind._value2member_map_
            else self.kind,
            "origin": self.origin,
            "origin_txid": self.origin_txid,
            "path": [list(hop) for hop in self.path],
            "origin_ts_us": self.origin_ts,
            "local_ts_us": self.local_ts,
            "sow_key": self.sow_key,
            "correlation_id": self.correlation_id,
            "payload_encoding": encoding,
            "payload": data,
        }

    def __repr__(self) -> str:
        return f"Record(txid={self.txid}, bm={self.bookmark}, topic={self.topic!r})"


_new_record = object.__new__
#: payloads up to this size are joined before their CRC (see RecordCodec.encode)
_JOIN_FIRST: Final = 16 * 1024


@lru_cache(maxsize=65536)
def _encoded_text(text: str) -> bytes:
    """UTF-8 of names that repeat across records (client, origin, topic, type)."""
    return text.encode()


# A fabric has few distinct paths; caching their encodings saves work per replicated record.
@lru_cache(maxsize=4096)
def _encode_path(path: tuple[tuple[str, str], ...]) -> bytes:
    return _RECORD_SEP.join(f"{name}{_UNIT_SEP}{group}" for name, group in path).encode()


def decode_path(raw: bytes) -> tuple[tuple[str, str], ...]:
    """The hops ``(name, group)`` of a stored path, origin first.

    Raises:
        UnicodeDecodeError: the bytes are not UTF-8.
    """
    return _decode_path(raw)


@lru_cache(maxsize=4096)
def _decode_path(raw: bytes) -> tuple[tuple[str, str], ...]:
    """Raises UnicodeDecodeError for bytes that are not UTF-8 (the caller reports it)."""
    if not raw:
        return ()
    hops = []
    for entry in raw.decode().split(_RECORD_SEP):
        name, _, group = entry.partition(_UNIT_SEP)
        hops.append((name, group))
    return tuple(hops)


class RouteView(NamedTuple):
    """What a replication routing decision needs, decoded without building a Record;
    ``raw`` is the stored value, sent on as it is."""

    txid: int
    bookmark: str
    topic: str
    message_type: str
    origin: str
    path: tuple[tuple[str, str], ...]
    raw: bytes
    payload_at: int
    flags: int
    origin_txid: int = 0


class RecordCodec:
    """Encodes and decodes record values, with optional zstd payload compression.

    Args:
        compress: compress payloads with zstd when that makes them smaller. Reading
            always understands compressed records, whatever this setting.
    """

    #: payloads below this size are stored raw; zstd's frame overhead eats the gain
    MIN_COMPRESS_SIZE: Final = 128

    def __init__(self, *, compress: bool = False) -> None:
        self.compress = compress
        self._compressor = zstandard.ZstdCompressor(level=3) if compress else None
        self._decompressor = zstandard.ZstdDecompressor()

    def encode(self, rec: Record) -> bytes:
        payload = rec.payload
        flags = rec.flags & _NOT_ZSTD
        if self._compressor is not None and len(payload) >= self.MIN_COMPRESS_SIZE:
            packed = self._compressor.compress(payload)
            if len(packed) < len(payload):
                payload = packed
                flags |= _ZSTD
        text = _encoded_text
        client = text(rec.client_name)
        origin = text(rec.origin)
        topic = text(rec.topic)
        mtype = text(rec.message_type)
        sow_key = rec.sow_key.encode() if rec.sow_key else b""
        cid = rec.correlation_id.encode() if rec.correlation_id else b""
        path = _encode_path(rec.path) if rec.path else b""
        head = _AFTER_CRC.pack(
            FORMAT_VERSION,
            rec.kind,
            flags,
            rec.txid,
            rec.pub_hash,
            rec.seq,
            rec.origin_txid,
            rec.origin_ts,
            rec.local_ts,
            len(client),
            len(origin),
            len(topic),
            len(mtype),
            len(sow_key),
            len(cid),
            len(path),
        )
        if len(payload) <= _JOIN_FIRST:
            # small: one CRC over the joined body costs less than a CRC per part
            body = b"".join((head, client, origin, topic, mtype, sow_key, cid, path, payload))
            return _CRC.pack(zlib.crc32(body)) + body
        # big: CRC over the parts in order (no joined copy of the payload before it)
        crc32 = zlib.crc32
        crc = crc32(
            payload,
            crc32(
                path,
                crc32(
                    cid,
                    crc32(
                        sow_key,
                        crc32(mtype, crc32(topic, crc32(origin, crc32(client, crc32(head))))),
                    ),
                ),
            ),
        )
        return b"".join(
            (_CRC.pack(crc), head, client, origin, topic, mtype, sow_key, cid, path, payload)
        )

    def view(self, value: bytes, expected_txid: int) -> DeliveryView:
        """Decode only what a delivery needs (CRC still checked). Raises CorruptRecord."""
        fields, end = _checked_header(value, expected_txid)
        n_client, n_origin, n_topic, n_mtype, n_sow, n_cid = fields[10:16]
        pos = _FIXED_SIZE + n_client + n_origin
        try:
            topic = value[pos : pos + n_topic].decode()
            start = pos + n_topic
            raw_type = value[start : start + n_mtype]
            mtype = "json" if raw_type == b"json" else raw_type.decode()
            cid = sow_key = ""
            if n_cid or n_sow:
                start += n_mtype
                if n_sow:
                    sow_key = value[start : start + n_sow].decode()
                start += n_sow
                cid = value[start : start + n_cid].decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecord(expected_txid, f"text field is not UTF-8 ({exc})") from None
        payload = self._payload(value, end, fields[3], expected_txid)
        return DeliveryView(
            fields[4],
            fields[5],
            fields[6],
            topic,
            cid,
            fields[9],
            payload,
            fields[2],
            sow_key,
            mtype,
        )

    def route_view(self, value: bytes, expected_txid: int) -> RouteView:
        """Decode only the routing fields (CRC still checked). Raises CorruptRecord."""
        fields, end = _checked_header(value, expected_txid)
        n_client, n_origin, n_topic, n_mtype, n_sow, n_cid, n_path = fields[10:17]
        pos = _FIXED_SIZE + n_client
        try:
            origin = value[pos : pos + n_origin].decode()
            pos += n_origin
            topic = value[pos : pos + n_topic].decode()
            pos += n_topic
            mtype = value[pos : pos + n_mtype].decode()
            pos += n_mtype + n_sow + n_cid
            path = _decode_path(value[pos : pos + n_path]) if n_path else ()
        except UnicodeDecodeError as exc:
            raise CorruptRecord(expected_txid, f"text field is not UTF-8 ({exc})") from None
        return RouteView(
            fields[4],
            f"{fields[5]}|{fields[6]}|",
            topic,
            mtype,
            origin,
            path,
            value,
            end,
            fields[3],
            fields[7],
        )

    def route_payload(self, view: RouteView) -> bytes:
        """The payload of a :class:`RouteView` (decompressed), for content filters."""
        return self._payload(view.raw, view.payload_at, view.flags, view.txid)

    def _payload(self, value: bytes, end: int, flags: int, expected_txid: int | None) -> bytes:
        payload = value[end:]
        if flags & _ZSTD:
            try:
                payload = self._decompressor.decompress(payload)
            except zstandard.ZstdError as exc:
                raise CorruptRecord(expected_txid, f"payload does not decompress ({exc})") from None
        return payload

    def decode(self, value: bytes, expected_txid: int | None = None) -> Record:
        """Decode one stored value, checking its CRC first.

        Raises:
            CorruptRecord: CRC mismatch, truncation, unknown version or bad text.
        """
        (
            (
                _crc,
                _version,
                kind,
                flags,
                txid,
                pub_hash,
                seq,
                origin_txid,
                origin_ts,
                local_ts,
                n_client,
                n_origin,
                n_topic,
                n_mtype,
                n_sow,
                n_cid,
                n_path,
            ),
            end,
        ) = _checked_header(value, expected_txid)
        pos = _FIXED_SIZE
        try:
            client = value[pos : pos + n_client].decode()
            pos += n_client
            origin = value[pos : pos + n_origin].decode()
            pos += n_origin
            topic = value[pos : pos + n_topic].decode()
            pos += n_topic
            mtype = value[pos : pos + n_mtype].decode()
            pos += n_mtype
            sow_key = value[pos : pos + n_sow].decode() if n_sow else ""
            pos += n_sow
            cid = value[pos : pos + n_cid].decode() if n_cid else ""
            pos += n_cid
            path = _decode_path(value[pos : pos + n_path]) if n_path else ()
        except UnicodeDecodeError as exc:
            raise CorruptRecord(expected_txid, f"text field is not UTF-8 ({exc})") from None
        payload = self._payload(value, end, flags, expected_txid)
        rec = Record.__new__(Record)
        rec.txid = txid
        rec.pub_hash = pub_hash
        rec.seq = seq
        rec.client_name = client
        rec.origin = origin
        rec.origin_txid = origin_txid
        rec.path = path
        rec.topic = topic
        rec.message_type = mtype
        rec.kind = kind
        rec.origin_ts = origin_ts
        rec.local_ts = local_ts
        rec.sow_key = sow_key
        rec.correlation_id = cid
        rec.flags = flags & _NOT_ZSTD
        rec.payload = payload
        return rec


class ReplicaRecord(Record):
    """A record received by replication, kept in its wire encoding.

    The journal stores it by restamping the received bytes (new txid, local timestamp
    and path, fresh CRC) instead of decoding and re-encoding every field: the payload
    is never touched, so it keeps the compression it was stored with at its origin.
    Every other field reads like a :class:`Record`'s; ``payload`` is decoded on first
    use (only when a local subscriber wants it).

    Built by :class:`ReplicaReader`; only the journal calls :meth:`restamp`.
    """

    __slots__ = ("_decoded", "_lengths", "_payload_size", "_tail")

    _lengths: tuple[int, ...]  # the seven string lengths in ``_tail``
    _payload_size: int
    _tail: bytes  # what follows the fixed fields: strings (new path included), payload
    _decoded: bytes | None

    @property
    def payload(self) -> bytes:  # type: ignore[override]
        decoded = self._decoded
        if decoded is None:
            tail = self._tail
            at = len(tail) - self._payload_size
            decoded = self._decoded = _CODEC_FOR_PAYLOADS._payload(
                tail, at, self.flags, self.txid or None
            )
        return decoded

    def restamp(self, txid: int, local_ts: int) -> bytes:
        """The value to store: the received record with ``txid``, ``local_ts`` and the
        extended path, under a new CRC."""
        self.txid = txid
        self.local_ts = local_ts
        head = _AFTER_CRC.pack(
            FORMAT_VERSION,
            self.kind,
            self.flags,
            txid,
            self.pub_hash,
            self.seq,
            self.origin_txid,
            self.origin_ts,
            local_ts,
            *self._lengths,
        )
        tail = self._tail
        return b"".join((_CRC.pack(zlib.crc32(tail, zlib.crc32(head))), head, tail))


class _Strings(NamedTuple):
    """The decoded string block of a received record, with its restamped encoding."""

    client_name: str
    origin: str
    topic: str
    message_type: str
    sow_key: str
    correlation_id: str
    path: tuple[tuple[str, str], ...]
    block: bytes  # the string block with the extended path, as it will be stored
    lengths: tuple[int, ...]  # the seven string lengths of ``block``


class ReplicaReader:
    """Turns records received by replication from one upstream into
    :class:`ReplicaRecord`\\ s that extend their path with ``hop`` (name, group).

    Records of one publisher carry the same names, so the string block (client,
    origin, topic, type, path) repeats; it is decoded once and cached, bounded by
    ``cache_size`` distinct blocks.
    """

    def __init__(self, hop: tuple[str, str], cache_size: int = 4096) -> None:
        self.hop = hop
        self._cache: dict[bytes, _Strings] = {}
        self._cache_size = cache_size

    def __call__(self, value: bytes) -> ReplicaRecord:
        """Raises:
        CorruptRecord: the received bytes fail their CRC or do not decode."""
        fields, end = _checked_header(value, None)
        block = value[_FIXED_SIZE:end]
        strings = self._cache.get(block)
        if strings is None:
            strings = self._strings(block, fields[10:17])
        rec = ReplicaRecord.__new__(ReplicaRecord)
        rec.txid = 0
        rec.kind = fields[2]
        rec.flags = fields[3]
        rec.pub_hash = fields[5]
        rec.seq = fields[6]
        rec.origin_txid = fields[7]
        rec.origin_ts = fields[8]
        rec.local_ts = 0
        (
            rec.client_name,
            rec.origin,
            rec.topic,
            rec.message_type,
            rec.sow_key,
            rec.correlation_id,
            rec.path,
            new_block,
            rec._lengths,
        ) = strings
        rec._payload_size = len(value) - end
        rec._tail = new_block + value[end:]
        rec._decoded = None
        return rec

    def _strings(self, block: bytes, lengths: tuple[int, ...]) -> _Strings:
        texts: list[str] = []
        pos = 0
        try:
            for n in lengths[:6]:
                texts.append(block[pos : pos + n].decode())
                pos += n
        except UnicodeDecodeError as exc:
            raise CorruptRecord(None, f"text field is not UTF-8 ({exc})") from None
        try:
            path = (*_decode_path(block[pos:]), self.hop)
        except UnicodeDecodeError as exc:
            raise CorruptRecord(None, f"path is not UTF-8 ({exc})") from None
        new_path = _encode_path(path)
        if len(new_path) > 0xFFFF:  # stored with a u16 length: it would fail the commit
            raise CorruptRecord(
                None,
                f"its path of {len(path)} hops would take {len(new_path)} bytes with this "
                "hop added, more than the 65535 a record holds",
            )
        client, origin, topic, mtype, sow_key, cid = texts
        strings = _Strings(
            client,
            origin,
            topic,
            mtype,
            sow_key,
            cid,
            path,
            block[:pos] + new_path,
            (*lengths[:6], len(new_path)),
        )
        cache = self._cache
        if len(cache) >= self._cache_size:
            cache.clear()
        # a correlation id or SOW key makes each block unique: not worth caching
        if not (lengths[4] or lengths[5]):
            cache[block] = strings
        return strings


class DeliveryView(NamedTuple):
    """The fields a subscriber delivery needs, decoded without building a Record."""

    txid: int
    pub_hash: int
    seq: int
    topic: str
    correlation_id: str
    local_ts: int
    payload: bytes
    #: the record's :class:`Kind` (a SOW delete is not delivered as a publish)
    kind: int = 1
    #: the SOW key of a record of a SOW topic ("" otherwise)
    sow_key: str = ""
    #: the message type of the payload (``json``, ``fix``, ...)
    message_type: str = "json"


#: the fixed fields of a stored record, in :attr:`StoredRecords.fields` order (the
#: ``n_*`` are the byte lengths of the seven strings that follow, in this order)
STORED_FIELDS: Final = (
    "crc",
    "version",
    "kind",
    "flags",
    "txid",
    "pub_hash",
    "seq",
    "origin_txid",
    "origin_ts",
    "local_ts",
    "n_client_name",
    "n_origin",
    "n_topic",
    "n_message_type",
    "n_sow_key",
    "n_correlation_id",
    "n_path",
)
#: bytes of the fixed fields: the first string starts here
FIXED_SIZE: Final = _FIXED_SIZE
#: the ``flags`` bit of a zstd-compressed stored payload (never set on a decoded Record)
ZSTD_FLAG: Final = _ZSTD


def check_stored(value: bytes, txid: int) -> None:
    """Check a stored record as every read does (length, CRC, format version, txid)
    without decoding it.

    Raises:
        CorruptRecord: naming what is wrong.
    """
    _checked_header(value, txid)


class StoredRecords(NamedTuple):
    """Stored records, checked, for readers that decode the stored format themselves
    (the Spark pipeline builds Arrow columns from many at once): the fixed fields of
    each (named by :data:`STORED_FIELDS`) and its stored value, in the same order."""

    fields: list[tuple[int, ...]]
    values: list[bytes]


def check_stored_records(pairs: list[tuple[int, bytes]]) -> StoredRecords:
    """The checks of :func:`check_stored` on every ``(txid, stored value)`` of
    ``pairs``, in one pass that keeps the fixed fields.

    Raises:
        CorruptRecord: the first record that fails, naming its txid and the problem.
    """
    unpack = _FIXED.unpack_from
    crc32 = zlib.crc32
    fields: list[tuple[int, ...]] = []
    values: list[bytes] = []
    for txid, value in pairs:
        try:
            f = unpack(value)
        except struct.error:
            _checked_header(value, txid)  # raises: truncated
            raise
        if (
            crc32(value[4:]) != f[0]
            or f[1] != FORMAT_VERSION
            or f[4] != txid
            or _FIXED_SIZE + f[10] + f[11] + f[12] + f[13] + f[14] + f[15] + f[16] > len(value)
        ):
            _checked_header(value, txid)  # raises, naming the problem
        fields.append(f)
        values.append(value)
    return StoredRecords(fields, values)


def stored_payload(value: bytes, payload_at: int, flags: int, txid: int) -> bytes:
    """The payload of a checked stored record (decompressed when ``flags`` says so).

    Raises:
        CorruptRecord: a compressed payload does not decompress.
    """
    return _CODEC_FOR_PAYLOADS._payload(value, payload_at, flags, txid)


def _checked_header(value: bytes, expected_txid: int | None) -> tuple[tuple[int, ...], int]:
    """The fixed fields of a stored record and where its payload starts, after checking
    length, CRC, format version and txid.

    Raises:
        CorruptRecord: naming what is wrong.
    """
    if len(value) < _FIXED_SIZE:
        raise CorruptRecord(expected_txid, f"value of {len(value)} bytes is truncated")
    fields = _FIXED.unpack_from(value)
    if zlib.crc32(memoryview(value)[4:]) != fields[0]:
        raise CorruptRecord(expected_txid, "CRC mismatch (the stored bytes were altered)")
    if fields[1] != FORMAT_VERSION:
        raise CorruptRecord(expected_txid, f"unknown record format version {fields[1]}")
    if expected_txid is not None and fields[4] != expected_txid:
        raise CorruptRecord(expected_txid, f"record claims txid {fields[4]}")
    end = (
        _FIXED_SIZE
        + fields[10]
        + fields[11]
        + fields[12]
        + fields[13]
        + fields[14]
        + fields[15]
        + fields[16]
    )
    if end > len(value):
        raise CorruptRecord(expected_txid, "string lengths run past the end of the record")
    return fields, end


#: decompresses lazily-read replica payloads (ZstdDecompressor is stateless per call)
_CODEC_FOR_PAYLOADS: Final = RecordCodec()
