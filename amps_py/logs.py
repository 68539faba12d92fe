"""AMPS-style logging for the ``amps_py`` logger tree.

:func:`configure_logging` turns the ``Logging/Target`` elements of a configuration
(:class:`amps_py.config.LogTarget`) into handlers on the ``amps_py`` logger, so that every
module logs with the standard library (``logging.getLogger(__name__)``) and the operator's
config decides what goes where. Lines look like AMPS's::

    2024-05-01T14:49:38.344251+02:00 [MainThread] info: 00-0015 instance started

that is ``<local ISO-8601 time, microseconds, UTC offset> [<thread name>] <level>:
<event code> <text>``. The event code (``CC-NNNN``) is passed as
``extra={"code": "CC-NNNN"}`` or through :func:`log_event`; records without one show
``00-0000``.

AMPS levels map onto Python levels so that ``logger.info`` and friends keep working:

=========  ============  =========  ==============
AMPS       Python        AMPS       Python
=========  ============  =========  ==============
developer  5             warning    30 (WARNING)
trace      10 (DEBUG)    error      40 (ERROR)
stats      15            critical   50 (CRITICAL)
info       20 (INFO)     emergency  60
=========  ============  =========  ==============

Per target, a record is written when its code matches ``ExcludeErrors``: never;
otherwise when its code matches ``IncludeErrors``, or its level is at or above
``Level``, or its level is listed in ``Levels``. Nothing is logged unless a target is
configured (the ``amps_py`` logger does not propagate to the root logger once
configured).

File targets expand strftime tokens in ``FileName`` when a file is opened and replace
``%n`` with a rotation counter that starts at ``00000``. With a ``RotationThreshold`` a
line that would take the current file past the threshold starts the next ``%n`` file
instead: every line is written whole to exactly one file and none is lost. Files are
opened for appending, so a restart never truncates an earlier log.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Final

from amps_py.config import LogTarget
from amps_py.redact import MAX_FIELD_CHARS, MAX_LINE_CHARS, cut, redact_uris, shown

__all__ = [
    "DEFAULT_CODE",
    "LEVELS",
    "configure_logging",
    "expand_file_name",
    "level_name",
    "level_number",
    "log_event",
    "reset_logging",
]

#: The logger whose tree configure_logging controls.
ROOT_LOGGER: Final = "amps_py"
#: the loggers the configured targets receive: the server's, and the journal
#: library's (txlog logs under its own name, as a library does)
LOGGERS: Final = (ROOT_LOGGER, "txlog")
#: The event code shown for records that do not carry one.
DEFAULT_CODE: Final = "00-0000"

#: AMPS level name -> Python logging level number (``none`` is not a level).
LEVELS: Final[Mapping[str, int]] = {
    "developer": 5,
    "trace": logging.DEBUG,
    "stats": 15,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "emergency": 60,
}
#: A threshold above every level: the target logs nothing by level.
_NOTHING = 1_000

_CODE = re.compile(r"[0-9A-Za-z]{2}-[0-9A-Za-z]{4}")
_REGEX_METACHARACTERS = frozenset(".^$*+?{}[]\\|()")
_FILE_TOKEN = re.compile(r"%([-_0^#]?[A-Za-z%])")
#: How many earlier %n files a file target steps over when it opens.
_MAX_SKIPPED_FILES = 100_000

for _name in ("developer", "stats", "emergency"):
    logging.addLevelName(LEVELS[_name], _name.upper())

_BY_NUMBER: Final = sorted((number, name) for name, number in LEVELS.items())


def level_number(name: str) -> int:
    """The Python level number for an AMPS level name.

    Raises:
        ValueError: ``name`` is not an AMPS level; the message lists the valid names.
    """
    try:
        return LEVELS[name]
    except KeyError:
        raise ValueError(
            f"{name!r} is not an AMPS log level; use one of: {', '.join(LEVELS)}"
        ) from None


def level_name(number: int) -> str:
    """The AMPS name for a Python level: the most severe AMPS level at or below it."""
    name = _BY_NUMBER[0][1]
    for level, candidate in _BY_NUMBER:
        if level > number:
            break
        name = candidate
    return name


# ---------------------------------------------------------------------------- formatting


#: the longest string argument of a log call shown whole, in characters
MAX_ARG_CHARS: Final = 2 * 1024
#: the longest traceback shown whole; a longer one keeps its first and last halves
MAX_TRACEBACK_CHARS: Final = 16 * 1024


def _capped_arg(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_ARG_CHARS:
        return cut(value, MAX_ARG_CHARS)
    if isinstance(value, bytes | bytearray) and len(value) > MAX_ARG_CHARS:
        return f"{bytes(value[:MAX_ARG_CHARS])!r}... [cut {len(value) - MAX_ARG_CHARS} bytes]"
    return value


def _message(record: logging.LogRecord) -> str:
    """The record's message with every string argument cut to :data:`MAX_ARG_CHARS`
    (a 1 MiB user name is shown as its first 2 KiB and how much was cut)."""
    args = record.args
    if not args:
        return record.getMessage()
    if isinstance(args, Mapping):
        capped: object = {key: _capped_arg(value) for key, value in args.items()}
    else:
        capped = tuple(_capped_arg(value) for value in args)
    try:
        return str(record.msg) % capped
    except (TypeError, ValueError):  # let logging report the bad call as it always has
        return record.getMessage()


def _middle_cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [cut {len(text) - 2 * half} chars] ...\n{text[-half:]}"


class AmpsFormatter(logging.Formatter):
    """Formats records as AMPS log lines (see the module docstring).

    What a line may show (see :mod:`amps_py.redact`): every string argument of the log
    call is cut to :data:`MAX_ARG_CHARS` characters and the message to
    :data:`~amps_py.redact.MAX_LINE_CHARS`, each cut saying how much went
    (``... [cut N chars]``); the password of any ``scheme://user:password@`` is masked;
    a traceback longer than :data:`MAX_TRACEBACK_CHARS` keeps its start and its end.
    """

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created).astimezone()
        text = cut(redact_uris(_message(record)), MAX_LINE_CHARS)
        if record.exc_info:
            trace = redact_uris(self.formatException(record.exc_info))
            text = f"{text}\n{_middle_cut(trace, MAX_TRACEBACK_CHARS)}"
        if record.stack_info:
            text = (
                f"{text}\n{_middle_cut(self.formatStack(record.stack_info), MAX_TRACEBACK_CHARS)}"
            )
        code = getattr(record, "code", DEFAULT_CODE)
        return (
            f"{stamp.isoformat(timespec='microseconds')} [{record.threadName}] "
            f"{level_name(record.levelno)}: {code} {text}"
        )


# ------------------------------------------------------------------------------- filters


class _CodeMatcher:
    """IncludeErrors/ExcludeErrors: comma-separated codes or regular expressions.

    An entry without regex metacharacters matches that code exactly; any other entry
    must match the whole code. Matching ignores case (codes are hexadecimal-ish).
    """

    def __init__(self, spec: str) -> None:
        entries = [e.strip() for e in spec.split(",") if e.strip()]
        self._exact = {e.upper() for e in entries if not (_REGEX_METACHARACTERS & set(e))}
        self._patterns = [
            re.compile(e, re.IGNORECASE) for e in entries if _REGEX_METACHARACTERS & set(e)
        ]

    def __call__(self, code: str) -> bool:
        return code.upper() in self._exact or any(p.fullmatch(code) for p in self._patterns)


class _TargetFilter(logging.Filter):
    """Decides, per record, whether one target writes it."""

    def __init__(self, target: LogTarget, instance_name: str) -> None:
        super().__init__()
        self.threshold = _NOTHING if target.level == "none" else level_number(target.level)
        self.levels = frozenset(target.levels)
        self.include = _CodeMatcher(target.include_errors) if target.include_errors else None
        self.exclude = _CodeMatcher(target.exclude_errors) if target.exclude_errors else None
        self.instance_name = instance_name

    def lowest_level(self) -> int:
        """The least severe Python level this target can ever write."""
        if self.include is not None:
            return 1
        candidates = [self.threshold, *(LEVELS[name] for name in self.levels if name in LEVELS)]
        return min(candidates)

    def filter(self, record: logging.LogRecord) -> bool:
        code = getattr(record, "code", DEFAULT_CODE)
        if self.exclude is not None and self.exclude(code):
            return False
        record.instance = self.instance_name
        if self.include is not None and self.include(code):
            return True
        return record.levelno >= self.threshold or level_name(record.levelno) in self.levels


# ------------------------------------------------------------------------------ handlers


class _ConsoleHandler(logging.Handler):
    """Writes to ``sys.stdout`` or ``sys.stderr`` as they are at emit time."""

    def __init__(self, stream_name: str) -> None:
        super().__init__()
        self.stream_name = stream_name

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            stream = sys.stdout if self.stream_name == "stdout" else sys.stderr
            stream.write(line + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def expand_file_name(mask: str, counter: int, now: float | None = None) -> str:
    """Expand a log FileName mask.

    Args:
        mask: the FileName; strftime tokens (``%Y``, ``%m``, ``%d``, ``%H``...) take the
            local time ``now``; ``%n`` becomes ``counter`` as five digits (``00000``);
            ``%%`` is a literal ``%``.
        counter: the rotation counter.
        now: seconds since the epoch; the current time when ``None``.
    """
    local = time.localtime(now)

    def token(match: re.Match[str]) -> str:
        spec = match.group(1)
        if spec == "n":
            return f"{counter:05d}"
        if spec == "%":
            return "%"
        return time.strftime(f"%{spec}", local)

    return _FILE_TOKEN.sub(token, mask)


class _RotatingFileHandler(logging.Handler):
    """A file target: strftime + ``%n`` file names, size-based rotation, whole lines.

    Resource handling: the file is opened when the handler is built (so a bad path fails
    at configuration time) and closed by :meth:`close`; rotation closes one file before
    opening the next. Every line is flushed as it is written.
    """

    def __init__(self, mask: str, threshold: int | None) -> None:
        super().__init__()
        self.mask = mask
        self.threshold = threshold
        self.counter = 0
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._size = 0
        #: the name holds time tokens: files also change with the day or hour
        self._timed = any(t not in ("n", "%") for t in _FILE_TOKEN.findall(mask))
        self._open(resume=True)

    def _open(self, *, resume: bool, now: float | None = None) -> None:
        """Open the file for the current counter; on start, resume after earlier runs.

        Resuming moves the counter to the last existing ``%n`` file (and past it when it
        is already full), so a restart appends after the previous run's lines instead
        of interleaving with them or truncating them.
        """
        if resume and "%n" in self.mask:
            for _ in range(_MAX_SKIPPED_FILES):
                if not Path(expand_file_name(self.mask, self.counter + 1, now)).exists():
                    break
                self.counter += 1
            current = Path(expand_file_name(self.mask, self.counter, now))
            if (
                self.threshold is not None
                and current.exists()
                and current.stat().st_size >= self.threshold
            ):
                self.counter += 1
        path = Path(expand_file_name(self.mask, self.counter, now))
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "ab")
        self._file = handle
        self._size = os.fstat(handle.fileno()).st_size
        self.path = path

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
            if self._timed and self.path is not None:
                # a FileName with %Y%m%d or %H starts a new file when the day or hour
                # (as the record's time spells it) changes; %n starts again from 00000
                wanted = expand_file_name(self.mask, self.counter, record.created)
                if wanted != str(self.path):
                    if self._file is not None:
                        self._file.close()
                        self._file = None
                    self.counter = 0
                    self._open(resume=True, now=record.created)
            if (
                self.threshold is not None
                and self._size > 0
                and self._size + len(data) > self.threshold
            ):
                self._rotate(record.created)
            if self._file is None:
                self._open(resume=False, now=record.created)
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
            self._size += len(data)
        except Exception:
            self.handleError(record)

    def _rotate(self, now: float | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.counter += 1
        self._open(resume=False, now=now)

    def close(self) -> None:
        self.acquire()
        try:
            if self._file is not None:
                self._file.close()
                self._file = None
        finally:
            self.release()
            super().close()


# --------------------------------------------------------------------------- configuring

_lock = threading.Lock()
_installed: list[logging.Handler] = []


def _build_handler(target: LogTarget, instance_name: str) -> tuple[logging.Handler, int]:
    target_filter = _TargetFilter(target, instance_name)
    handler: logging.Handler
    if target.protocol == "file":
        if not target.file_name:
            raise ValueError("a file log target needs a FileName")
        handler = _RotatingFileHandler(target.file_name, target.rotation_threshold)
    elif target.protocol in ("stdout", "stderr"):
        handler = _ConsoleHandler(target.protocol)
    else:
        raise ValueError(
            f"log target protocol {target.protocol!r} is not supported; use stdout, stderr or file"
        )
    handler.set_name(f"{ROOT_LOGGER}:{instance_name}:{target.protocol}")
    handler.setLevel(logging.NOTSET)
    handler.addFilter(target_filter)
    handler.setFormatter(AmpsFormatter())
    return handler, target_filter.lowest_level()


def configure_logging(targets: Sequence[LogTarget], instance_name: str) -> None:
    """Send the ``amps_py`` logger tree to ``targets``, replacing earlier targets.

    Args:
        targets: the configured log targets; an empty sequence logs nothing.
        instance_name: the instance's Name; it names the handlers and is set as
            ``record.instance`` on every record a target writes.

    Resource handling: handlers installed by an earlier call are removed and closed
    (their files too). The new files are opened before anything is replaced, so if one
    cannot be opened the earlier configuration stays in place.

    Raises:
        OSError: a log file (or its directory) cannot be created or opened; the
            message names the path.
        ValueError: a target is inconsistent (a file target without a file name, an
            unknown protocol or level); targets from ``load_config`` never are.
    """
    built: list[tuple[logging.Handler, int]] = []
    try:
        for target in targets:
            built.append(_build_handler(target, instance_name))
    except BaseException:
        for handler, _ in built:
            handler.close()
        raise
    with _lock:
        _remove_installed()
        handlers = [handler for handler, _ in built] or [logging.NullHandler()]
        for name in LOGGERS:
            logger = logging.getLogger(name)
            for handler in handlers:
                logger.addHandler(handler)
            logger.setLevel(min((lowest for _, lowest in built), default=_NOTHING))
            logger.propagate = False
        _installed.extend(handlers)


def reset_logging() -> None:
    """Undo :func:`configure_logging`: remove and close its handlers, propagate again.

    Meant for tests and for embedding amps-py in a program that logs its own way.
    """
    with _lock:
        _remove_installed()
        for name in LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(logging.NOTSET)
            logger.propagate = True


def _remove_installed() -> None:
    for handler in _installed:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(handler)
        handler.close()
    _installed.clear()


# ------------------------------------------------------------------------------- events


def _field_text(key: str, value: object) -> str:
    shown_value = shown(key, value, MAX_FIELD_CHARS)
    text = shown_value if isinstance(shown_value, str) else cut(str(shown_value))
    if text and not re.search(r"[\s=\"'\\]", text):
        return text
    return json.dumps(text, ensure_ascii=False)


def log_event(
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger],
    level: str,
    code: str,
    message: str,
    **fields: object,
) -> None:
    """Log one event with an AMPS level and event code.

    ``fields`` are appended as ``key=value`` (values with spaces or quotes are quoted
    as JSON strings) and also attached to the record as ``record.fields``. A field
    whose name is a secret's (``pw``, ``password``, ``token``...: see
    :func:`amps_py.redact.is_secret`) is shown as ``[redacted]``, in the line and in
    ``record.fields``; other values are cut to
    :data:`~amps_py.redact.MAX_FIELD_CHARS` characters.

    Example::

        log_event(log, "info", "11-0001", "listening", transport="json-tcp", port=9007)
        # ... info: 11-0001 listening transport=json-tcp port=9007

    Raises:
        ValueError: ``level`` is not an AMPS level name, or ``code`` is not of the
            form ``CC-NNNN``.
    """
    number = level_number(level)
    if not _CODE.fullmatch(code):
        raise ValueError(f"event code {code!r} must have the form CC-NNNN, e.g. 00-0001")
    if not logger.isEnabledFor(number):
        return
    text = message
    if fields:
        text += " " + " ".join(f"{key}={_field_text(key, value)}" for key, value in fields.items())
    safe = {key: shown(key, value) for key, value in fields.items()}
    logger.log(number, "%s", text, extra={"code": code, "fields": safe}, stacklevel=2)


def rotate_logs() -> int:
    """Start the next file of every rotating file target now (``amps-action-do-rotate-
    logs``); returns how many files were rotated. Targets without ``%n`` in their file
    name keep appending to the same file."""
    rotated = 0
    for handler in list(_installed):
        if isinstance(handler, _RotatingFileHandler) and "%n" in handler.mask:
            handler.acquire()
            try:
                handler._rotate()
            finally:
                handler.release()
            rotated += 1
    return rotated
