"""The configuration used when none is given, as option objects and as XML text."""

from __future__ import annotations

from pathlib import Path
from typing import Final
from xml.sax.saxutils import escape as _xml_escape

from amps_py.config.model import (
    InstanceConfig,
    JournalTopic,
    LogTarget,
    TransactionLogConfig,
    TransportConfig,
)

_DEFAULT_NAME = "amps-py"
_DEFAULT_TRANSPORT = "json-tcp"
_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 9007
#: the message types the embedded default journals (every built type with fields)
_JOURNALED_TYPES: Final = ("json", "fix", "nvfix", "xml", "bson", "msgpack")
#: where the embedded default serves the admin API (and ``amps-py admin`` looks)
DEFAULT_ADMIN_ADDRESS: Final = ("127.0.0.1", 8085)


def default_config(data_dir: Path = Path("amps-data")) -> InstanceConfig:
    """The configuration used when none is given.

    A standalone instance ``amps-py`` with one transport ``json-tcp`` (tcp, amps
    protocol; json messages unless a client's URI names another type, e.g.
    ``/amps/nvfix``) on 127.0.0.1:9007, a transaction log journaling every topic of
    json, fix, nvfix, xml, bson and msgpack into ``data_dir`` (archived journal
    segments in ``data_dir/archive``), the admin interface on 127.0.0.1:8085, and
    info-level logging to stdout. It is the same
    configuration as :func:`default_config_xml` describes.
    """
    return InstanceConfig(
        name=_DEFAULT_NAME,
        group=_DEFAULT_NAME,
        description="",
        transports=(
            TransportConfig(
                name=_DEFAULT_TRANSPORT,
                type="tcp",
                host=_DEFAULT_HOST,
                port=_DEFAULT_PORT,
                protocol="amps",
                message_type=None,
            ),
        ),
        transaction_log=TransactionLogConfig(
            journal_directory=data_dir,
            topics=tuple(JournalTopic(".*", t) for t in _JOURNALED_TYPES),
            archive_directory=data_dir / "archive",
        ),
        logging=(LogTarget(protocol="stdout", level="info"),),
        source="<embedded default>",
        admin=DEFAULT_ADMIN_ADDRESS,
    )


def _journal_topics_xml() -> str:
    return "\n".join(
        f"    <Topic><Name>.*</Name><MessageType>{t}</MessageType></Topic>"
        for t in _JOURNALED_TYPES
    )


def default_config_xml(data_dir: str = "./amps-data") -> str:
    """The default configuration (see :func:`default_config`) as commented XML text.

    ``amps-py config show-default`` prints it; parsing it gives back
    ``default_config(Path(data_dir))`` (apart from ``source``).
    """
    directory = _xml_escape(data_dir)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- amps-py default configuration: one standalone instance.
     Save this, edit it, and start the server with it. Element names are AMPS's and are
     case-sensitive; ${{VAR}} is replaced from the environment. -->
<AMPSConfig>
  <!-- Unique name of this instance; it prefixes the files the instance creates. -->
  <Name>{_DEFAULT_NAME}</Name>

  <Transports>
    <!-- Clients connect here, e.g. tcp://127.0.0.1:{_DEFAULT_PORT}/amps/json; with no
         MessageType the transport takes every type, each client's from its URI
         (/amps/nvfix, /amps/xml, ...), json when it names none. -->
    <Transport>
      <Name>{_DEFAULT_TRANSPORT}</Name>
      <Type>tcp</Type>
      <InetAddr>{_DEFAULT_HOST}:{_DEFAULT_PORT}</InetAddr>
      <Protocol>amps</Protocol>
    </Transport>
  </Transports>

  <TransactionLog>
    <!-- The journal (LMDB) lives here. -->
    <JournalDirectory>{directory}</JournalDirectory>
    <!-- Record every topic of these message types. -->
{_journal_topics_xml()}
    <!-- Durability defaults to fsync: a persisted ack means the message is on disk. -->
    <!-- Journal segments of 1GB (JournalSize); `amps-py admin journal archive ID`
         moves sealed ones here, where replay and replication still read them. -->
    <JournalArchiveDirectory>{directory}/archive</JournalArchiveDirectory>
  </TransactionLog>

  <Logging>
    <Target>
      <Protocol>stdout</Protocol>
      <Level>info</Level>
    </Target>
  </Logging>

  <!-- The HTTP admin interface (/amps.json, /amps.xml, /metrics);
       `amps-py admin status` reads it. -->
  <Admin>
    <InetAddr>{DEFAULT_ADMIN_ADDRESS[0]}:{DEFAULT_ADMIN_ADDRESS[1]}</InetAddr>
  </Admin>
</AMPSConfig>
"""
