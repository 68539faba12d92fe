"""The admin API's request guard (amps_py.admin.guard): pure decisions, no server.

Which paths change state, the Host check against DNS rebinding, POST-only actions, the
same-origin rule and the X-AMPS-Admin header. The same rules over real sockets are in
tests/test_admin_security.py.
"""

from __future__ import annotations

import pytest

from amps_py.admin import guard

NAMES = guard.allowed_host_names("127.0.0.1", ["build-7", "build-7.corp.example."])


@pytest.mark.parametrize(
    "path",
    [
        "/amps/administrator/clients/victim/disconnect",
        "/amps/administrator/clients/victim/disconnect.json",
        "/amps/administrator/replication/B/downgrade",
        "/amps/administrator/replication/B/upgrade.xml",
        "/amps/administrator/transports/json-tcp/disable",
        "/amps/administrator/transports/json-tcp/enable/",
        "/amps/administrator/transaction_log/journals/3/compress",
        "/amps/administrator/transaction_log/journals/3/archive",
        "/amps/administrator/transaction_log/journals/3/remove",
        "/amps/administrator/queues/q/enable_proxied_transfer",
        "/amps/administrator/actions/say-hello",
        "/amps/administrator/something-new",
        "//amps//administrator/clients/victim/disconnect",
    ],
)
def test_administrator_actions_change_state_and_need_post(path: str) -> None:
    assert guard.is_state_changing(path)
    refusal = guard.method_refusal("GET", path)
    assert refusal is not None and refusal.status == 405
    assert ("allow", "POST") in refusal.headers
    assert "needs POST" in refusal.message
    assert guard.method_refusal("HEAD", path) is not None
    assert guard.method_refusal("PUT", path) is not None
    assert guard.method_refusal("POST", path) is None


@pytest.mark.parametrize(
    "path",
    [
        "/amps",
        "/amps/instance/clients.json",
        "/metrics",
        "/amps/administrator",
        "/amps/administrator.json",
        "/amps/administrator/actions",
        "/amps/administrator/actions.json",
        "/amps/administratorx/clients/victim/disconnect",
    ],
)
def test_listings_may_be_read_with_get(path: str) -> None:
    assert not guard.is_state_changing(path)
    assert guard.method_refusal("GET", path) is None


@pytest.mark.parametrize(
    "host",
    [
        None,
        "127.0.0.1",
        "127.0.0.1:8085",
        "10.1.2.3:8085",
        "[::1]:8085",
        "localhost:8085",
        "LOCALHOST",
        "admin.localhost:8085",
        "build-7:8085",
        "build-7.corp.example",
        "build-7.corp.example.:8085",
    ],
)
def test_hosts_of_this_machine_pass(host: str | None) -> None:
    assert guard.host_refusal(host, NAMES) is None


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8085", "localhost.evil.example", "", "a b", "[::1"]
)
def test_foreign_hosts_are_refused(host: str) -> None:
    refusal = guard.host_refusal(host, NAMES)
    assert refusal is not None and refusal.status == 421
    assert "is not a name of this machine" in refusal.message
    assert "build-7" in refusal.message  # says which names are accepted


def test_the_admin_inet_addr_host_is_accepted() -> None:
    names = guard.allowed_host_names("amps-admin.internal", [])
    assert guard.host_refusal("amps-admin.internal:9308", names) is None
    assert guard.host_refusal("other.internal:9308", names) is not None


@pytest.mark.parametrize(
    ("origin", "scheme", "host", "same"),
    [
        ("http://127.0.0.1:8085", "http", "127.0.0.1:8085", True),
        ("http://LOCALHOST:8085", "http", "localhost:8085", True),
        ("https://localhost", "https", "localhost:443", True),
        ("http://localhost", "http", "localhost", True),
        ("http://evil.example", "http", "127.0.0.1:8085", False),
        ("http://127.0.0.1:9999", "http", "127.0.0.1:8085", False),
        ("https://127.0.0.1:8085", "http", "127.0.0.1:8085", False),
        ("http://127.0.0.1:8085", "https", "127.0.0.1:8085", False),
        ("null", "http", "127.0.0.1:8085", False),
        ("http://127.0.0.1:8085", "http", None, False),
        ("http://[::1]:8085", "http", "[::1]:8085", True),
    ],
)
def test_same_origin(origin: str, scheme: str, host: str | None, same: bool) -> None:
    assert guard.same_origin(origin, scheme, host) is same


def test_check_request_order_and_messages() -> None:
    action = "/amps/administrator/clients/victim/disconnect"
    ok = {"host": "127.0.0.1:8085", "x-amps-admin": "1"}

    def check(method: str, headers: dict[str, str], path: str = action) -> guard.Refusal | None:
        return guard.check_request(method, path, "http", headers, NAMES)

    assert check("POST", ok) is None
    assert check("POST", {**ok, "origin": "http://127.0.0.1:8085"}) is None

    foreign = check("POST", {**ok, "host": "evil.example:8085"})
    assert foreign is not None and foreign.status == 421

    get = check("GET", ok)
    assert get is not None and get.status == 405

    cross = check("POST", {**ok, "origin": "http://evil.example"})
    assert cross is not None and cross.status == 403
    assert "'http://evil.example'" in cross.message
    assert "cross-site requests are refused" in cross.message

    bare = check("POST", {"host": "127.0.0.1:8085"})
    assert bare is not None and bare.status == 403
    assert "X-AMPS-Admin: 1" in bare.message and "amps-py admin sends it" in bare.message
    assert check("POST", {"host": "127.0.0.1:8085", "x-amps-admin": " "}) is not None

    # reads need neither the header nor a same-origin Origin (but a known Host)
    assert check("GET", {"host": "localhost", "origin": "http://evil.example"}, "/amps") is None
    assert check("GET", {"host": "evil.example"}, "/amps") is not None


def test_allowed_methods() -> None:
    assert guard.allowed_methods("/amps/administrator/transports/t/disable") == "POST, OPTIONS"
    assert "GET" in guard.allowed_methods("/amps/instance")


def test_the_start_up_line_says_how_exposed_the_admin_api_is() -> None:
    from amps_py.admin.http import listening_line

    default = listening_line("127.0.0.1", 8085, tls=False, open_access=True)
    assert default.startswith("admin interface listening on http://127.0.0.1:8085 (")
    assert "loopback only, no authentication" in default and "To secure it" in default
    exposed = listening_line("0.0.0.0", 8085, tls=False, open_access=True)
    assert "beyond this machine WITHOUT authentication" in exposed
    secured = listening_line("::1", 9308, tls=True, open_access=False)
    assert secured == "admin interface listening on https://[::1]:9308"
