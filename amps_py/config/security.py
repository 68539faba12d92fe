"""Settings that load and run but leave an instance open to the network."""

from __future__ import annotations

import ipaddress

from amps_py import auth
from amps_py.config.file_modes import file_mode_warnings
from amps_py.config.model import InstanceConfig


def _loopback_only(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "" (every interface) or a host name
        return host.lower() == "localhost" or host.lower().endswith(".localhost")


def security_warnings(config: InstanceConfig) -> list[str]:
    """What loads and runs, but leaves the instance open to anyone on the network or
    its secrets to other users of the machine (:func:`file_mode_warnings`), in
    sentences naming the setting or file and the fix (``amps-py config check`` prints
    them and the instance logs them when it starts, as ``00-0020``; they never stop an
    instance)."""
    warnings: list[str] = []
    transport = config.replication_transport
    if (
        transport is not None
        and config.replication_authentication.module == auth.DEFAULT_AUTHENTICATION_MODULE
        and not _loopback_only(transport.host)
    ):
        where = (
            "every interface"
            if transport.host in ("", "0.0.0.0", "::")
            else f"{transport.host}, beyond this machine"
        )
        warnings.append(
            f"replication transport {transport.name!r} ({transport.type}) listens on "
            f"{transport.address} ({where}) without authentication: any program that "
            "reaches it and names itself after a peer may write into this instance's "
            "journal (see Replication trust in docs/GUARANTEES.md). Fix: add "
            "<Authentication><Module>amps-password-file</Module><Options><PasswordFile>"
            "FILE</PasswordFile></Options></Authentication> to the transport (create FILE "
            "with `amps-py users add FILE USER`) and an Authenticator with that user to "
            "each upstream's Destination/Transport; or listen on 127.0.0.1 only"
        )
    for client in config.client_transports:
        if (
            config.authentication_of(client).module == auth.DEFAULT_AUTHENTICATION_MODULE
            and config.authentication.module != auth.DEFAULT_AUTHENTICATION_MODULE
            and not _loopback_only(client.host)
        ):
            warnings.append(
                f"transport {client.name!r} ({client.type}) authenticates with "
                f"{auth.DEFAULT_AUTHENTICATION_MODULE} while AMPSConfig/Authentication checks "
                f"passwords: a client that reaches {client.address} may log on as any "
                "user, the users of the password file included, and gets that user's "
                "rights and client names (this module takes the user name as given, as "
                "AMPS's does with AllowSpoofing). Fix: remove its <Authentication> so the "
                "instance's applies, or set its InetAddr to 127.0.0.1:PORT"
            )
    admin = config.admin
    if (
        admin is not None
        and config.authentication.module == auth.DEFAULT_AUTHENTICATION_MODULE
        and not _loopback_only(admin[0])
    ):
        warnings.append(
            f"the admin API listens on {admin[0]}:{admin[1]} (beyond this machine) without "
            "authentication: anyone who reaches it may read the instance and disconnect "
            "clients, disable transports or remove journals. Fix: configure an "
            "<Authentication> module (the admin API then asks for its credentials and the "
            'entitlement rules\' "admin": true), or set Admin/InetAddr to 127.0.0.1:PORT'
        )
    warnings.extend(file_mode_warnings(config))
    return warnings
