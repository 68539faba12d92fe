"""Fabric topology check (`amps-py config fabric`): the shipped examples route every
message everywhere, and each deliberately broken geo-ha variant is flagged."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from amps_py.cli import main
from amps_py.config import ConfigError, ReplicationTopic
from amps_py.replication.fabric import Fabric, _sample_topic, load_fabric, simulate

REPO = Path(__file__).resolve().parent.parent
GEO_HA = REPO / "config" / "examples" / "geo-ha"
HOT_HOT = REPO / "config" / "examples" / "hot-hot"
SIX = {"chi-1", "chi-2", "ny-1", "ny-2", "ldn-1", "ldn-2"}
GROUP = {"chi": "Chicago", "ny": "NewYork", "ldn": "London"}


def messages(fabric: Fabric) -> list[str]:
    return [f.message for f in fabric.findings()]


# ----------------------------------------------------------------- shipped examples


def test_geo_ha_reaches_all_six_from_every_instance_without_findings() -> None:
    fabric = load_fabric([GEO_HA])
    assert set(fabric.instances) == SIX
    assert fabric.findings() == []
    for origin in SIX:
        prop = simulate(fabric, origin, "orders")
        assert prop.journaled
        assert prop.reached == SIX, origin
        assert prop.extra_copies == ()
        site = origin.split("-")[0]
        for arrival in prop.arrivals[1:]:
            # a message crosses to a remote site once, from its origin, and the
            # receiving server hands it to its partner: at most two hops
            target_site = arrival.instance.split("-")[0]
            if target_site == site:
                assert arrival.path == ((origin, GROUP[site]),)
                assert arrival.sync_type == "sync"
            elif arrival.instance.endswith("-1"):
                assert arrival.path == ((origin, GROUP[site]),)
                assert arrival.sync_type == "async"
                assert arrival.member_index == 0
            else:
                partner = f"{target_site}-1"
                assert arrival.path == ((origin, GROUP[site]), (partner, GROUP[target_site]))
                assert arrival.passed_group == GROUP[site]


def test_geo_ha_failover_member_takes_over_when_the_primary_is_down() -> None:
    fabric = load_fabric([GEO_HA])
    prop = simulate(fabric, "chi-1", "orders")
    assert prop.only_while_down("ny-2") == ()  # reached normally
    down = prop.if_down["ny-1"]
    assert down.reached == SIX - {"ny-1"}
    ny2 = down.arrival("ny-2")
    assert ny2 is not None
    assert ny2.path == (("chi-1", "Chicago"),)
    assert ny2.member_index == 1  # the second InetAddr of chi-1's NewYork destination
    # with a partner down, nothing else at the site is missed
    for name, alternative in prop.if_down.items():
        assert alternative.reached == SIX - {name}, name


def test_geo_ha_report() -> None:
    report = load_fabric([GEO_HA]).report()
    assert report.splitlines()[-1] == "0 warnings, 0 errors"
    assert "ny-2 <- ny-1 <- chi-1  [ny-2 sync, passes Chicago]" in report
    assert "if ny-1 is down: ny-2 <- chi-1  [NewYork async, failover member 2]" in report
    assert report.count("reaches 6 of 6, 0 extra copies") == 6


def test_hot_hot_passes() -> None:
    fabric = load_fabric([HOT_HOT / "amps-a.xml", HOT_HOT / "amps-b.xml"])
    assert fabric.findings() == []
    for origin in ("amps-a", "amps-b"):
        assert simulate(fabric, origin, "orders").reached == {"amps-a", "amps-b"}
    assert fabric.report().endswith("0 warnings, 0 errors\n")


# ------------------------------------------------------------------ broken variants


def copy_secrets(example: Path, target: Path) -> None:
    """The example's replication password files, which its configs name beside them."""
    for name in ("replication-users.pw", "replication.secret"):
        shutil.copy(example / name, target / name)


