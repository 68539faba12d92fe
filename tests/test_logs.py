"""amps_py.logs: AMPS line format, level and code filters, %n rotation with no lost line."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from amps_py.config import LogTarget, parse_config
from amps_py.logs import (
    DEFAULT_CODE,
    configure_logging,
    expand_file_name,
    level_name,
    level_number,
    log_event,
    reset_logging,
)

LINE = re.compile(
    r"(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}[+-]\d\d:\d\d) "
    r"\[(?P<thread>[^\]]+)\] (?P<level>[a-z]+): (?P<code>[0-9A-Za-z]{2}-[0-9A-Za-z]{4}) "
    r"(?P<text>.*)"
)

log = logging.getLogger("amps_py.tests.logs")


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    reset_logging()


def file_target(path: Path, **options: object) -> LogTarget:
    return LogTarget(protocol="file", file_name=str(path), **options)  # type: ignore[arg-type]


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def texts(path: Path) -> list[str]:
    """The (code, text) part of each line, checking the line shape on the way."""
    result = []
    for line in lines_of(path):
        match = LINE.fullmatch(line)
        assert match, f"not an AMPS log line: {line!r}"
        result.append(f"{match['level']}: {match['code']} {match['text']}")
    return result


# ---------------------------------------------------------------------------- format


def test_line_format_with_code_and_fields(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="info")], "amps-1")
    log_event(log, "info", "11-0001", "listening", transport="json-tcp", port=9007)
    (line,) = lines_of(out)
    match = LINE.fullmatch(line)
    assert match, line
    assert match["thread"] == "MainThread"
    assert match["level"] == "info"
    assert match["code"] == "11-0001"
    assert match["text"] == "listening transport=json-tcp port=9007"


def test_timestamp_is_local_iso8601_with_microseconds_and_offset(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out)], "amps-1")
    before = time.time()
    log.info("tick")
    after = time.time()
    match = LINE.fullmatch(lines_of(out)[0])
    assert match
    from datetime import datetime

    stamp = datetime.fromisoformat(match["stamp"]).timestamp()
    assert before - 1e-6 <= stamp <= after + 1e-6


def test_records_without_a_code_show_the_default(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="info")], "amps-1")
    log.warning("disk %d%% full", 91)
    log.info("plain", extra={"code": "1D-0002"})
    assert texts(out) == [f"warning: {DEFAULT_CODE} disk 91% full", "info: 1D-0002 plain"]


def test_the_journal_librarys_lines_go_to_the_configured_targets(tmp_path: Path) -> None:
    """txlog logs under its own name (the journal recovering after a crash); without
    this its lines went to Python's last-resort stderr print: no stamp, level or code."""
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="info")], "amps-1")
    logging.getLogger("txlog.journal").warning("journal j: 3 records recovered")
    assert texts(out) == [f"warning: {DEFAULT_CODE} journal j: 3 records recovered"]
    reset_logging()
    assert logging.getLogger("txlog").propagate and not logging.getLogger("txlog").handlers


def test_field_values_with_spaces_are_quoted(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out)], "amps-1")
    log_event(log, "error", "07-0001", "client refused", reason='bad "creds"', user="a b")
    assert texts(out) == ['error: 07-0001 client refused reason="bad \\"creds\\"" user="a b"']


def test_exception_stays_with_its_line(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out)], "amps-1")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("it failed", extra={"code": "01-0001"})
    content = out.read_text()
    assert LINE.match(content)
    assert "error: 01-0001 it failed\nTraceback" in content
    assert content.rstrip().endswith("RuntimeError: boom")


def test_stdout_and_stderr_targets(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging([LogTarget("stdout", "info"), LogTarget("stderr", "error")], "amps-1")
    log.info("to stdout only")
    log.error("to both")
    captured = capsys.readouterr()
    assert [LINE.fullmatch(line)["text"] for line in captured.out.splitlines()] == [  # type: ignore[index]
        "to stdout only",
        "to both",
    ]
    assert [LINE.fullmatch(line)["text"] for line in captured.err.splitlines()] == [  # type: ignore[index]
        "to both"
    ]


# --------------------------------------------------------------------------- levels


def test_amps_levels_map_to_python_levels() -> None:
    assert level_number("developer") < level_number("trace") == logging.DEBUG
    assert level_number("trace") < level_number("stats") < level_number("info") == logging.INFO
    assert level_number("emergency") > level_number("critical") == logging.CRITICAL
    assert level_name(logging.DEBUG) == "trace"
    assert level_name(logging.WARNING) == "warning"
    assert level_name(25) == "info"  # between levels: the one below
    assert level_name(1) == "developer"
    assert level_name(100) == "emergency"


def test_level_threshold(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="warning")], "amps-1")
    for level in ("developer", "trace", "stats", "info", "warning", "error", "critical"):
        log_event(log, level, "00-0001", level)
    log_event(log, "emergency", "00-0001", "emergency")
    assert [t.split(": ", 1)[0] for t in texts(out)] == [
        "warning",
        "error",
        "critical",
        "emergency",
    ]


