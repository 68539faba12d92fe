"""Read a Parquet export back: as one pyarrow dataset, and checked against its
manifests (:func:`verify_export`)."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .export_layout import (
    CUMULATIVE_MANIFEST,
    MANIFEST_DIR,
    ZERO_CHECKSUM,
    PartFile,
    add_checksums,
    decode_name,
    encode_name,
    manifest_directory,
    parse_date_directory,
    parse_part_name,
    temporary_name,
)
from .export_manifest import ExportedFile, ExportError, Manifest, rows_sha256
from .schema import ARROW_SCHEMA

if TYPE_CHECKING:
    import pyarrow.dataset as ds


def exported_dataset(out_dir: str | os.PathLike[str]) -> ds.Dataset:
    """Every exported file in ``out_dir`` as one pyarrow dataset: the schema's columns
    and ``date`` (from the directory) as a date. Manifests and files not published yet
    are not part of it."""
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("date", pa.date32())]), flavor="hive")
    schema = ARROW_SCHEMA.append(pa.field("date", pa.date32()))
    return ds.dataset(out_dir, schema=schema, format="parquet", partitioning=partitioning)


def verify_export(out_dir: str | os.PathLike[str], instance: str | None = None) -> list[str]:
    """Re-read the export of ``instance`` (default: every instance) in ``out_dir`` and
    check it against its manifest. Returns the problems found, each naming the file
    and what is wrong; empty when the export is whole.

    Checks: every file listed is published with its size and SHA-256; its rows, txid
    range, topic count and row checksum match; its rows are of that instance and date,
    in topic and txid order; no txid is in two files; the row checksums add up to the
    manifest's; and no data file of the instance is missing from the manifest (a
    reader would count its rows too).
    """
    out = Path(out_dir)
    base = out / MANIFEST_DIR
    if instance is not None:
        names = [encode_name(instance)]
    else:
        names = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    if not names:
        return [f"{out} holds no export manifest (in {MANIFEST_DIR}/)"]
    problems: list[str] = []
    for encoded in names:
        problems += _verify_instance(out, decode_name(encoded))
    return problems


def _verify_instance(out: Path, instance: str) -> list[str]:
    path = out / manifest_directory(instance) / CUMULATIVE_MANIFEST
    if not path.exists():
        return [f"{path}: no manifest of instance {instance!r}"]
    try:
        manifest = Manifest.load(path, instance)
    except ExportError as exc:
        return [str(exc)]
    problems: list[str] = []
    seen: set[int] = set()
    rows = 0
    checksum = ZERO_CHECKSUM
    for f in manifest.files:
        problems += _verify_file(out, instance, f, seen)
        rows += f.rows
        checksum = add_checksums(checksum, f.rows_sha256)
    if rows != manifest.rows:
        problems.append(f"{path}: its files hold {rows} rows, it says {manifest.rows}")
    if checksum != manifest.rows_checksum:
        problems.append(f"{path}: its files' row checksums do not add up to rows_checksum")
    listed = {f.path for f in manifest.files}
    for stray, part in instance_files(out, instance):
        if not part.temporary and str(stray) not in listed:
            problems.append(
                f"{stray}: a file of instance {instance!r} that the manifest does not list "
                "(copied in, or written by something else; an export publishes only "
                "files it listed): readers count its rows too; remove it"
            )
    return problems


def _verify_file(out: Path, instance: str, f: ExportedFile, seen: set[int]) -> list[str]:
    path = out / f.path
    try:
        data = path.read_bytes()
    except OSError as exc:
        if path.with_name(temporary_name(path.name)).exists():
            return [
                f"{f.path}: committed, not published yet (an export was killed before "
                "renaming it): readers miss its rows; the next export of the instance "
                "publishes it"
            ]
        return [f"{f.path}: cannot be read ({exc.strerror or exc})"]
    if len(data) != f.bytes or hashlib.sha256(data).hexdigest() != f.sha256:
        return [f"{f.path}: its bytes are not those written (size or SHA-256 differs)"]
    table = pq.read_table(pa.BufferReader(data))
    problems: list[str] = []
    txids = table.column("txid").to_pylist()
    topics = table.column("topic").to_pylist()
    if len(txids) != f.rows or rows_sha256(table) != f.rows_sha256:
        problems.append(f"{f.path}: its rows are not those the manifest lists")
    if txids and (min(txids) != f.first_txid or max(txids) != f.last_txid):
        problems.append(f"{f.path}: its txids are not {f.first_txid}..{f.last_txid}")
    if any(b <= a for a, b in itertools.pairwise(zip(topics, txids, strict=True))):
        problems.append(f"{f.path}: its rows are not in topic and txid order")
    if len(set(topics)) != f.topics:
        problems.append(f"{f.path}: its rows are of {len(set(topics))} topics, not {f.topics}")
    twice = seen.intersection(txids)
    if twice:
        problems.append(f"{f.path}: txid(s) {sorted(twice)[:5]} are also in another file")
    seen.update(txids)
    if set(table.column("instance").to_pylist()) - {instance}:
        problems.append(f"{f.path}: a row's instance is not {instance!r}")
    days = pc.cast(table.column("local_ts"), pa.date32()).to_pylist()
    if {d.isoformat() for d in days} - {f.date}:
        problems.append(f"{f.path}: a row's local_ts is not on {f.date}")
    return problems


def instance_files(out: Path, instance: str) -> Iterator[tuple[Path, PartFile]]:
    """The files of ``instance`` in ``out`` (published files and ones not published
    yet), each with its path relative to ``out`` and what its name says."""
    for day_dir in subdirectories(out, "date="):
        if parse_date_directory(day_dir.name) is None:
            continue
        for entry in os.scandir(day_dir):
            part = parse_part_name(entry.name)
            if part is not None and part.instance == instance:
                yield Path(entry.path).relative_to(out), part


def subdirectories(path: Path, prefix: str) -> list[Path]:
    """``path``'s subdirectories whose names start with ``prefix`` (none if ``path``
    does not exist)."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.name.startswith(prefix) and e.is_dir()]