def copy_geo_ha(tmp_path: Path) -> Path:
    target = tmp_path / "geo-ha"
    target.mkdir()
    for path in GEO_HA.glob("*.xml"):
        shutil.copy(path, target / path.name)
    copy_secrets(GEO_HA, target)
    return target


def edit(directory: Path, instance: str, change: Callable[[str], str]) -> None:
    path = directory / f"{instance}.xml"
    text = path.read_text()
    changed = change(text)
    assert changed != text, f"the edit of {instance}.xml changed nothing"
    path.write_text(changed)


def in_destination(name: str, change: Callable[[str], str]) -> Callable[[str], str]:
    """Apply ``change`` to the Destination named ``name`` only."""

    def apply(text: str) -> str:
        pattern = re.compile(
            rf"<Destination>\s*<Name>{re.escape(name)}</Name>.*?</Destination>", re.S
        )
        return pattern.sub(lambda m: change(m.group(0)), text, count=1)

    return apply


def remove_destination(name: str) -> Callable[[str], str]:
    return in_destination(name, lambda block: "")


def replace(old: str, new: str) -> Callable[[str], str]:
    return lambda text: text.replace(old, new, 1)


BROKEN = [
    pytest.param(
        "ny-1",
        in_destination("ny-2", replace("<PassThrough>^Chicago$</PassThrough>", "")),
        "warning",
        "ny-2 journals .* (json) but a message published at chi-1, chi-2 reaches it only "
        "while ny-1 is down (unreachable in normal operation)",
        "add <PassThrough>^Chicago$</PassThrough> to ny-1's Destination ny-2",
        id="removed-passthrough",
    ),
    pytest.param(
        "ny-2",
        remove_destination("ny-1"),
        "warning",
        "ny-2 and ny-1 (Group NewYork) are failover members of chi-1's Destination NewYork",
        "(missing back replication)",
        id="partner-without-back-replication",
    ),
    pytest.param(
        "chi-1",
        in_destination(
            "NewYork", replace("<SyncType>async</SyncType>", "<SyncType>sync</SyncType>")
        ),
        "warning",
        "Destination NewYork is sync to ny-1, ny-2 in Group NewYork, another site than "
        "chi-1 (Group Chicago): a wide-area sync link puts the remote site's latency",
        "make Destination NewYork async",
        id="cross-site-sync",
    ),
    pytest.param(
        "chi-1",
        in_destination("London", replace("<Group>London</Group>", "<Group>Paris</Group>")),
        "error",
        "Destination London -> ldn-1 (127.0.0.1:9354): the Destination's Group is 'Paris' "
        "but ldn-1 is in Group 'London': the link would be refused (group mismatch)",
        "set Destination London's Group to 'London'",
        id="wrong-group",
    ),
    pytest.param(
        "chi-1",
        in_destination("chi-2", replace("127.0.0.1:9324", "127.0.0.1:9399")),
        "error",
        "Destination chi-2: 127.0.0.1:9399 matches no instance of the fabric (unknown peer)",
        "point InetAddr at a replication listener",
        id="unknown-port",
    ),
    pytest.param(
        "ldn-2",
        replace(
            "ldn-2</JournalDirectory>\n    <Topic>\n      <Name>.*</Name>",
            "ldn-2</JournalDirectory>\n    <Topic>\n      <Name>orders</Name>",
        ),
        "error",
        "Destination London -> ldn-2 (127.0.0.1:9364): ldn-2 would refuse the link: check "
        "txlog fails: instance ldn-2 does not record this topic in its transaction log",
        "to ldn-2's TransactionLog",
        id="replicated-but-not-journaled",
    ),
]


