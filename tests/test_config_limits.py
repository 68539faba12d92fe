"""amps_py.config: the client limits (slow clients, partial frames, logon deadline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_config_errors import Case, check_refused, doc, transport

from amps_py.config import (
    DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT,
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_LOGON_TIMEOUT,
    ClientCapacity,
    ConfigError,
    default_config,
    default_message_memory_limit,
)
from amps_py.config import parse_config as _parse_config

MiB = 1024 * 1024


def test_limits_are_read_with_amps_units() -> None:
    cfg = _parse_config(
        doc(
            "  <MessageMemoryLimit>8MB</MessageMemoryLimit>",
            "  <ClientMaxCapacity>25%</ClientMaxCapacity>",
            "  <IncompleteMessageMemoryLimit>64MB</IncompleteMessageMemoryLimit>",
            "  <Transports>",
            *transport(
                LogonTimeout="2s",
                IncompleteMessageTimeout="500ms",
                ClientMaxCapacity="1MB",
            ),
            *transport("9008", name="other"),
            "  </Transports>",
        ),
        environ={},
    )
    first, other = cfg.transports
    assert (first.logon_timeout, first.incomplete_message_timeout) == (2.0, 0.5)
    assert first.client_max_capacity == ClientCapacity(size=MiB)
    assert (other.logon_timeout, other.incomplete_message_timeout) == (
        DEFAULT_LOGON_TIMEOUT,
        DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    )
    assert cfg.message_memory_budget() == 8 * MiB
    assert cfg.incomplete_message_budget() == 64 * MiB
    # a transport's own ClientMaxCapacity wins; else the instance's share of the pool
    assert cfg.client_capacity(first, 8 * MiB) == MiB
    assert cfg.client_capacity(other, 8 * MiB) == 2 * MiB


def test_defaults() -> None:
    cfg = default_config()
    pool = cfg.message_memory_budget()
    assert pool == default_message_memory_limit() > 0
    # AMPS's 50% of MessageMemoryLimit, but never more than 512 MiB held for one client
    assert cfg.client_capacity(cfg.transports[0], pool) == min(512 * MiB, pool // 2)
    assert cfg.incomplete_message_budget() == DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT
    big = _parse_config(
        doc("  <Transports>", *transport(MaxMessageSize="1GB"), "  </Transports>"), environ={}
    )
    # the default budget always has room for two messages of the largest size
    assert big.incomplete_message_budget() == 2 * 1024 * MiB


def test_message_disk_limit_and_path(tmp_path: Path) -> None:
    cfg = _parse_config(
        doc(
            "  <MessageDiskLimit>2GB</MessageDiskLimit>",
            f"  <MessageDiskPath>{tmp_path}</MessageDiskPath>",
        ),
        environ={},
    )
    assert (cfg.message_disk_limit, cfg.message_disk_path) == (2 * 1024 * MiB, str(tmp_path))
    aged = _parse_config(doc("  <ClientMessageAgeLimit>30s</ClientMessageAgeLimit>"), environ={})
    assert aged.client_message_age_limit == 30.0
    assert default_config().client_message_age_limit == 0.0  # no age limit
    # 0 turns offlining off (slow clients are disconnected); not given: the defaults
    off = _parse_config(doc("  <MessageDiskLimit>0</MessageDiskLimit>"), environ={})
    assert off.message_disk_limit == 0
    assert (default_config().message_disk_limit, default_config().message_disk_path) == (
        None,
        None,
    )


def test_a_transport_may_set_its_own_slow_client_pools(tmp_path: Path) -> None:
    """MessageMemoryLimit, MessageDiskLimit, MessageDiskPath and ClientMessageAgeLimit
    in a client Transport, with the instance-level syntax; a transport that sets none
    keeps None (the instance's)."""
    cfg = _parse_config(
        doc(
            "  <MessageMemoryLimit>8MB</MessageMemoryLimit>",
            "  <Transports>",
            *transport(
                MessageMemoryLimit="2MB",
                MessageDiskLimit="0",
                MessageDiskPath=str(tmp_path),
                ClientMessageAgeLimit="15s",
            ),
            *transport("9008", name="aged", ClientMessageAgeLimit="1m"),
            *transport("9009", name="plain"),
            "  </Transports>",
        ),
        environ={},
    )
    own, aged, plain = cfg.transports
    assert (
        own.message_memory_limit,
        own.message_disk_limit,
        own.message_disk_path,
        own.client_message_age_limit,
    ) == (2 * MiB, 0, str(tmp_path), 15.0)
    assert (aged.message_memory_limit, aged.client_message_age_limit) == (None, 60.0)
    assert (
        plain.message_memory_limit,
        plain.message_disk_limit,
        plain.message_disk_path,
        plain.client_message_age_limit,
    ) == (None, None, None, None)


def test_a_transport_message_disk_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigError) as caught:
        _parse_config(
            doc("  <Transports>", *transport(MessageDiskPath=str(a_file)), "  </Transports>"),
            environ={},
        )
    message = str(caught.value)
    assert f"MessageDiskPath '{a_file}' is not a directory" in message
    # in a Transport, leaving it out means the instance's directory
    assert "leave MessageDiskPath out to use the instance's MessageDiskPath" in message


