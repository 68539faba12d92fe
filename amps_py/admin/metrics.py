"""``/metrics``: the instance's counters in Prometheus text format (prometheus-client).

Read at scrape time from the same statistics the admin tree shows, so the two never
disagree. Names start with ``amps_``; per-destination series carry a ``destination``
label, per-queue series (``amps_queue_*``) a ``queue`` label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from amps_py.statistics import BATCH_SIZE_BUCKETS, COMMIT_SECONDS_BUCKETS

if TYPE_CHECKING:
    from .host import AdminHost


class InstanceCollector(Collector):
    def __init__(self, instance: AdminHost) -> None:
        self.instance = instance

    def collect(self) -> Iterator[Metric]:
        instance = self.instance
        stats = instance.statistics()
        labels = ["instance"]
        me = [stats.name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(me, value)
            return g

        def histogram(
            name: str,
            doc: str,
            bounds: tuple[float, ...],
            counts: Sequence[int],
            total: float,
        ) -> HistogramMetricFamily:
            h = HistogramMetricFamily(name, doc, labels=labels)
            cumulative, running = [], 0
            for bound, count in zip((*bounds, math.inf), counts, strict=False):
                running += count
                cumulative.append(("+Inf" if bound == math.inf else repr(bound), running))
            h.add_metric(me, cumulative, total)
            return h

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(me, value)
            return c

        yield gauge("amps_uptime_seconds", "Seconds since the instance started", stats.uptime)
        if stats.startup:
            yield gauge(
                "amps_startup_seconds",
                "Seconds the last start took, to ready",
                stats.startup["seconds"],
            )
            yield gauge(
                "amps_startup_journal_records_read",
                "Journal records the last start read past the SOW stores' and queues' "
                "checkpoints",
                stats.startup["journal_records_read"],
            )
        yield gauge("amps_clients", "Connected clients", stats.clients)
        yield gauge("amps_subscriptions", "Active subscriptions", stats.subscriptions)
        yield counter("amps_published_messages", "Messages published here", stats.published)
        yield counter("amps_delivered_messages", "Messages delivered", stats.delivered)
        yield counter("amps_duplicate_publishes", "Publishes discarded", stats.duplicates)
        yield counter(
            "amps_denied_commands", "Commands refused (entitlement)", stats.denied_commands
        )
        gate = instance.auth_gate
        yield counter(
            "amps_auth_failures",
            "Failed logons (clients, replication, admin API), checked or refused unchecked",
            gate.failures,
        )
        yield counter(
            "amps_auth_checks", "Password checks run (each one scrypt, on a worker thread)",
            gate.checks_run,
        )
        yield counter(
            "amps_auth_refused_unchecked",
            "Logons refused without a password check (backed off after failures, or no user)",
            gate.refused_unchecked,
        )
        if stats.writer:
            w = stats.writer
            yield counter(
                "amps_journal_commits",
                "Group commits (one fsync each: the commit log, or LMDB without one)",
                w["commits"],
            )
            yield counter(
                "amps_journal_lmdb_commits",
                "LMDB commits behind the commit log",
                w.get("lmdb_commits", 0),
            )
            yield counter(
                "amps_journal_slow_syncs",
                "Commit log fsyncs in the event loop slower than 20 ms (each sends the "
                "syncs to the writer thread for 10 s)",
                w.get("slow_syncs", 0),
            )
            yield gauge(
                "amps_journal_staged_records",
                "Records durable in the commit log, not yet committed to LMDB",
                w.get("staged", 0),
            )
            yield counter("amps_journal_records", "Records journaled", w["records"])
            yield counter(
                "amps_journal_commit_seconds", "Seconds spent in commits", w["commit_seconds"]
            )
            yield counter(
                "amps_journal_fsync_seconds", "Seconds waiting for fsync", w["sync_seconds"]
            )
            yield gauge("amps_journal_last_batch", "Records in the last commit", w["last_batch"])
            yield histogram(
                "amps_journal_commit_duration_seconds",
                "Time of each group commit: staging the puts, then the fsync",
                COMMIT_SECONDS_BUCKETS,
                w.get("commit_seconds_histogram") or (),
                float(w["commit_seconds"]),
            )
            yield histogram(
                "amps_journal_batch_records",
                "Records per group commit",
                BATCH_SIZE_BUCKETS,
                w.get("batch_size_histogram") or (),
                float(w["records"]) + float(w.get("duplicates", 0)),
            )
            yield gauge("amps_journal_queued", "Records waiting for a commit", w["queued"])
        if stats.journal:
            yield gauge("amps_journal_bytes", "Journal file size", stats.journal["file_bytes"])
            yield gauge("amps_journal_last_txid", "Newest txid", stats.journal["last_txid"])
        yield from self._journal_segments(stats.name)
        yield from self._disks(stats.name)
        yield from self._replication(stats.name, stats.replication)
        yield from self._clients(stats.name)
        yield from self._sow(stats.name, stats.sow)
        if stats.unparsed_payloads:
            unparsed = CounterMetricFamily(
                "amps_unparsed_payloads",
                "Messages a content filter needed that are not JSON (every filtered "
                "subscription skipped them)",
                labels=["instance", "topic"],
            )
            for topic, n in sorted(stats.unparsed_payloads.items()):
                unparsed.add_metric([stats.name, topic], n)
            yield unparsed
        yield from self._queues(stats.name)
        if stats.limits:
            yield from self._limits(stats.limits, gauge, counter)

    @staticmethod
    def _limits(
        limits: dict[str, Any],
        gauge: Callable[[str, str, float], GaugeMetricFamily],
        counter: Callable[[str, str, float], CounterMetricFamily],
    ) -> Iterator[Metric]:
        """The client memory pools and the connections the limits closed."""
        queued, incomplete = limits["queued"], limits["incomplete_messages"]
        slow = queued["slow_client_disconnects"]
        yield gauge(
            "amps_clients_queued_bytes",
            "Bytes waiting to be sent to all clients together",
            queued["bytes"],
        )
        yield gauge("amps_message_memory_limit_bytes", "MessageMemoryLimit", queued["limit_bytes"])
        yield counter(
            "amps_slow_client_disconnects",
            "Clients disconnected as slow clients (ClientMaxCapacity, MessageMemoryLimit, "
            "MessageDiskLimit, ClientMessageAgeLimit or a failed spill)",
            sum(slow.values()),
        )
        offline = limits.get("offline")
        if offline is not None:
            yield gauge(
                "amps_offline_clients",
                "Clients offlined now (their backlog spilled to disk)",
                offline["clients"],
            )
            yield gauge(
                "amps_clients_spilled_bytes",
                "Bytes waiting for offline clients in spill files",
                offline["spilled_bytes"],
            )
            yield gauge("amps_message_disk_limit_bytes", "MessageDiskLimit", offline["limit_bytes"])
            yield counter(
                "amps_clients_offlined", "Times a client was offlined", offline["offlined"]
            )
        yield gauge(
            "amps_incomplete_message_bytes",
            "Bytes of partly received messages over all client connections",
            incomplete["bytes"],
        )
        yield gauge(
            "amps_incomplete_message_memory_limit_bytes",
            "IncompleteMessageMemoryLimit",
            incomplete["limit_bytes"],
        )
        yield counter(
            "amps_incomplete_message_closes",
            "Connections closed over IncompleteMessageTimeout or IncompleteMessageMemoryLimit",
            incomplete["closed_timeout"] + incomplete["closed_over_limit"],
        )
        yield counter(
            "amps_logon_timeouts",
            "Connections closed for no logon in time",
            limits["logon_timeouts"],
        )

    def _disks(self, name: str) -> Iterator[Metric]:
        from .http import disks_of

        free = GaugeMetricFamily(
            "amps_disk_free_bytes",
            "Free space on the file system of the journal / the archive directory",
            labels=["instance", "holds"],
        )
        for what, disk in disks_of(self.instance).items():
            free.add_metric([name, what], disk["free_bytes"])
        yield free

    def _journal_segments(self, name: str) -> Iterator[Metric]:
        """Journal segments per state, and maintenance requests per action."""
        journal, maintenance = self.instance.journal, self.instance.maintenance
        if journal is None:
            return
        from txlog.segments import SEGMENT_STATES

        states = GaugeMetricFamily(
            "amps_journal_segments",
            "Journal segments (AMPS journal files) by state",
            labels=["instance", "state"],
        )
        segments = journal.segments()
        for state in SEGMENT_STATES:
            if state != "removed":
                count = sum(1 for seg in segments if seg.state == state)
                states.add_metric([name, state], count)
        yield states
        if maintenance is None:
            return
        requests = CounterMetricFamily(
            "amps_journal_maintenance_requests",
            "Journal compress/archive/remove requests (actions and admin)",
            labels=["instance", "action"],
        )
        for action, count in maintenance.counts.items():
            requests.add_metric([name, action], count)
        yield requests
        pending = GaugeMetricFamily(
            "amps_journal_removal_pending",
            "Journal segments marked for removal that something still needs",
            labels=["instance"],
        )
        pending.add_metric([name], len(maintenance.pending_removal()))
        yield pending

    def _sow(self, name: str, sow: dict[str, dict[str, int]]) -> Iterator[Metric]:
        """Records and bytes per SOW topic."""
        if not sow:
            return
        records = GaugeMetricFamily(
            "amps_sow_records", "Records in the State of the World", labels=["instance", "topic"]
        )
        size = GaugeMetricFamily(
            "amps_sow_bytes",
            "Message bytes in the State of the World",
            labels=["instance", "topic"],
        )
        for topic, figures in sow.items():
            records.add_metric([name, topic], figures["records"])
            size.add_metric([name, topic], figures["bytes"])
        yield records
        yield size

    def _queues(self, name: str) -> Iterator[Metric]:
        """Per queue: depth, leases, owned, seconds behind (gauges) and what happened to
        its messages here (counters), from the same figures as /amps/instance/queues."""
        from .http import queues_tree

        queues = queues_tree(self.instance)
        if not queues:
            return
        labels = ["instance", "queue"]
        gauges = (
            ("amps_queue_depth", "Messages in the queue (waiting or leased)", "depth"),
            ("amps_queue_leased", "Messages leased to subscribers, not acknowledged yet", "leased"),
            ("amps_queue_owned", "Messages in the queue this instance may deliver", "owned"),
            (
                "amps_queue_seconds_behind",
                "Seconds the oldest message has been in the queue (0 when empty)",
                "seconds_behind",
            ),
        )
        counters = (
            ("amps_queue_delivered", "Queue deliveries made here", "delivered"),
            ("amps_queue_acked", "Queue messages acknowledged here", "acked"),
            (
                "amps_queue_returned",
                "Leases ended without an ack and put back (timeout, unsubscribe, disconnect)",
                "returned",
            ),
            ("amps_queue_expired", "Queue messages expired here (any reason)", "expired"),
            (
                "amps_queue_transferred_in",
                "Queue messages whose ownership moved to this instance",
                "transferred_in",
            ),
            (
                "amps_queue_transferred_out",
                "Queue messages whose ownership moved away from this instance",
                "transferred_out",
            ),
        )
        for metric, doc, field in gauges:
            g = GaugeMetricFamily(metric, doc, labels=labels)
            for queue, figures in queues.items():
                g.add_metric([name, queue], _num(figures.get(field, 0)))
            yield g
        for metric, doc, field in counters:
            c = CounterMetricFamily(metric, doc, labels=labels)
            for queue, figures in queues.items():
                c.add_metric([name, queue], _num(figures.get(field, 0)))
            yield c

    def _clients(self, name: str) -> Iterator[Metric]:
        from .http import client_sessions

        queued = GaugeMetricFamily(
            "amps_client_queued_bytes",
            "Bytes waiting to be written to each client (slow clients grow this)",
            labels=["instance", "client"],
        )
        sent = CounterMetricFamily(
            "amps_client_messages_out",
            "Messages sent to each client",
            labels=["instance", "client"],
        )
        spilled = GaugeMetricFamily(
            "amps_client_spill_bytes",
            "Bytes waiting for each client in its spill file (offline clients)",
            labels=["instance", "client"],
        )
        for key, session in client_sessions(self.instance).items():
            queued.add_metric([name, key], session.out_bytes)
            sent.add_metric([name, key], session.messages_out)
            spilled.add_metric([name, key], session.spilled)
        yield queued
        yield sent
        yield spilled
        ended = CounterMetricFamily(
            "amps_client_disconnects",
            "Client connections ended, by close reason (connection closed, slow client, "
            "logon timeout, ...)",
            labels=["instance", "reason"],
        )
        for reason, count in self.instance.disconnects.counts.items():
            ended.add_metric([name, reason], count)
        yield ended

    def _replication(self, name: str, repl: dict[str, Any] | None) -> Iterator[Metric]:
        if not repl:
            return
        labels = ["instance", "destination"]
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "connected": GaugeMetricFamily(
                "amps_replication_connected", "1 when the destination is connected", labels=labels
            ),
            "sync": GaugeMetricFamily(
                "amps_replication_sync",
                "1 when persisted acks wait for the destination (sync), 0 when async",
                labels=labels,
            ),
            "lag_messages": GaugeMetricFamily(
                "amps_replication_lag_txids",
                "Local txids committed but not yet acknowledged by the destination",
                labels=labels,
            ),
            "lag_bytes": GaugeMetricFamily(
                "amps_replication_lag_bytes",
                "Stored bytes of the records the destination has not acknowledged",
                labels=labels,
            ),
            "seconds_behind": GaugeMetricFamily(
                "amps_replication_seconds_behind",
                "Age of the oldest record the destination has not acknowledged",
                labels=labels,
            ),
            "acks_waiting": GaugeMetricFamily(
                "amps_replication_acks_waiting",
                "Committed messages routed to the destination whose persisted acks wait "
                "for its acknowledgement (0 when async)",
                labels=labels,
            ),
            "down_seconds": GaugeMetricFamily(
                "amps_replication_down_seconds",
                "Seconds since the destination went down (lost its connection or failed "
                "to connect); 0 while it is connected",
                labels=labels,
            ),
            "failed_attempts": GaugeMetricFamily(
                "amps_replication_failed_attempts",
                "Attempts to connect that failed since the destination went down",
                labels=labels,
            ),
            "messages_out": CounterMetricFamily(
                "amps_replication_messages_out", "Messages sent", labels=labels
            ),
            "bytes_out": CounterMetricFamily(
                "amps_replication_bytes_out", "Bytes sent (after compression)", labels=labels
            ),
            "downgrades": CounterMetricFamily(
                "amps_replication_downgrades", "Downgrades to async", labels=labels
            ),
            "upgrades": CounterMetricFamily(
                "amps_replication_upgrades", "Upgrades back to sync", labels=labels
            ),
            "disconnects": CounterMetricFamily(
                "amps_replication_disconnects", "Disconnections", labels=labels
            ),
        }
        committed = self.instance.committed_txid
        for d in repl.get("destinations", []):
            key = [name, str(d["name"])]
            families["connected"].add_metric(key, 1.0 if d["is_connected"] else 0.0)
            families["sync"].add_metric(key, 1.0 if d["replication_type"] == "sync" else 0.0)
            families["lag_messages"].add_metric(key, max(committed - _num(d["acked_txid"]), 0))
            acked = d["acked_txid"]
            lag_bytes = self.instance.bytes_after(acked) if isinstance(acked, int) else 0
            families["lag_bytes"].add_metric(key, lag_bytes)
            for family, field in (
                ("seconds_behind", "seconds_behind"),
                ("acks_waiting", "acks_waiting"),
                ("down_seconds", "down_s"),
                ("failed_attempts", "failed_attempts"),
                ("messages_out", "messages_out"),
                ("bytes_out", "bytes_out"),
                ("downgrades", "downgrades"),
                ("upgrades", "upgrades"),
                ("disconnects", "disconnect_count"),
            ):
                families[family].add_metric(key, _num(d.get(field, 0)))
        yield from families.values()


def _num(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def render_metrics(instance: AdminHost) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstanceCollector(instance))
    return generate_latest(registry)
