"""The pure parts of a client session: reading a command's header
(amps_py.protocol.server.commands) and deciding a logon (amps_py.protocol.server.logon), with no
connection and no event loop."""

from __future__ import annotations

from typing import Any

import pytest

from amps_py import events, reasons
from amps_py.auth import AuthResult
from amps_py.protocol.server.commands import (
    MAX_FIELD_BYTES,
    CommandFailed,
    ack_types,
    bookmark_not_found,
    check_field_size,
    failure_acks,
    heartbeat_start,
    options,
    unsubscribe_ids,
)
from amps_py.protocol.server.logon import (
    SERVER_VERSION,
    LogonRefused,
    LogonRequest,
    check_authenticated,
    check_claimed,
    logon_ack_fields,
    read_logon,
)


# ---------------------------------------------------------------- command headers
def test_ack_types_reads_the_comma_list_and_refuses_unknown_types() -> None:
    assert ack_types({}) == frozenset()
    assert ack_types({"a": " processed , persisted,"}) == {"processed", "persisted"}
    with pytest.raises(CommandFailed) as caught:
        ack_types({"a": "processed,bogus"})
    assert caught.value.reason == reasons.INVALID_OPTIONS
    assert "bogus" in caught.value.detail and "received, processed" in caught.value.detail


def test_options_keep_flags_and_values() -> None:
    assert options({}) == {}
    assert options({"o": "replace, bookmark_not_found=epoch ,,x= 1"}) == {
        "replace": "",
        "bookmark_not_found": "epoch",
        "x": "1",
    }