def test_developer_level_is_written_when_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="developer")], "amps-1")
    log_event(log, "developer", "00-0001", "internals")
    log.debug("python debug is trace")
    assert texts(out) == ["developer: 00-0001 internals", "trace: 00-0000 python debug is trace"]


def test_levels_list_selects_individual_levels(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="none", levels=("trace", "error"))], "amps-1")
    for level in ("trace", "stats", "info", "warning", "error", "critical"):
        log_event(log, level, "00-0001", level)
    assert texts(out) == ["trace: 00-0001 trace", "error: 00-0001 error"]


def test_level_none_logs_nothing(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="none")], "amps-1")
    log.critical("nothing")
    assert out.read_text() == ""


# ------------------------------------------------------------------ include / exclude


def test_include_errors_logs_codes_below_the_level(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="error", include_errors="00-0002, 12-1.*")], "amps-1")
    log_event(log, "info", "00-0002", "included exactly")
    log_event(log, "info", "00-0003", "not included")
    log_event(log, "trace", "12-1234", "included by regex")
    log_event(log, "trace", "12-2000", "regex is anchored")
    log.debug("regex is anchored at the start too", extra={"code": "012-1000"})
    log_event(log, "error", "00-0009", "at the level")
    assert texts(out) == [
        "info: 00-0002 included exactly",
        "trace: 12-1234 included by regex",
        "error: 00-0009 at the level",
    ]