def test_a_missing_message_disk_path_is_refused_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as caught:
        _parse_config(doc(f"  <MessageDiskPath>{missing}</MessageDiskPath>"), environ={})
    message = str(caught.value)
    assert f"MessageDiskPath '{missing}' does not exist" in message
    assert "create that directory" in message
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        _parse_config(doc(f"  <MessageDiskPath>{a_file}</MessageDiskPath>"), environ={})


CASES = [
    Case(
        "ClientMessageAgeLimit of zero",
        doc("  <ClientMessageAgeLimit>0s</ClientMessageAgeLimit>"),
        "ClientMessageAgeLimit 0s must be more than 0",
        3,
    ),
    Case(
        "ClientMessageAgeLimit not a duration",
        doc("  <ClientMessageAgeLimit>ages</ClientMessageAgeLimit>"),
        "'ages' is not a valid duration for ClientMessageAgeLimit",
        3,
    ),
    Case(
        "MessageDiskLimit not a size",
        doc("  <MessageDiskLimit>plenty</MessageDiskLimit>"),
        "'plenty' is not a valid byte size for MessageDiskLimit",
        3,
    ),
    Case(
        "MessageDiskLimit of a transport not a size",
        doc("  <Transports>", *transport(MessageDiskLimit="plenty"), "  </Transports>"),
        "'plenty' is not a valid byte size for MessageDiskLimit",
        5,
    ),
    Case(
        "MessageMemoryLimit of a transport zero",
        doc("  <Transports>", *transport(MessageMemoryLimit="0"), "  </Transports>"),
        "MessageMemoryLimit must be more than 0 bytes",
        5,
    ),
    Case(
        "ClientMessageAgeLimit of a transport zero, the fix naming the instance's",
        doc("  <Transports>", *transport(ClientMessageAgeLimit="0s"), "  </Transports>"),
        "ClientMessageAgeLimit 0s must be more than 0. Fix: give the longest a message may "
        "wait to be sent to a client, e.g. 30s, or leave ClientMessageAgeLimit out for the "
        "instance's age limit",
        5,
    ),
    Case(
        "ClientMessageAgeLimit of a transport not a duration",
        doc("  <Transports>", *transport(ClientMessageAgeLimit="ages"), "  </Transports>"),
        "'ages' is not a valid duration for ClientMessageAgeLimit",
        5,
    ),
    Case(
        "MessageDiskPath of a transport missing",
        doc("  <Transports>", *transport(MessageDiskPath="/nonexistent/spill"), "  </Transports>"),
        "MessageDiskPath '/nonexistent/spill' does not exist; offlined clients' spill files "
        "are written there",
        5,
    ),
    Case(
        "ClientMaxCapacity above 100%",
        doc("  <ClientMaxCapacity>150%</ClientMaxCapacity>"),
        "ClientMaxCapacity 150% must be above 0% and at most 100%",
        3,
    ),
    Case(
        "ClientMaxCapacity neither a share nor a size",
        doc("  <Transports>", *transport(ClientMaxCapacity="lots"), "  </Transports>"),
        "'lots' is not a valid byte size for ClientMaxCapacity",
        5,
    ),
    Case(
        "MessageMemoryLimit of zero",
        doc("  <MessageMemoryLimit>0</MessageMemoryLimit>"),
        "MessageMemoryLimit must be more than 0 bytes",
        3,
    ),
    Case(
        "IncompleteMessageMemoryLimit below MaxMessageSize",
        doc(
            "  <IncompleteMessageMemoryLimit>1MB</IncompleteMessageMemoryLimit>",
            "  <Transports>",
            *transport(MaxMessageSize="2MB"),
            "  </Transports>",
        ),
        "IncompleteMessageMemoryLimit 1MB is smaller than MaxMessageSize of transport "
        "'json-tcp' (2097152 bytes): a message of that size could never be received",
        3,
    ),
    Case(
        "LogonTimeout of zero",
        doc("  <Transports>", *transport(LogonTimeout="0s"), "  </Transports>"),
        "LogonTimeout 0s must be more than 0",
        5,
    ),
    Case(
        "IncompleteMessageTimeout without a unit AMPS knows",
        doc("  <Transports>", *transport(IncompleteMessageTimeout="soon"), "  </Transports>"),
        "'soon' is not a valid duration for IncompleteMessageTimeout",
        5,
    ),
    *(
        Case(
            f"{element} on the replication transport",
            doc(
                "  <TransactionLog><JournalDirectory>d</JournalDirectory></TransactionLog>",
                "  <Transports>",
                "    <Transport>",
                "      <Name>repl</Name><Type>amps-replication</Type><InetAddr>9100</InetAddr>",
                f"      <{element}>{value}</{element}>",
                "    </Transport>",
                "  </Transports>",
            ),
            f"<{element}> applies to client connections only, and this transport's Type is "
            "amps-replication: replication connections are never offlined or disconnected "
            f"as slow clients. Fix: remove <{element}> from this transport; set it on a tcp "
            "or tcps Transport, or in AMPSConfig for every client transport",
            7,
        )
        for element, value in (
            ("MessageMemoryLimit", "1GB"),
            ("MessageDiskLimit", "1GB"),
            ("MessageDiskPath", "/tmp"),
            ("ClientMessageAgeLimit", "30s"),
        )
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_limit(case: Case) -> None:
    check_refused(case)
