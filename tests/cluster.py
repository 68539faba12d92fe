"""A cluster of real amps-py instances in real processes, for multi-instance tests.

Instances listen on port 0: the ports they bound are read from their ready files at
the first start and kept for restarts (peers' configs and clients name them). The
config of an instance is generated each time it starts, from
:func:`harness.write_config` plus what the caller's ``xml_body_fn`` returns, which is
usually a ``<Replication>`` element built with :func:`destination_xml`::

    def body(view: InstanceView) -> str:
        return replication_xml(destination_xml("B", "groupB", True, view.addr("B")))

    cluster.add_instance("A", "groupA", body)
    cluster.add_instance("B", "groupB", lambda v: replication_xml(
        destination_xml("A", "groupA", True, v.addr("A"))))
    link = cluster.proxy("A", "B")   # A's destination B now points at a FaultProxy
    cluster.start_all()
    link.blackhole(True); ...; link.heal()

:meth:`InstanceView.addr` needs the peer's replication port. When the peer has not
started yet (the second of a hot-hot pair, a ring, a fault proxy created before the
instances), its port is reserved with :func:`harness.reserve_port` (a bound socket the
cluster holds until :meth:`Cluster.stop_all`), and the peer listens there when it
starts. Nothing else is chosen ahead of the start.

For TLS links, give the listening instance ``replication_tls=(certificate, key)`` (its
transport becomes ``amps-replication-secure``) and build the sender's destination with
``destination_xml(..., secure=True, ca_file=ca_pem)``.

:meth:`Cluster.proxy` runs ``tests/faultproxy.py`` as a subprocess (so it outlives any
one trio run) in front of the destination's replication port; :meth:`InstanceView.addr`
returns the proxy's address for that pair once the proxy exists. Create proxies before
starting the source instance (or restart it): configs are written at start.

Every method is synchronous (it may be called from sync or trio tests). The ``cluster``
fixture in conftest.py calls :meth:`Cluster.stop_all` at teardown, which stops every
instance and proxy and kills whatever does not stop.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from faultproxy import ProxyControl
from harness import (
    REPO,
    ServerProcess,
    reserve_port,
    wait_until,
    wait_until_sync,
    write_config,
)

__all__ = [
    "Cluster",
    "InstancePorts",
    "InstanceView",
    "ProxyHandle",
    "destination_xml",
    "replication_transport_xml",
    "replication_xml",
    "wait_until",
    "wait_until_sync",
]

HOST = "127.0.0.1"


#: the name of the incoming replication transport in generated configs
REPLICATION_TRANSPORT = "repl"


@dataclass(frozen=True)
class InstancePorts:
    """The ports of one instance: clients connect to ``client``, peers replicate to
    ``replication``. 0: not known yet (the instance has not started, and nothing
    reserved that port)."""

    client: int
    replication: int


@dataclass(frozen=True)
class InstanceView:
    """What an ``xml_body_fn`` sees when the config of instance ``name`` is written.

    ``replication_port(to)`` gives ``to``'s replication port, reserving one when ``to``
    has not started yet (see the module docstring)."""

    name: str
    group: str
    groups: Mapping[str, str]
    replication_port: Callable[[str], int]
    proxies: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def addr(self, to: str) -> str:
        """``host:port`` this instance should replicate to for instance ``to``: the
        proxy's listen port when :meth:`Cluster.proxy` put one on that link, else
        ``to``'s replication port."""
        if to not in self.groups:
            raise KeyError(f"no instance {to!r}; add it before starting {self.name!r}")
        port = self.proxies.get((self.name, to))
        return f"{HOST}:{port if port is not None else self.replication_port(to)}"


# ---------------------------------------------------------------------- XML helpers