@pytest.mark.parametrize(("instance", "change", "level", "message", "hint"), BROKEN)
def test_broken_geo_ha_variant_is_flagged(
    tmp_path: Path,
    instance: str,
    change: Callable[[str], str],
    level: str,
    message: str,
    hint: str,
) -> None:
    directory = copy_geo_ha(tmp_path)
    edit(directory, instance, change)
    fabric = load_fabric([directory])
    findings = fabric.findings()
    matching = [f for f in findings if message in f.message]
    assert matching, "\n".join(str(f) for f in findings)
    assert matching[0].level == level
    assert hint in matching[0].fix or hint in matching[0].message
    report = fabric.report()
    assert message in report
    warnings = sum(1 for f in findings if f.level == "warning")
    errors = sum(1 for f in findings if f.level == "error")
    assert report.splitlines()[-1] == f"{warnings} warnings, {errors} errors"


def test_removed_passthrough_names_every_origin_and_the_failover_route(tmp_path: Path) -> None:
    directory = copy_geo_ha(tmp_path)
    edit(
        directory,
        "ny-1",
        in_destination("ny-2", replace("<PassThrough>^Chicago$</PassThrough>", "")),
    )
    fabric = load_fabric([directory])
    (unreachable,) = [f for f in fabric.findings() if "unreachable" in f.message]
    assert unreachable.instance == "ny-2"
    assert "published at chi-1, chi-2 reaches it only while ny-1 is down" in unreachable.message
    prop = simulate(fabric, "chi-1", "orders")
    assert prop.reached == SIX - {"ny-2"}
    assert prop.only_while_down("ny-2") == ("ny-1",)
    # London's messages still pass through ny-1
    assert simulate(fabric, "ldn-1", "orders").reached == SIX


def test_filters_are_printed_along_the_path(tmp_path: Path) -> None:
    directory = copy_geo_ha(tmp_path)
    topic = "<Name>.*</Name>\n        <MessageType>json</MessageType>\n"
    filtered = topic + "        <Filter>/region = 'EU'</Filter>\n"
    for instance, dest in (
        ("chi-1", "London"),
        ("chi-2", "London"),
        ("ldn-1", "Chicago"),
        ("ldn-2", "Chicago"),
    ):
        edit(directory, instance, in_destination(dest, replace(topic, filtered)))
    fabric = load_fabric([directory])
    assert fabric.findings() == []
    prop = simulate(fabric, "chi-1", "orders")
    assert prop.reached == SIX  # when the filter matches
    ldn2 = prop.arrival("ldn-2")
    assert ldn2 is not None and ldn2.path[0] == ("chi-1", "Chicago")
    report = fabric.report()
    assert "reaches 6 of 6 (the instances whose filters match)" in report
    assert "ldn-1 <- chi-1  [London async, filter /region = 'EU']" in report


def test_a_config_that_does_not_load_stops_the_check(tmp_path: Path) -> None:
    directory = copy_geo_ha(tmp_path)
    edit(directory, "ny-2", replace("<SyncType>sync</SyncType>", "<SyncType>eventually</SyncType>"))
    with pytest.raises(ConfigError) as info:
        load_fabric([directory])
    assert "ny-2.xml" in str(info.value)
    result = CliRunner().invoke(main, ["config", "fabric", str(directory)])
    assert result.exit_code == 2


def test_two_configs_with_the_same_name_do_not_load(tmp_path: Path) -> None:
    directory = copy_geo_ha(tmp_path)
    shutil.copy(directory / "ny-1.xml", directory / "ny-1-copy.xml")
    with pytest.raises(ConfigError, match="also used by"):
        load_fabric([directory])


def test_concrete_topic_option() -> None:
    result = CliRunner().invoke(main, ["config", "fabric", str(HOT_HOT), "--topic", "orders:json"])
    assert result.exit_code == 0, result.output
    assert "topic orders (json): reaches 2 of 2, 0 extra copies" in result.output


@pytest.mark.parametrize(
    ("pattern", "sample"),
    [
        (None, "sample"),
        (".*", "sample"),
        ("orders", "orders"),
        ("^trades-.*$", "trades-"),
        ("orders|trades", "orders"),
        (r"md\.(us|eu)\..+", "md.us.sample"),
        (r"[A-Z]+_\d{2}", "A_00"),
    ],
)
def test_topic_patterns_are_simulated_with_a_matching_sample(
    pattern: str | None, sample: str
) -> None:
    assert _sample_topic(ReplicationTopic(pattern, "json")) == sample


