"""TLS with the CA pinned (`ca =`), a hub whose certificate another CA signed refused; and the status
record the broker shows (`federation status`): connected since, reconnects, the last error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import trio

from agent_bridge.federation import settings, subjects
from agent_bridge.federation.transport import open_transport

from .conftest import TEAM, Hub, make_machines

GUARD = 30


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str) -> Path:
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN={name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )
    return folder / f"{name}.pem"


def make_server_cert(folder: Path, ca: str) -> tuple[Path, Path]:
    (folder / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
        cwd=folder,
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        cwd=folder,
    )
    return folder / "server.pem", folder / "server.key"


def tls_settings(hub_: Hub, machine: str, ca: Path) -> settings.FederationSettings:
    m = hub_.machines[machine]
    (m.home / "config.toml").write_text(
        f'[federation]\nurl = "{hub_.url}"\nmachine = "{machine}"\nteam = "{hub_.team}"\nca = "{ca}"\n'
    )
    loaded = settings.load(m.home)
    assert loaded is not None and loaded.tls
    return loaded


async def test_tls_with_the_pinned_ca(folder: Path) -> None:
    ca = make_ca(folder, "team-ca")
    other_ca = make_ca(folder, "other-ca")
    tls_hub = Hub(folder, make_machines(folder, ("a", "b")), TEAM, tls=make_server_cert(folder, "team-ca"))
    await tls_hub.start()
    try:
        with trio.fail_after(GUARD):
            async with (
                open_transport(tls_settings(tls_hub, "a", ca)) as a,
                open_transport(tls_settings(tls_hub, "b", ca)) as b,
            ):
                await a.ensure_streams()
                await a.publish(subjects.msg(TEAM, "a", "b"), b"over tls", "id-1")
                got = await b.fetch("msg", timeout=2)
                assert [i.body for i in got] == [b"over tls"]
                await b.ack(got[0])

            # a client pinning another CA never connects: it keeps trying, and says why
            async with open_transport(tls_settings(tls_hub, "a", other_ca), connect=False) as stranger:
                with trio.move_on_after(3):
                    await stranger.connect()
                    pytest.fail("connected to a hub whose certificate its pinned CA did not sign")
                assert not stranger.status.connected
                assert "certificate" in (stranger.status.last_error or "").lower(), stranger.status
    finally:
        await tls_hub.kill()


async def test_the_status_follows_the_connection(team_hub: Hub) -> None:
    with trio.fail_after(GUARD):
        async with open_transport(team_hub.machines["a"].settings(team_hub)) as a:
            first = a.status
            assert first.connected and first.since is not None and first.reconnects == 0
            await team_hub.stop()
            with trio.fail_after(10):
                while a.status.connected:
                    await a.status_changed()
            assert a.status.since is not None and a.status.since >= first.since
            await team_hub.start()
            with trio.fail_after(15):
                while not a.status.connected:
                    await a.status_changed()
            assert a.status.reconnects == 1
        assert not a.status.connected  # closed with the context


async def test_a_refused_key_shows_in_the_status_and_connect_can_be_cancelled(
    folder: Path, team_hub: Hub
) -> None:
    stranger = make_machines(folder / "elsewhere", ("a",))[0]  # same name, a key the hub does not know
    with trio.fail_after(GUARD):
        async with open_transport(stranger.settings(team_hub), connect=False) as t:
            with trio.move_on_after(2) as scope:
                await t.connect()
            assert scope.cancelled_caught and not t.status.connected
            assert "authorization violation" in (t.status.last_error or "").lower(), t.status