def destination_xml(
    name: str,
    group: str,
    sync: bool | str,
    addrs: str | Sequence[str],
    topics: Iterable[str | tuple[str, str]] = (".*",),
    passthrough: Iterable[str] = (),
    extra: str = "",
    exclude: Iterable[str] = (),
    *,
    secure: bool = False,
    ca_file: str | os.PathLike[str] | None = None,
    server_name: str | None = None,
) -> str:
    """One ``<Destination>`` of a ``<Replication>`` element.

    Args:
        name: the destination instance's name.
        group: its group.
        sync: True/"sync" or False/"async" (the SyncType).
        addrs: ``host:port`` of its replication transport, or several (failover).
        topics: topic regexes to replicate (message type json), or (regex, type) pairs.
        passthrough: PassThrough group regexes (none by default).
        extra: XML appended inside the Destination as it is.
        exclude: validation checks excluded on every Topic (``ExcludeValidation``),
            e.g. ``("replicate",)`` for a one-way link.
        secure: connect over TLS (Transport Type ``amps-replication-secure``).
        ca_file: with ``secure``: the PEM file of CAs the peer's certificate must chain
            to (Transport ``Certificate``); default: the system's CAs.
        server_name: with ``secure``: the name the peer's certificate must hold
            (Transport ``ServerName``); default: the InetAddr host.
    """
    if not secure and (ca_file is not None or server_name is not None):
        raise ValueError("`ca_file` and `server_name` need `secure=True`")
    sync_type = ("sync" if sync else "async") if isinstance(sync, bool) else sync
    if sync_type not in ("sync", "async"):
        raise ValueError(f"`sync` must be True/False or 'sync'/'async', got {sync!r}")
    addr_list = [addrs] if isinstance(addrs, str) else list(addrs)
    if not addr_list:
        raise ValueError(f"destination {name!r} needs at least one address in `addrs`")
    excluded = ",".join(exclude)
    exclude_xml = f"<ExcludeValidation>{escape(excluded)}</ExcludeValidation>" if excluded else ""
    topic_xml = "".join(
        f"<Topic><Name>{escape(t)}</Name><MessageType>json</MessageType>{exclude_xml}</Topic>"
        if isinstance(t, str)
        else f"<Topic><Name>{escape(t[0])}</Name><MessageType>{escape(t[1])}</MessageType>"
        f"{exclude_xml}</Topic>"
        for t in topics
    )
    pass_xml = "".join(f"<PassThrough>{escape(p)}</PassThrough>" for p in passthrough)
    inet = "".join(f"<InetAddr>{escape(a)}</InetAddr>" for a in addr_list)
    kind = "amps-replication-secure" if secure else "amps-replication"
    tls = ""
    if ca_file is not None:
        tls += f"<Certificate>{escape(os.fspath(ca_file))}</Certificate>"
    if server_name is not None:
        tls += f"<ServerName>{escape(server_name)}</ServerName>"
    return (
        f"<Destination><Name>{escape(name)}</Name><Group>{escape(group)}</Group>"
        f"<SyncType>{sync_type}</SyncType>{topic_xml}{pass_xml}"
        f"<Transport><Type>{kind}</Type>{inet}{tls}</Transport>{extra}</Destination>"
    )


def replication_xml(*destinations: str) -> str:
    """A ``<Replication>`` element holding the given destinations."""
    return "<Replication>" + "".join(destinations) + "</Replication>"


def replication_transport_xml(
    port: int, name: str = REPLICATION_TRANSPORT, tls: tuple[Path, Path] | None = None
) -> str:
    """The incoming replication transport (goes inside ``<Transports>``); with ``tls``
    (certificate chain PEM, private key PEM) it is ``amps-replication-secure``."""
    if tls is None:
        kind, files = "amps-replication", ""
    else:
        kind = "amps-replication-secure"
        files = (
            f"<Certificate>{escape(str(tls[0]))}</Certificate>"
            f"<PrivateKey>{escape(str(tls[1]))}</PrivateKey>"
        )
    return (
        f"<Transport><Name>{escape(name)}</Name><Type>{kind}</Type>"
        f"<InetAddr>{HOST}:{port}</InetAddr>{files}</Transport>"
    )


# ---------------------------------------------------------------------- proxies


class ProxyHandle(ProxyControl):
    """A fault proxy subprocess on one replication link; the fault methods
    (``cut``, ``blackhole``, ``delay``, ``bandwidth``, ``refuse``, ``random_drops``,
    ``heal``, ``stats``) go through its control port."""

    def __init__(
        self,
        source: str,
        destination: str,
        proc: subprocess.Popen[bytes],
        listen_port: int,
        control_port: int,
    ) -> None:
        super().__init__(HOST, control_port)
        self.source = source
        self.destination = destination
        self.proc = proc
        self.listen_port = listen_port

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __repr__(self) -> str:
        return f"<ProxyHandle {self.source}->{self.destination} on {HOST}:{self.listen_port}>"


