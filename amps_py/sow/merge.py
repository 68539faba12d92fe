"""``delta_publish``: merging a partial update into the stored record.

The rules (AMPS-NOTES 4.2, from the AMPS delta publish documentation):

1. a field present in the delta replaces the stored value, even when equal;
2. a field absent from the delta is unchanged (a delta cannot remove a field);
3. arrays are replaced wholesale, never merged element by element;
4. fields new to the record are appended after the stored ones.

**Our reading of an UNCONFIRMED point:** a sub-document (JSON object) in the delta is
merged into the stored sub-document field by field, at every depth, so
``{"a": {"x": 2}}`` into ``{"a": {"x": 1, "y": 1}}`` gives ``{"a": {"x": 2, "y": 1}}``.
AMPS documents that nested fields are addressed by their path and that "an update to
... the root level of a subdocument is a full replacement"; it does not spell out
whether an object in a delta replaces or merges. Merging per leaf path is the reading
that never loses a field the publisher did not mention.

When either side is not an object (the stored record or the delta is an array, a
scalar, or ``None``), the delta replaces the stored value wholesale; the same holds at
every depth where a delta object meets a stored non-object or the other way round.

Pure: no I/O, no trio.
"""

from __future__ import annotations

from typing import Any


def delta_merge(stored: Any, delta: Any) -> Any:
    """The record that results from applying ``delta`` to ``stored``.

    Args:
        stored: the stored record, parsed (usually a ``dict``).
        delta: the delta message, parsed.

    Returns:
        A new value; neither argument is modified (the result may share unchanged
        sub-values, and values taken from ``delta``, with them). Key order: the stored
        fields in their order (replaced ones keep their place), then new fields in the
        delta's order.

    Never raises and never recurses, so any nesting depth the parser accepted merges.
    """
    if type(stored) is not dict or type(delta) is not dict:
        return delta
    result = dict(stored)
    stack: list[tuple[dict[Any, Any], dict[Any, Any]]] = [(result, delta)]
    while stack:
        target, changes = stack.pop()
        for name, value in changes.items():
            old = target.get(name)
            if type(old) is dict and type(value) is dict:
                merged = dict(old)  # copy before changing: ``stored`` stays intact
                target[name] = merged
                stack.append((merged, value))
            else:
                target[name] = value
    return result
