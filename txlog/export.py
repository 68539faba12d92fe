"""Write one journal segment's file in a process of its own.

The server runs this as ``python -m txlog.export`` for compress and archive, so reading
the segment back, checking every CRC and compressing it uses another core instead of
competing with the event loop for the GIL (LMDB serves readers in other processes).

    python -m txlog.export JOURNAL_DIR SEGMENT_ID compressed|archived [ARCHIVE_DIR]

Prints the file's path on success. On failure prints the reason on stderr and exits 1
(a damaged record: nothing is written; no archive directory: say how to configure it).
"""

from __future__ import annotations

import sys

from .errors import JournalError
from .journal import Journal
from .record import CorruptRecord


def main(argv: list[str]) -> int:
    if len(argv) not in (3, 4) or argv[2] not in ("compressed", "archived"):
        print(__doc__, file=sys.stderr)
        return 2
    path, seg_id, state = argv[0], int(argv[1]), argv[2]
    archive = argv[3] if len(argv) == 4 else None
    try:
        with Journal(path, readonly=True, archive_directory=archive) as journal:
            seg = next((s for s in journal.segments() if s.id == seg_id), None)
            if seg is None:
                raise JournalError(f"there is no journal segment {seg_id} in {path}")
            print(journal.write_segment_file(seg, state))
    except (JournalError, CorruptRecord, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
