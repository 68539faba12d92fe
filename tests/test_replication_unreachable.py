"""A sync destination that cannot be reached: logged at its first failure and then at
growing intervals with the count of attempts (not at every attempt; at info while a
peer that has not connected since the start may still be starting), shown by
`amps-py admin status` (since when, attempts, last error) until it is back.

A dials B on a 100 ms ReconnectTimeout while B is not running, so A fails many
attempts a second; real processes, the real `amps-py admin` command.
"""

from __future__ import annotations

import itertools
import re
import urllib.request

from admin_screens import admin_cli, admin_json, admin_url, words
from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until_sync

from amps_py.replication.outage import REPORT_INTERVALS
from amps_py.replication.outgoing import START_GRACE

ADMIN = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
REPORT = "15-0012"


def a_body(view) -> str:  # type: ignore[no-untyped-def]
    destination = destination_xml("B", "g", True, view.addr("B"), exclude=("replicate",))
    fast = destination.replace(
        "</Transport>", "<ReconnectTimeout>100ms</ReconnectTimeout></Transport>"
    )
    return replication_xml(fast) + ADMIN


def reports(cluster: Cluster) -> list[str]:
    """A's log lines about B being down."""
    return [line for line in cluster.log("A").splitlines() if f" {REPORT} " in line]


def metric(url: str, name: str) -> float:
    """Destination B's value of Prometheus metric ``name`` at ``url``/metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    prefix = f'{name}{{destination="B",instance="A"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line[len(prefix) :])


def most_reports(down_s: float) -> int:
    """How many reports an outage of ``down_s`` seconds may have logged (the first,
    then one per interval passed), with a second of slack for the poll."""
    passed = itertools.accumulate(REPORT_INTERVALS)
    return 1 + sum(1 for t in passed if t <= down_s + 1.0)


def test_an_unreachable_sync_destination_is_reported_with_back_off(
    cluster: Cluster,
) -> None:
    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", lambda view: "")  # its replication transport only
    cluster.start("A")  # B is not running: nothing listens on its replication port
    url = admin_url(cluster.server("A"))
    b_port = cluster.ports("B").replication
    refused = f"connect to 127.0.0.1:{b_port}: Connection refused"

    def b_json() -> dict:  # type: ignore[type-arg]
        tree = admin_json(url, "replication")
        return dict(tree["destinations"]["B"])

    def failed_often() -> str | None:
        d = b_json()
        return None if d["failed_attempts"] >= 20 else f"{d['failed_attempts']} failed attempts"

    wait_until_sync(failed_often, 30, interval=0.2)
    d = b_json()
    lines = reports(cluster)
    print("\n".join(lines))
    # logged, but not at every attempt: the first failure, then at growing intervals
    assert 1 <= len(lines) <= most_reports(d["down_s"]) < d["failed_attempts"], (lines, d)
    # B has not connected since A started: a peer that may still be starting, at info
    # for the first START_GRACE seconds
    assert "info: 15-0012 replication to B (127.0.0.1:" in lines[0], lines[0]
    assert (
        f"is not up yet: {refused} (the peer may still be starting); persisted acks of "
        "messages routed to it will wait for it (sync destination); retrying on the "
        "ReconnectTimeout back-off, logged as a warning if it is still down "
        f"{START_GRACE:g} s after this first attempt"
    ) in lines[0]
    # the admin API: down since when, how many attempts, the last error
    assert d["is_connected"] is False and d["last_error"] == refused, d
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", d["down_since"]), d
    assert metric(url, "amps_replication_failed_attempts") >= d["failed_attempts"]
    assert metric(url, "amps_replication_down_seconds") > 0
    # `amps-py admin status`, piped at 80 columns: the destination row and its outage
    status = admin_cli(url, "status")
    assert status.returncode == 0, status.stderr
    print(status.stdout)
    assert max(map(len, status.stdout.splitlines())) <= 80
    row = next(line for line in status.stdout.splitlines() if line.startswith(" B "))
    assert row.split()[:3] == ["B", "sync", "NO"], row
    down = re.search(
        rf"B DOWN since {d['down_since']} \(\S+\), (\d+) failed attempts; last error: "
        rf"{re.escape(refused)}; sync, but no persisted ack waits for it \(nothing "
        r"routed to it is unacknowledged\)",
        words(status.stdout),
    )
    assert down is not None, status.stdout
    assert int(down.group(1)) >= d["failed_attempts"]

    # the next report: 10 s after the first, counting the attempts in between (info
    # while under START_GRACE since the first; a stalled machine may report it later)
    def repeated() -> str | None:
        return None if len(reports(cluster)) >= 2 else "one report so far"

    wait_until_sync(repeated, REPORT_INTERVALS[0] + 60, interval=0.2)
    again = reports(cluster)[1]
    print(again)
    counted = re.search(
        r"(?:info|warning): 15-0012 replication to B still down since (\S+) \((\S+)\), "
        r"(\d+) failed attempts since the last report, (\d+) in all; last error: "
        + re.escape(refused)
        + r"; persisted acks of messages routed to it will wait for it \(sync destination\)$",
        again,
    )
    assert counted is not None, again
    assert counted.group(1) == d["down_since"]
    since_last, in_all = int(counted.group(3)), int(counted.group(4))
    assert since_last >= 10 and in_all > since_last, again

    # B starts: A connects, says how long B was down, and status shows no outage
    cluster.start("B")

    def connected() -> str | None:
        d = b_json()
        return None if d["is_connected"] else f"not connected: {d['last_error']}"

    wait_until_sync(connected, 30, interval=0.2)
    d = b_json()
    assert (d["down_since"], d["down_s"], d["failed_attempts"]) == ("", 0.0, 0), d
    assert metric(url, "amps_replication_failed_attempts") == 0
    up = re.search(
        r"replication to B \(127\.0\.0\.1:\d+\) is up again after \S+ down \((\d+) failed "
        r"attempts\)",
        cluster.log("A"),
    )
    assert up is not None and int(up.group(1)) >= in_all
    status = admin_cli(url, "status")
    row = next(line for line in status.stdout.splitlines() if line.startswith(" B "))
    assert row.split()[:3] == ["B", "sync", "yes"], row
    assert "DOWN" not in status.stdout, status.stdout
