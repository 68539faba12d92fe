"""The decisions around an outgoing replication connection, without a connection:
checking the welcome and the resync point (replication.handshake), the outage log
lines (replication.outage), the statistics' rates (replication.destination_stats), and
the words for a failed connect or TLS handshake (replication.dialing)."""

from __future__ import annotations

import errno
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from amps_py import events, reasons
from amps_py.config import DestinationConfig, ReplicationTopic
from amps_py.replication.destination_stats import Rates
from amps_py.replication.dialing import CONNECT_TIMEOUT, connect_failure, tls_failure_detail
from amps_py.replication.handshake import resync_point, welcome_refusal
from amps_py.replication.link import Welcome
from amps_py.replication.outage import OutageReport, duration, outage_line
from amps_py.units import utc_iso


def destination(**kw: Any) -> DestinationConfig:
    fields: dict[str, Any] = {
        "name": "B",
        "group": None,
        "sync_type": "async",
        "topics": (ReplicationTopic(None, "json"),),
        "inet_addrs": (("10.0.0.2", 9100),),
    }
    fields.update(kw)
    return DestinationConfig(**fields)


# ---------------------------------------------------------------- the welcome
def test_a_welcome_from_the_expected_group_is_taken() -> None:
    assert welcome_refusal(destination(), "A", Welcome("B", "any", 0, "")) is None
    assert welcome_refusal(destination(group="east"), "A", Welcome("B", "east", 0, "")) is None


def test_a_welcome_from_another_group_is_refused_naming_both() -> None:
    refusal = welcome_refusal(destination(group="east"), "A", Welcome("B", "west", 0, ""))
    assert refusal is not None and refusal.reason == reasons.GROUP_MISMATCH
    assert refusal.detail == (
        "destination B expects Group 'east' but instance 'B' is in Group 'west'; fix "
        "Destination/Group in A's config or the peer's Group"
    )


def test_a_destination_that_is_this_instance_is_refused() -> None:
    refusal = welcome_refusal(destination(), "A", Welcome("A", "", 0, ""))
    assert refusal is not None and refusal.reason == reasons.REPLICATES_TO_ITSELF
    assert "fix Destination/Transport/InetAddr" in refusal.detail


@dataclass
class Rec:
    bookmark: str


class StubJournal:
    """Holds txids removed_through+1 .. last_txid, each with bookmark ``bm<txid>``."""

    def __init__(self, removed_through: int, last_txid: int) -> None:
        self.removed_through = removed_through
        self.last_txid = last_txid

    def get(self, txid: int) -> Rec | None:
        if self.removed_through < txid <= self.last_txid:
            return Rec(f"bm{txid}")
        return None


def resync(cursor: int, bm: str, journal: StubJournal | None) -> int:
    return resync_point("B", Welcome("B", "", cursor, bm), cast(Any, journal))


def test_resync_resumes_at_the_peers_cursor_when_this_journal_holds_it() -> None:
    journal = StubJournal(removed_through=10, last_txid=100)
    assert resync(0, "", None) == 0  # the peer holds nothing: no journal needed
    assert resync(50, "bm50", journal) == 50


def test_resync_from_a_cursor_in_removed_journals_sends_what_is_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="amps_py.replication.outgoing"):
        assert resync(7, "bm7", StubJournal(removed_through=10, last_txid=100)) == 10
    assert "in journals removed here; sending from the oldest record kept (after txid 10)" in (
        caplog.text
    )


@pytest.mark.parametrize(("cursor", "bm"), [(50, "other"), (200, "bm200")])
def test_resync_from_a_cursor_this_journal_does_not_have_resends_everything(
    caplog: pytest.LogCaptureFixture, cursor: int, bm: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="amps_py.replication.outgoing"):
        assert resync(cursor, bm, StubJournal(removed_through=10, last_txid=100)) == 0
    (record,) = caplog.records
    assert getattr(record, "code", None) == events.REPLICATION_RESYNC_FULL
    assert "resending from the start of the journal" in record.getMessage()


# ---------------------------------------------------------------- outage lines
@pytest.mark.parametrize(
    ("seconds", "words"),
    [(3.25, "3.2s"), (45.9, "45s"), (125, "2m05s"), (3 * 3600 + 610, "3h10m")],
)
def test_duration(seconds: float, words: str) -> None:
    assert duration(seconds) == words