def test_field_size_limit_is_in_utf8_bytes() -> None:
    check_field_size("t" * MAX_FIELD_BYTES, "topic", reasons.INVALID_TOPIC)
    # fewer characters than the limit, more bytes: refused, naming field and limit
    with pytest.raises(CommandFailed) as caught:
        check_field_size("é" * (MAX_FIELD_BYTES // 2 + 1), "topic", reasons.INVALID_TOPIC)
    assert caught.value.reason == reasons.INVALID_TOPIC
    assert "topic is 65536 bytes; the limit is 65535" in caught.value.detail


def test_a_refused_command_gets_a_failure_ack_in_every_type_it_asked_for() -> None:
    exc = CommandFailed(reasons.NOT_ENTITLED, "user 'u' may not publish")
    header = {"a": "completed,received,processed", "s": 7}
    acks = failure_acks(header, exc)
    assert [kind for kind, _ in acks] == ["received", "processed", "completed"]
    assert acks[0][1] == {"reason": reasons.NOT_ENTITLED, "detail": exc.detail, "s": 7}


def test_a_refused_command_that_asked_for_no_ack_or_a_bad_one_gets_processed() -> None:
    exc = CommandFailed(reasons.NO_TOPIC)
    assert failure_acks({}, exc) == [("processed", {"reason": reasons.NO_TOPIC})]
    assert failure_acks({"a": "bogus"}, exc) == [("processed", {"reason": reasons.NO_TOPIC})]


@pytest.mark.parametrize(
    ("o", "interval"), [("", None), ("stop", None), ("start", 30.0), ("start,2.5", 2.5)]
)
def test_heartbeat_start(o: str, interval: float | None) -> None:
    assert heartbeat_start({"o": o}) == interval


@pytest.mark.parametrize("o", ["start,x", "start,0", "start,-1"])
def test_heartbeat_start_refuses_a_bad_interval(o: str) -> None:
    with pytest.raises(CommandFailed) as caught:
        heartbeat_start({"o": o})
    assert caught.value.reason == reasons.INVALID_OPTIONS


def test_unsubscribe_names_ids_or_all() -> None:
    assert unsubscribe_ids({"sub_id": "a, b"}) == ("a, b", ["a", "b"])
    assert unsubscribe_ids({"query_id": "q"}) == ("q", ["q"])
    assert unsubscribe_ids({"sub_id": " all "}) == (" all ", None)
    with pytest.raises(CommandFailed, match="unsubscribe needs sub_id"):
        unsubscribe_ids({})


def test_bookmark_not_found_option() -> None:
    assert bookmark_not_found({}) == "now"
    assert bookmark_not_found({"o": "bookmark_not_found=epoch"}) == "epoch"
    with pytest.raises(CommandFailed) as caught:
        bookmark_not_found({"o": "bookmark_not_found=later"})
    assert caught.value.reason == reasons.INVALID_OPTIONS


# ---------------------------------------------------------------- logon
def test_read_logon_defaults_the_user_to_the_client_name() -> None:
    request = read_logon({"client_name": " pub ", "pw": "secret", "v": "5.3"}, journaled=True)
    assert request == LogonRequest(name="pub", user="pub", password="secret", version="5.3")
    assert "secret" not in repr(request)  # never logged
    other = read_logon(
        {"client_name": "pub", "user_id": "alice", "version": "x" * 300}, journaled=False
    )
    assert other.user == "alice" and other.version == "x" * 200


def test_a_journaled_instance_refuses_a_logon_without_a_name() -> None:
    assert read_logon({}, journaled=False).name == ""
    with pytest.raises(LogonRefused) as caught:
        read_logon({}, journaled=True)
    refused = caught.value
    assert (refused.reason, refused.disconnect) == (reasons.AUTH_FAILURE, reasons.AUTH)
    assert "needs a client_name" in refused.detail and refused.message == ""


def test_a_client_name_the_journal_cannot_store_is_refused() -> None:
    with pytest.raises(LogonRefused) as caught:
        read_logon({"client_name": "n" * (MAX_FIELD_BYTES + 1)}, journaled=False)
    assert caught.value.reason == caught.value.disconnect == reasons.INVALID_CLIENT_NAME
    assert "client name is 65536 bytes" in caught.value.detail


def test_wrong_credentials_are_refused_without_saying_which() -> None:
    request = LogonRequest("pub", "alice", "wrong", "")
    check_authenticated(request, True, "")
    with pytest.raises(LogonRefused) as caught:
        check_authenticated(request, False, "unknown user or wrong password")
    refused = caught.value
    assert (refused.reason, refused.disconnect) == (reasons.AUTH_FAILURE, reasons.AUTH)
    assert refused.detail == "unknown user or wrong password"
    # the auth gate logs the failure (rate-limited), so the refusal carries no line
    assert refused.message == ""
    with pytest.raises(LogonRefused) as caught:
        check_authenticated(request, False, "too many failed logons for user 'alice'; retry in 2 s")
    assert caught.value.detail.endswith("retry in 2 s")


def test_a_name_in_use_is_refused_in_the_instances_words() -> None:
    request = LogonRequest("pub", "pub", "", "")
    check_claimed(request, "", "peer")
    with pytest.raises(LogonRefused) as caught:
        check_claimed(request, "client name 'pub' is in use by user 'x'", "peer")
    refused = caught.value
    assert refused.reason == refused.disconnect == reasons.NAME_IN_USE
    assert refused.detail == "client name 'pub' is in use by user 'x'"
    assert refused.event == events.CLIENT_LOGON_FAILED


def test_logon_ack_names_the_last_seq_held_as_seq_and_bookmark() -> None:
    request = LogonRequest("pub", "pub", "", "")
    fields: dict[str, Any] = logon_ack_fields(request, AuthResult(True), 42, 9)
    assert list(fields) == ["client_name", "s", "bm", "version"]
    assert fields == {"client_name": "pub", "s": 9, "bm": "42|9|", "version": SERVER_VERSION}
    with_reason = logon_ack_fields(request, AuthResult(True, "authentication disabled"), 0, 0)
    assert list(with_reason)[:2] == ["client_name", "reason"]
    assert with_reason["reason"] == "authentication disabled"