# -------------------------------------------------------------------------------- CLI


def fabric_cli(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "config", "fabric", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_exit_codes(tmp_path: Path) -> None:
    good = fabric_cli(GEO_HA)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[-1] == "0 warnings, 0 errors"

    broken = copy_geo_ha(tmp_path)
    edit(broken, "chi-1", in_destination("chi-2", replace("127.0.0.1:9324", "127.0.0.1:9399")))
    bad = fabric_cli(broken)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "(unknown peer)" in bad.stdout


def test_cli_exit_code_with_warnings_only(tmp_path: Path) -> None:
    directory = copy_geo_ha(tmp_path)
    edit(
        directory,
        "chi-1",
        in_destination(
            "NewYork", replace("<SyncType>async</SyncType>", "<SyncType>sync</SyncType>")
        ),
    )
    result = CliRunner().invoke(main, ["config", "fabric", str(directory)])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == "1 warnings, 0 errors"


def test_plain_destination_to_a_tls_listener_is_flagged(tmp_path: Path) -> None:
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(cert), append=True)
    server.private_key_pem.write_to_path(str(key))
    shutil.copy(HOT_HOT / "amps-a.xml", tmp_path / "amps-a.xml")
    copy_secrets(HOT_HOT, tmp_path)
    b = (HOT_HOT / "amps-b.xml").read_text()
    secure = re.sub(
        r"<Type>amps-replication</Type>(\s*<InetAddr>[^<]*</InetAddr>)",
        rf"<Type>amps-replication-secure</Type>\1<Certificate>{cert}</Certificate>"
        rf"<PrivateKey>{key}</PrivateKey>",
        b,
        count=1,
    )
    assert secure != b, "the hot-hot example changed shape; update this test"
    (tmp_path / "amps-b.xml").write_text(secure)
    report = load_fabric([tmp_path]).report()
    assert "speaks plain TCP (amps-replication)" in report
    assert "expects TLS: the link cannot connect" in report


def _dmz_variant(tmp_path: Path, *, peer_dials: bool) -> Path:
    """The hot-hot example with amps-b's destination reduced to no Transport (it only
    replicates back over amps-a's connection); without ``peer_dials`` amps-a has no
    destination at all."""
    copy_secrets(HOT_HOT, tmp_path)
    b = (HOT_HOT / "amps-b.xml").read_text()
    dmz = re.sub(r"(<Destination>.*?)\s*<Transport>.*?</Transport>", r"\1", b, count=1, flags=re.S)
    assert dmz != b, "the hot-hot example changed shape; update this test"
    (tmp_path / "amps-b.xml").write_text(dmz)
    a = (HOT_HOT / "amps-a.xml").read_text()
    if not peer_dials:
        a = re.sub(r"\s*<Replication>.*?</Replication>", "", a, count=1, flags=re.S)
    (tmp_path / "amps-a.xml").write_text(a)
    return tmp_path


def test_destination_without_inetaddr_replicates_back_over_the_peers_connection(
    tmp_path: Path,
) -> None:
    fabric = load_fabric([_dmz_variant(tmp_path, peer_dials=True)])
    assert fabric.findings() == []
    names = set(fabric.instances)
    for origin in names:
        assert simulate(fabric, origin, "orders").reached == names, origin
    assert "back over amps-a's connection" in fabric.report()


def test_destination_without_inetaddr_that_nobody_dials_is_flagged(tmp_path: Path) -> None:
    fabric = load_fabric([_dmz_variant(tmp_path, peer_dials=False)])
    found = "\n".join(messages(fabric))
    assert "has no InetAddr, so it only replicates back over a connection its peer" in found