def test_exclude_errors_wins(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging(
        [
            file_target(
                out,
                level="info",
                include_errors="12-.*,00-0001",
                exclude_errors="00-0001,12-1.*",
            )
        ],
        "amps-1",
    )
    log_event(log, "error", "00-0001", "excluded though included and above the level")
    log_event(log, "trace", "12-1000", "excluded by regex")
    log_event(log, "trace", "12-2000", "included")
    log_event(log, "info", "00-0002", "at the level")
    assert texts(out) == ["trace: 12-2000 included", "info: 00-0002 at the level"]


def test_code_matching_ignores_case(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    configure_logging([file_target(out, level="none", include_errors="0a-.*,FF-0001")], "amps-1")
    log_event(log, "info", "0A-0001", "hex category")
    log_event(log, "info", "ff-0001", "lower case")
    assert texts(out) == ["info: 0A-0001 hex category", "info: ff-0001 lower case"]


# -------------------------------------------------------------------------- rotation


def test_expand_file_name() -> None:
    now = time.mktime((2024, 2, 23, 12, 59, 58, 0, 0, -1))
    assert expand_file_name("logs/%Y-%m-%dT%H:%M:%S-%n.log", 3, now) == (
        "logs/2024-02-23T12:59:58-00003.log"
    )
    assert expand_file_name("a-%n-%%n.log", 0, now) == "a-00000-%n.log"
    assert expand_file_name("plain.log", 7, now) == "plain.log"


def test_rotation_by_size_names_files_in_order_and_loses_no_line(tmp_path: Path) -> None:
    threshold = 1000
    mask = tmp_path / "logs" / "amps-%n.log"
    configure_logging([file_target(mask, level="info", rotation_threshold=threshold)], "a")
    expected = [f"info: 00-0042 message {i:04d} {'x' * (i % 37)}" for i in range(300)]
    for i in range(300):
        log_event(log, "info", "00-0042", f"message {i:04d} {'x' * (i % 37)}")
    reset_logging()  # closes the file

    files = sorted((tmp_path / "logs").iterdir())
    names = [f.name for f in files]
    assert names == [f"amps-{n:05d}.log" for n in range(len(files))]
    assert len(files) > 5
    for f in files:
        assert 0 < f.stat().st_size <= threshold
        assert f.read_bytes().endswith(b"\n")  # no line is split across files
    written = [text for f in files for text in texts(f)]
    assert written == expected  # every line, once, in order


def test_a_line_longer_than_the_threshold_is_written_whole(tmp_path: Path) -> None:
    mask = tmp_path / "amps-%n.log"
    configure_logging([file_target(mask, rotation_threshold=100)], "a")
    log.info("short")
    log.info("y" * 300)
    log.info("after")
    reset_logging()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["amps-00000.log", "amps-00001.log", "amps-00002.log"]
    assert [texts(tmp_path / n) for n in names] == [
        ["info: 00-0000 short"],
        ["info: 00-0000 " + "y" * 300],
        ["info: 00-0000 after"],
    ]


def test_restart_continues_after_the_last_file(tmp_path: Path) -> None:
    mask = tmp_path / "amps-%n.log"
    target = file_target(mask, rotation_threshold=200)
    configure_logging([target], "a")
    for i in range(6):
        log.info("first run %d", i)
    reset_logging()
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}

    configure_logging([target], "a")  # a restart: nothing is truncated
    log.info("second run")
    reset_logging()
    after = {p.name: p.read_text() for p in tmp_path.iterdir()}
    for name, content in before.items():
        assert after[name].startswith(content)
    everything = [t for name in sorted(after) for t in texts(tmp_path / name)]
    assert everything == [f"info: 00-0000 first run {i}" for i in range(6)] + [
        "info: 00-0000 second run"
    ]


def test_file_name_without_counter_appends(tmp_path: Path) -> None:
    out = tmp_path / "amps.log"
    out.write_text("existing line\n")
    configure_logging([file_target(out)], "a")
    log.info("new line")
    reset_logging()
    lines = lines_of(out)
    assert lines[0] == "existing line"
    assert lines[1].endswith("info: 00-0000 new line")


# ---------------------------------------------------------------------- configuration


def test_configure_twice_replaces_the_handlers(tmp_path: Path) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    configure_logging([file_target(first)], "a")
    log.info("one")
    configure_logging([file_target(second)], "a")
    log.info("two")
    assert texts(first) == ["info: 00-0000 one"]
    assert texts(second) == ["info: 00-0000 two"]
    assert len(logging.getLogger("amps_py").handlers) == 1


def test_no_targets_logs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging([], "a")
    log.critical("should go nowhere")
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_a_file_that_cannot_be_opened_keeps_the_old_configuration(tmp_path: Path) -> None:
    good = tmp_path / "good.log"
    configure_logging([file_target(good)], "a")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(OSError):
        configure_logging([LogTarget("stdout"), file_target(blocker / "x.log")], "a")
    log.info("still here")
    assert texts(good) == ["info: 00-0000 still here"]


def test_records_carry_the_instance_name(tmp_path: Path) -> None:
    seen: list[str] = []

    class Spy(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(getattr(record, "instance", "?"))

    configure_logging([file_target(tmp_path / "a.log")], "amps-7")
    spy = Spy()
    logging.getLogger("amps_py").addHandler(spy)
    try:
        log.info("hello")
    finally:
        logging.getLogger("amps_py").removeHandler(spy)
    assert seen == ["amps-7"]


def test_targets_from_a_config_file(tmp_path: Path) -> None:
    cfg = parse_config(
        f"""<AMPSConfig><Name>amps-1</Name><Logging><Target>
            <Protocol>file</Protocol><FileName>{tmp_path}/amps-%n.log</FileName>
            <Level>warning</Level><IncludeErrors>00-0015</IncludeErrors>
        </Target></Logging></AMPSConfig>""",
        environ={},
    )
    configure_logging(cfg.logging, cfg.name)
    log_event(log, "info", "00-0015", "started")
    log_event(log, "info", "00-0016", "filtered out")
    assert texts(tmp_path / "amps-00000.log") == ["info: 00-0015 started"]


def test_log_event_rejects_bad_level_and_code() -> None:
    with pytest.raises(ValueError, match="'warn' is not an AMPS log level; use one of: "):
        log_event(log, "warn", "00-0001", "x")
    with pytest.raises(ValueError, match="must have the form CC-NNNN"):
        log_event(log, "info", "1-1", "x")


def test_restart_skips_a_full_last_file(tmp_path: Path) -> None:
    (tmp_path / "amps-00000.log").write_text("a" * 99 + "\n")
    (tmp_path / "amps-00001.log").write_text("b" * 199 + "\n")  # at the threshold: full
    configure_logging([file_target(tmp_path / "amps-%n.log", rotation_threshold=200)], "a")
    log.info("resumed")
    reset_logging()
    assert texts(tmp_path / "amps-00002.log") == ["info: 00-0000 resumed"]
    assert (tmp_path / "amps-00001.log").read_text() == "b" * 199 + "\n"


def test_a_dated_file_name_starts_a_new_file_each_day_and_loses_no_line(tmp_path: Path) -> None:
    """FileName ``amps-%Y%m%d-%n.log``: lines go to the file of their own day (as the
    record's time spells it), the counter starts again each day, and a size threshold
    still rotates within a day."""
    mask = tmp_path / "amps-%Y%m%d-%n.log"
    configure_logging([file_target(mask, level="info", rotation_threshold=400)], "a")
    day1 = time.mktime((2026, 3, 1, 23, 59, 0, 0, 0, -1))
    day2 = time.mktime((2026, 3, 2, 0, 0, 1, 0, 0, -1))
    stamps = [day1] * 6 + [day2] * 6
    for i, stamp in enumerate(stamps):
        record = log.makeRecord(
            log.name,
            logging.INFO,
            __file__,
            0,
            f"line {i:02d}",
            (),
            None,
            extra={"code": "00-0042"},
        )
        record.created = stamp
        log.handle(record)
    reset_logging()
    # (the file opened at configuration time, for today, stays empty)
    names = sorted(p.name for p in tmp_path.iterdir() if p.stat().st_size)
    assert names[0].startswith("amps-20260301-00000") and names[-1].startswith("amps-20260302-")
    assert "amps-20260302-00000.log" in names
    by_day = {
        day: [t for n in names if day in n for t in texts(tmp_path / n)]
        for day in ("20260301", "20260302")
    }
    assert by_day["20260301"] == [f"info: 00-0042 line {i:02d}" for i in range(6)]
    assert by_day["20260302"] == [f"info: 00-0042 line {i:02d}" for i in range(6, 12)]
    assert len(names) > 2  # the 400-byte threshold rotated within a day too