def test_the_first_outage_line_says_how_it_retries_and_that_acks_wait() -> None:
    report = OutageReport(True, 1, 1, 0.0, "connect to h:1: Connection refused", True)
    line = outage_line("B", "h:1", report, 0.0, sync=True, waiting=3)
    assert line == (
        "replication to B (h:1) failed: connect to h:1: Connection refused; persisted acks "
        "wait for it (sync destination, 3 messages routed to it not acknowledged); "
        "retrying on the ReconnectTimeout back-off, and logging again at growing "
        "intervals while it fails"
    )
    # nothing routed to it waits (a partial replica, say): no ack is held now
    line = outage_line("B", "h:1", report, 0.0, sync=True)
    assert "; persisted acks of messages routed to it will wait for it (sync destination);" in (
        line
    )


def test_the_first_outage_line_of_a_peer_not_up_since_the_start_says_when_it_warns() -> None:
    report = OutageReport(True, 1, 1, 0.0, "connect to h:1: Connection refused", True)
    line = outage_line("B", "h:1", report, 0.0, sync=False, grace=30.0)
    assert line == (
        "replication to B (h:1) is not up yet: connect to h:1: Connection refused (the peer "
        "may still be starting); retrying on the ReconnectTimeout back-off, logged as a "
        "warning if it is still down 30 s after this first attempt"
    )


def test_later_outage_lines_count_attempts_since_when() -> None:
    report = OutageReport(False, 3, 12, 125.0, "tls: bad certificate", False)
    line = outage_line("B", "h:1", report, 0.0, sync=False)
    assert line == (
        f"replication to B still down since {utc_iso(0.0)} (2m05s), 3 failed attempts since "
        "the last report, 12 in all; last error: tls: bad certificate"
    )
    new = OutageReport(False, 1, 13, 130.0, "refused", True)
    assert "1 failed attempt since the last report, 13 in all; now failing with: refused" in (
        outage_line("B", "h:1", new, 0.0, sync=False)
    )


# ---------------------------------------------------------------- statistics
def test_rates_are_per_second_over_at_least_a_second() -> None:
    rates = Rates()
    assert rates.update(100.0, 0, 0) == (0.0, 0.0)
    assert rates.update(100.5, 50, 5000) == (0.0, 0.0)  # under a second: not yet
    assert rates.update(102.0, 300, 30000) == (150.0, 15000.0)
    assert rates.update(102.2, 400, 40000) == (150.0, 15000.0)  # kept until the next
    # over the last read's counts (102.0): 100 messages in 2 s
    assert rates.update(104.0, 400, 40000) == (50.0, 5000.0)
    assert rates.update(105.0, 400, 40000) == (0.0, 0.0)


# ---------------------------------------------------------------- connect and TLS words
def test_connect_failure_in_the_oss_words() -> None:
    assert connect_failure(trio.TooSlowError()) == (f"no connection within {CONNECT_TIMEOUT:g} s")
    refused = OSError(errno.ECONNREFUSED, "refused (trio's words)")
    wrapped = OSError("all attempts to connect to h:1 failed")
    wrapped.__cause__ = ExceptionGroup("attempts", [refused, OSError(errno.ECONNREFUSED, "x")])
    assert connect_failure(wrapped) == os.strerror(errno.ECONNREFUSED)
    assert connect_failure(OSError("no reason given")) == "no reason given"


def test_tls_failure_names_the_fix() -> None:
    cfg = destination(secure=True, server_name="b.example.com")
    mismatch = ssl.SSLCertVerificationError("verify failed")
    mismatch.verify_message = "Hostname mismatch, certificate is not valid for 'b.example.com'"
    detail = tls_failure_detail(cfg, "h:1", "b.example.com", mismatch)
    assert "not issued for 'b.example.com'" in detail
    assert "set Destination/Transport/ServerName" in detail

    untrusted = ssl.SSLCertVerificationError("verify failed")
    untrusted.verify_message = "self-signed certificate"
    assert "set Destination/Transport/Certificate to the PEM file" in tls_failure_detail(
        cfg, "h:1", "b", untrusted
    )
    with_ca = destination(secure=True, ca_file=Path("/etc/ca.pem"))
    assert "put the CA that issued the peer's certificate into /etc/ca.pem" in (
        tls_failure_detail(with_ca, "h:1", "b", untrusted)
    )
    plain = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    plain.reason = "WRONG_VERSION_NUMBER"  # what the ssl module sets on the errors it raises
    detail = tls_failure_detail(cfg, "h:1", "b", plain)
    assert detail.startswith("the TLS handshake with h:1 (destination B) failed: WRONG_VERSION")
    assert "does not speak TLS" in detail
    assert "the peer closed the connection during the handshake" in tls_failure_detail(
        cfg, "h:1", "b", None
    )