# ---------------------------------------------------------------------- the cluster


@dataclass
class _Member:
    name: str
    group: str
    xml_body_fn: Callable[[InstanceView], str] | None
    replication_transport: bool
    server: ServerProcess
    journal_topics: tuple[str | tuple[str, str], ...] = (".*",)
    replication_tls: tuple[Path, Path] | None = None
    journal_extra: str = ""
    #: the client transport's MessageType (None: every type, chosen by the URI)
    client_message_type: str | None = "json"
    #: 0 until the first start has bound one (then kept for restarts)
    client_port: int = 0
    #: 0 until the first start has bound one or a peer's config reserved one
    replication_port: int = 0

    @property
    def ports(self) -> InstancePorts:
        return InstancePorts(self.client_port, self.replication_port)


def _close_all(reservations: list[socket.socket]) -> None:
    while reservations:
        reservations.pop().close()


class Cluster:
    """Instances under ``tmp_path/<name>/`` (see the module doc)."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self._members: dict[str, _Member] = {}
        self._proxies: dict[tuple[str, str], ProxyHandle] = {}
        #: ports reserved for instances not started when a peer needed their port
        self._reservations: list[socket.socket] = []
        # a cluster only written out (configs, no start) is never stopped: release its
        # reservations when it is collected
        weakref.finalize(self, _close_all, self._reservations)
        self._lock = threading.Lock()  # proxies and starts may run in threads

    wait_until = staticmethod(wait_until)
    wait_until_sync = staticmethod(wait_until_sync)

    # ------------------------------------------------------------------ building
    def replication_port(self, name: str) -> int:
        """``name``'s replication port: the one it bound, or, before its first start,
        one reserved for it now (:func:`harness.reserve_port`, held until
        :meth:`stop_all`), which it will listen on."""
        member = self._member(name)
        with self._lock:
            if member.replication_port == 0:
                # (an instance without a replication transport never listens there: a
                # peer dialing it is refused, as a test of an unreachable peer wants)
                reservation = reserve_port(HOST)
                self._reservations.append(reservation)
                member.replication_port = int(reservation.getsockname()[1])
            return member.replication_port

    def add_instance(
        self,
        name: str,
        group: str | None = None,
        xml_body_fn: Callable[[InstanceView], str] | None = None,
        *,
        replication_transport: bool | None = None,
        journal_topics: tuple[str | tuple[str, str], ...] = (".*",),
        replication_tls: tuple[Path, Path] | None = None,
        journal_extra: str = "",
        client_message_type: str | None = "json",
    ) -> None:
        """Add an instance (not started); its ports are chosen when it starts.

        Args:
            name: the instance name (also its directory under the cluster root).
            group: its replication group; defaults to ``name``.
            xml_body_fn: returns XML placed inside ``<AMPSConfig>`` (usually the
                ``<Replication>`` element), given an :class:`InstanceView` of every
                instance's ports. Called at each start, so every instance added by then
                can be referred to. None: a standalone instance.
            replication_transport: whether the config has the incoming
                ``amps-replication`` transport; defaults to ``xml_body_fn is not None``.
            journal_topics: TransactionLog Topic names (message type json), or
                (name, message type) pairs.
            replication_tls: (certificate chain PEM, private key PEM): the incoming
                replication transport is ``amps-replication-secure`` with these files;
                None (the default): plain ``amps-replication``.
            journal_extra: XML placed inside ``TransactionLog`` (e.g. JournalSize).
            client_message_type: the client transport's MessageType; None accepts
                every type (clients choose by their URI's ``/amps/<type>``).
        """
        if name in self._members:
            raise ValueError(f"instance {name!r} was already added")
        workdir = self.root / name
        workdir.mkdir(parents=True, exist_ok=True)
        server = ServerProcess(workdir / f"{name}.xml", workdir, 0, name)
        self._members[name] = _Member(
            name,
            group or name,
            xml_body_fn,
            xml_body_fn is not None if replication_transport is None else replication_transport,
            server,
            journal_topics,
            replication_tls,
            journal_extra,
            client_message_type,
        )

    def _member(self, name: str) -> _Member:
        try:
            return self._members[name]
        except KeyError:
            known = ", ".join(self._members) or "none yet"
            raise KeyError(f"no instance {name!r} in the cluster (instances: {known})") from None

    def view(self, name: str) -> InstanceView:
        """The :class:`InstanceView` passed to ``name``'s ``xml_body_fn``."""
        member = self._member(name)
        return InstanceView(
            name=name,
            group=member.group,
            groups={n: m.group for n, m in self._members.items()},
            replication_port=self.replication_port,
            proxies={pair: p.listen_port for pair, p in self._proxies.items()},
        )

    def write_config(self, name: str) -> Path:
        """(Re)write ``name``'s config file from the current cluster state."""
        member = self._member(name)
        body = member.xml_body_fn(self.view(name)) if member.xml_body_fn else ""
        return write_config(
            member.server.workdir,
            name,
            member.client_port,
            topics=tuple((t, "json") if isinstance(t, str) else t for t in member.journal_topics),
            extra_transport=(
                replication_transport_xml(member.replication_port, tls=member.replication_tls)
                if member.replication_transport
                else ""
            ),
            extra=f"<Group>{escape(member.group)}</Group>{body}",
            journal_extra=member.journal_extra,
            client_message_type=member.client_message_type,
        )

    def write_configs(self, names: Iterable[str]) -> list[Path]:
        """(Re)write the configs of ``names`` as a consistent set: every port one of
        them names for another is settled (reserved) before the files are final. For
        configs read without starting the instances (e.g. by the audit pipeline)."""
        names = list(names)
        for name in names:  # the first pass reserves what the configs name
            self.write_config(name)
        return [self.write_config(name) for name in names]

    def config_text(self, name: str) -> str:
        return self.write_config(name).read_text()

    # ------------------------------------------------------------------ lifecycle
    def start(self, name: str, timeout: float = 120) -> ServerProcess:
        """Write the config and start ``name``; returns once it reports ready.

        The first start listens on port 0 (or on a port reserved for it) and records
        the ports it bound: restarts come back on them, because peers' configs and
        clients name them."""
        member = self._member(name)
        if member.server.alive:
            raise RuntimeError(f"instance {name!r} is already running; stop or kill it first")
        self.write_config(name)
        server = member.server.start(timeout)
        member.client_port = server.port
        if member.replication_transport:
            member.replication_port = server.ports[REPLICATION_TRANSPORT]
        # the file now names the ports it listens on, for restarts and for whoever
        # reads the config (the audit pipeline matches destinations to listeners)
        self.write_config(name)
        return server

    def start_together(self, names: Iterable[str], timeout: float = 120) -> None:
        """Start ``names`` side by side (one thread each). Their configs are written
        one after the other first, so that every port one of them names for another is
        settled (reserved) before any of them starts."""
        names = list(names)
        self.write_configs(names)
        with ThreadPoolExecutor(max(len(names), 1)) as pool:
            for future in [pool.submit(self.start, name, timeout) for name in names]:
                future.result()

    def stop(self, name: str, timeout: float = 30) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        return self._member(name).server.stop(timeout)

    def kill(self, name: str) -> None:
        """SIGKILL (no shutdown code runs)."""
        self._member(name).server.kill()

    def restart(self, name: str, timeout: float = 120) -> ServerProcess:
        """Stop (if running) and start again with a freshly written config."""
        self.stop(name)
        return self.start(name, timeout)

    def start_all(self, timeout: float = 120) -> None:
        """Start every instance that is not running, in the order they were added."""
        for name, member in self._members.items():
            if not member.server.alive:
                self.start(name, timeout)

    def stop_all(self, timeout: float = 30) -> None:
        """Stop every instance and proxy; whatever does not stop is killed.

        Raises:
            AssertionError: an instance ignored SIGTERM or exited uncleanly (after
                everything has been stopped), with its output.
        """
        problems: list[str] = []
        for name, member in self._members.items():
            server = member.server
            if not server.alive:
                continue
            try:
                code = server.stop(timeout)
            except AssertionError as exc:  # ignored SIGTERM; it has been killed
                problems.append(str(exc))
                continue
            if code != 0:
                problems.append(f"instance {name} exited with {code}; output:\n{server.tail()}")
        for handle in self._proxies.values():
            handle.close()
        _close_all(self._reservations)
        if problems:
            raise AssertionError("\n".join(problems))

    def processes(self) -> list[subprocess.Popen[bytes]]:
        """Every process the cluster started and still holds (instances, proxies)."""
        procs = [m.server.proc for m in self._members.values() if m.server.proc is not None]
        return procs + [p.proc for p in self._proxies.values()]

    # ------------------------------------------------------------------ faults
    def proxy(self, source: str, destination: str | None = None, seed: int = 0) -> ProxyHandle:
        """The fault proxy on the replication link ``source`` -> ``destination``.

        Also accepts ``proxy("A->B")``. Created on first use (a ``tests/faultproxy.py``
        subprocess forwarding to ``destination``'s replication port); from then on
        ``source``'s config points its destination at the proxy. Create it before
        starting ``source``, or restart ``source`` afterwards.
        """
        if destination is None:
            source, sep, destination = source.partition("->")
            if not sep:
                raise ValueError(
                    f"name the link as proxy('A', 'B') or proxy('A->B'), not {source!r}"
                )
        self._member(source)
        self._member(destination)
        pair = (source, destination)
        if pair in self._proxies:
            return self._proxies[pair]
        ready = self.root / f"proxy-{source}-{destination}.json"
        out = open(self.root / f"proxy-{source}-{destination}.out", "ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests" / "faultproxy.py"),
                "--listen",
                f"{HOST}:0",
                "--target",
                f"{HOST}:{self.replication_port(destination)}",
                "--control",
                f"{HOST}:0",
                "--seed",
                str(seed),
                "--ready-file",
                str(ready),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        out.close()

        def started() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(
                    f"fault proxy {source}->{destination} exited with {proc.returncode}; "
                    f"see {out.name}"
                )
            return None if ready.exists() else f"proxy {source}->{destination} is not ready"

        try:
            wait_until_sync(started, 30)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        info = json.loads(ready.read_text())
        handle = ProxyHandle(
            source,
            destination,
            proc,
            int(info["listen"].rpartition(":")[2]),
            int(info["control"].rpartition(":")[2]),
        )
        self._proxies[pair] = handle
        return handle

    def proxies(self) -> dict[tuple[str, str], ProxyHandle]:
        return dict(self._proxies)

    def partition(self, a: str, b: str) -> None:
        """Blackhole the proxied links between ``a`` and ``b`` (both directions).

        Raises:
            KeyError: no proxy on either link; create them with :meth:`proxy` first.
        """
        links = [self._proxies[p] for p in ((a, b), (b, a)) if p in self._proxies]
        if not links:
            raise KeyError(
                f"no proxy between {a!r} and {b!r}; call cluster.proxy({a!r}, {b!r}) "
                "(and the reverse) before starting the instances"
            )
        for link in links:
            link.blackhole(True)

    def heal(self) -> None:
        """Clear every fault on every proxy."""
        for link in self._proxies.values():
            link.heal()

    # ------------------------------------------------------------------ inspection
    def ports(self, name: str) -> InstancePorts:
        """``name``'s ports; 0 for one not known yet (see :class:`InstancePorts`)."""
        return self._member(name).ports

    def server(self, name: str) -> ServerProcess:
        return self._member(name).server

    def names(self) -> list[str]:
        return list(self._members)

    def uri(self, name: str) -> str:
        member = self._member(name)
        if member.client_port == 0:
            raise RuntimeError(f"instance {name!r} has not started: its client port is not known")
        return member.server.uri

    def journal_dir(self, name: str) -> Path:
        return self._member(name).server.journal_dir

    def log(self, name: str) -> str:
        """The instance's log file, or "" before it has written one."""
        path = self._member(name).server.log_file
        return path.read_text(errors="replace") if path.exists() else ""

    def alive(self, name: str) -> bool:
        return self._member(name).server.alive
