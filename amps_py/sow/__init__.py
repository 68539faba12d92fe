"""State of the World: the last-value store of SOW topics, and its pure core.

No trio anywhere in this package: the server drives it synchronously.

- ``keys``   generated SOW keys from ``Key`` paths, explicit ``k`` validation
- ``merge``  ``delta_publish`` merge of a partial update into the stored record
- ``query``  ``OrderBy`` parsing, ``select`` (filter, order, ``top_n``/``skip_n``), batches
- ``entry``  :class:`SowEntry`, one stored record
- ``layout`` the store's versioned binary value layout
- ``store``  :class:`SowStore`, one topic's records in LMDB, derived from the journal
- ``slots``  the keys of a Pattern topic's store (a record per topic and key), and
             snapshot views of one topic or of every topic a regex matches
"""

from .entry import SowEntry
from .keys import SowKeyer, SowKeyError, parse_key_paths
from .merge import delta_merge
from .query import OrderByError, OrderTerm, batches, parse_orderby, select
from .store import ApplyResult, SowSnapshot, SowStore, SowStoreError

__all__ = [
    "ApplyResult",
    "OrderByError",
    "OrderTerm",
    "SowEntry",
    "SowKeyError",
    "SowKeyer",
    "SowSnapshot",
    "SowStore",
    "SowStoreError",
    "batches",
    "delta_merge",
    "parse_key_paths",
    "parse_orderby",
    "select",
]
