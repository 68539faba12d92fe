"""A queue over a damaged journal page: its other messages are delivered, the damaged
ones are left out saying so, and a ``sow`` on the queue fails naming the damage
(real server process; page damage from ``page_damage.py``, seed printed).

A queue loaded from its checkpoint holds its messages' identities, not their data: a
message's payload is read from its journal record when it is sent. A record on a
damaged page cannot be read, so that message cannot be delivered here: it leaves this
instance's queue with an error naming its txid and bookmark (``18-0002``), and every
other message is delivered as usual; the instance, the connection and the consumer
go on. A ``sow`` query on the queue gets a ``journal corrupt`` failure ack naming the
txids, never a silent close.
"""

from __future__ import annotations

import socket
from pathlib import Path

from harness import start_instance, wait_until_sync
from test_read_damage import RECORDS, assert_no_traceback, damage_journal, fill

from amps_py.protocol import FrameDecoder, encode_frame


def test_a_queue_delivers_around_a_damaged_record_and_its_sow_fails_clearly(
    tmp_path: Path,
) -> None:
    queue = (
        "<SOW><Queue><Name>orders</Name><MessageType>json</MessageType>"
        "<LeasePeriod>1m</LeasePeriod><MaxPerSubscriptionBacklog>10000</MaxPerSubscriptionBacklog>"
        "</Queue></SOW>"
    )
    server = start_instance(tmp_path, "qd", extra=queue)
    server.stop()
    journal = server.journal_dir
    fill(journal, "qd")
    server.start()  # the queue is built from the journal and checkpointed at the stop
    server.stop()
    first, last = damage_journal(journal)
    hidden = last - first + 1
    server.start()  # loads the checkpoint: no journal record is read
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(encode_frame({"c": "logon", "cid": "l", "client_name": "worker"}))
        decoder = FrameDecoder()
        # a sow on the queue reads every message's data: a failure naming the damage
        sock.sendall(encode_frame({"c": "sow", "t": "orders", "cid": "s", "a": "completed"}))
        failure = None
        while failure is None:
            data = sock.recv(1 << 20)
            assert data, "the server closed the connection during the sow"
            decoder.receive_data(data)
            for frame in decoder.frames():
                if frame.header.get("c") == "ack" and frame.header.get("cid") == "s":
                    failure = frame.header
        assert failure.get("status") == "failure", failure
        assert failure.get("reason") == "journal corrupt", failure
        assert f"txids {first} to {last} unreadable" in str(failure), failure
        sock.sendall(
            encode_frame(
                {"c": "subscribe", "t": "orders", "sub_id": "q", "o": "max_backlog=10000"}
            )
        )
        got: set[int] = set()
        while len(got) < RECORDS - hidden:
            data = sock.recv(1 << 20)
            assert data, f"the server closed the connection after {len(got)} messages"
            decoder.receive_data(data)
            got.update(
                int(str(f.header["bm"]).split("|")[1])
                for f in decoder.frames()
                if f.header.get("c") in ("p", "publish")
            )
        assert got == set(range(1, first)) | set(range(last + 1, RECORDS + 1))

        sock.close()

        def logged() -> str | None:
            text = server.log_file.read_text()
            lines = [x for x in text.splitlines() if "cannot be delivered" in x]
            return None if len(lines) == hidden else f"{len(lines)} of {hidden} logged"

        wait_until_sync(logged, timeout=60)
        assert server.alive
        assert_no_traceback(server.log_file.read_text(), server.output.read_text())
    finally:
        server.stop()
