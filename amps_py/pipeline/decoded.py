"""A message body as JSON text, whatever its message type: the ``decoded`` column.

The journal columns (:data:`.schema.ARROW_SCHEMA`) carry the body as stored
(``payload``) and, for the text types, as text (``payload_text``). A FIX, NVFIX, XML,
BSON or msgpack body is not something a query can look into; :func:`decoded_texts`
gives every body the one document form the server's filters use
(:mod:`amps_py.message_types`), as JSON text, so Spark's JSON functions query every
type alike::

    from amps_py.pipeline import with_decoded
    df = with_decoded(spark.read.format("amps_txlog").load("./amps-data"))
    df.where("message_type = 'fix'").selectExpr("get_json_object(decoded, \"$['55']\")")

What ``decoded`` holds, per ``message_type``:

- ``json``: the body as it is, when it is valid JSON (not rewritten);
- ``fix``, ``nvfix`` (default separators), ``xml``, ``bson``, ``msgpack``: the
  message's fields as JSON, as ``amps-py txlog dump`` prints them (FIX tags and NVFIX
  names as keys, values as strings; XML elements and ``@attributes`` as nested keys;
  BSON and msgpack documents as they are, with bytes as text (invalid UTF-8
  replaced), BSON dates as epoch milliseconds, ObjectIds as hex, keys as strings);
- null: a body that does not parse as its type, ``binary``, and any type amps-py
  does not decode (bflat, protobuf, a custom name from a config).

It is computed when read, not stored: exports hold the journal columns only, and
:func:`with_decoded` adds the column to a DataFrame of either source. The
conversion runs in Python, a row at a time for the non-JSON types (their parsers),
so select the rows you need first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import orjson
import pyarrow as pa

from amps_py.message_types import default_types

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: the name of the column :func:`with_decoded` adds
DECODED_COLUMN: Final = "decoded"
#: the columns it reads
NEEDS: Final = ("payload", "message_type")
#: the types it decodes (built once, not per row)
_TYPES: Final = default_types()


def decode_body(message_type: str | None, body: bytes | None) -> str | None:
    """``body`` of ``message_type`` as JSON text, or None (see the module's list)."""
    if body is None or message_type is None:
        return None
    if message_type == "json":
        try:
            orjson.loads(body)
            return body.decode()
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            return None
    reader = _TYPES.get(message_type)
    if reader is None or message_type == "binary":
        return None
    try:
        document = reader.to_jsonable(body)
    except Exception:  # a parser's own error on a malformed body: nothing decoded
        return None
    if document is None:
        return None
    return orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS).decode()


def decoded_texts(payload: pa.Array, message_type: pa.Array) -> pa.Array:
    """The ``decoded`` column for these ``payload`` and ``message_type`` columns
    (equal lengths): a string array, null where nothing decodes."""
    return pa.array(
        [
            decode_body(mtype, body)
            for mtype, body in zip(message_type.to_pylist(), payload.to_pylist(), strict=True)
        ],
        pa.string(),
    )


def add_decoded(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with the ``decoded`` column appended."""
    column = decoded_texts(batch.column("payload"), batch.column("message_type"))
    return pa.RecordBatch.from_arrays(
        [*batch.columns, column], names=[*batch.schema.names, DECODED_COLUMN]
    )


def with_decoded(df: DataFrame) -> DataFrame:
    """``df`` (journal rows: the ``amps_txlog`` source, an export, or a selection of
    them that kept ``payload`` and ``message_type``) with a ``decoded`` string column
    added last.

    Raises:
        ValueError: ``df`` lacks one of those two columns, or already has ``decoded``.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    missing = [name for name in NEEDS if name not in df.columns]
    if missing:
        raise ValueError(
            f"with_decoded needs the columns {', '.join(NEEDS)}; this DataFrame lacks "
            f"{', '.join(missing)} (select them too, or add decoded before selecting)"
        )
    if DECODED_COLUMN in df.columns:
        raise ValueError("this DataFrame already has a decoded column")
    # a plain Python UDF: Spark's Arrow-batched ones need pandas, not a dependency here
    decode = F.udf(decode_body, StringType(), useArrow=False)
    return df.withColumn(DECODED_COLUMN, decode(F.col("message_type"), F.col("payload")))
