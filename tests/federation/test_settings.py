"""[federation] in config.toml: good tables parse; every bad value is one line naming the key, what is
allowed and what was given (STYLE 7), from the library and from the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_bridge.common import config
from agent_bridge.federation import settings, subjects
from agent_bridge.federation.errors import SettingsError


def write(home: Path, text: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(text, encoding="utf-8")


def test_no_table_no_federation(tmp_path: Path) -> None:
    assert settings.load(tmp_path) is None
    write(tmp_path, "max_jobs = 2\n")
    assert settings.load(tmp_path) is None


def test_a_full_table(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    write(
        tmp_path,
        '[federation]\nurl = "tls://hub-1.example:4222, tls://hub-2.example"\nmachine = "lap-top2"\n'
        'team = "acme"\nseed = "keys/m.nk"\nca = "ca.pem"\n',
    )
    got = settings.load(tmp_path)
    assert got == settings.FederationSettings(
        url="tls://hub-1.example:4222, tls://hub-2.example",
        servers=("tls://hub-1.example:4222", "tls://hub-2.example"),
        machine="lap-top2",
        team="acme",
        seed=tmp_path / "keys/m.nk",
        ca=tmp_path / "ca.pem",
    )
    assert got.tls
    # the broker's own settings still load beside it
    assert config.load(tmp_path, env={}).max_jobs == config.MAX_JOBS_DEFAULT


def test_defaults(tmp_path: Path) -> None:
    write(tmp_path, '[federation]\nurl = "nats://127.0.0.1:4222"\nmachine = "a"\n')
    got = settings.load(tmp_path)
    assert got is not None
    assert (got.team, got.seed, got.ca, got.tls) == ("ab", tmp_path / "machine.nk", None, False)


BAD = [
    ('url = "http://hub:4222"\nmachine = "a"', "federation.url", "http://hub:4222"),
    ('url = "hub:4222"\nmachine = "a"', "federation.url", "hub:4222"),
    ('url = "nats://hub:99999"\nmachine = "a"', "federation.url", "99999"),
    ('url = "nats://"\nmachine = "a"', "federation.url", "no host"),
    ('url = "nats://u:p@hub"\nmachine = "a"', "federation.url", "credentials"),
    ('url = "nats://a:1,tls://b:2"\nmachine = "a"', "federation.url", "same scheme"),
    ('url = 4222\nmachine = "a"', "federation.url", "4222"),
    ('machine = "a"', "federation.url", "missing"),
    ('url = "nats://h"', "federation.machine", "missing"),
    ('url = "nats://h"\nmachine = "Laptop"', "federation.machine", "'Laptop'"),
    ('url = "nats://h"\nmachine = "a.b"', "federation.machine", "'a.b'"),
    ('url = "nats://h"\nmachine = "' + "x" * 33 + '"', "federation.machine", "x" * 33),
    ('url = "nats://h"\nmachine = "a"\nteam = "a_b"', "federation.team", "'a_b'"),
    ('url = "nats://h"\nmachine = "a"\nteam = "x-presence"', "federation.team", "-presence"),
    ('url = "nats://h"\nmachine = "a"\nseed = 3', "federation.seed", "3"),
    ('url = "tls://h"\nmachine = "a"', "federation.ca", "required with tls://"),
    ('url = "tls://h"\nmachine = "a"\nca = "/no/such/ca.pem"', "federation.ca", "no such file"),
    ('url = "nats://h"\nmachine = "a"\nca = "/etc/hostname"', "federation.ca", "tls://"),
    ('url = "nats://h"\nmachine = "a"\nmachines = "b"', "federation.machines", "unknown setting"),
]


@pytest.mark.parametrize("body, key, given", BAD)
def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path, body: str, key: str, given: str) -> None:
    write(tmp_path, "[federation]\n" + body + "\n")
    with pytest.raises(SettingsError) as caught:
        settings.load(tmp_path)
    text = str(caught.value)
    assert "\n" not in text and key in text and given in text, text
    assert text.startswith(str(tmp_path / "config.toml")), text


def test_not_a_table(tmp_path: Path) -> None:
    write(tmp_path, 'federation = "nats://h"\n')
    with pytest.raises(SettingsError, match=r"federation: expected a table"):
        settings.load(tmp_path)


def test_a_file_that_does_not_parse(tmp_path: Path) -> None:
    write(tmp_path, "[federation\n")
    with pytest.raises(SettingsError, match="cannot parse"):
        settings.load(tmp_path)


def test_the_command_says_it_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write(home, '[federation]\nurl = "nats://h"\nmachine = "Bad Name"\n')
    out = subprocess.run(
        [sys.executable, "-m", "agent_bridge", "machine"],
        capture_output=True,
        text=True,
        env={**os.environ, "AGENT_BRIDGE_HOME": str(home)},
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "federation.machine" in out.stderr and "'Bad Name'" in out.stderr


def test_the_default_machine_name_is_a_valid_name(monkeypatch: pytest.MonkeyPatch) -> None:
    for host, expected in [
        ("Laptop.local", "laptop"),
        ("my_box", "my-box"),
        ("---", "machine"),
        ("é", "machine"),
        ("x" * 40, "x" * 32),
    ]:
        monkeypatch.setattr(settings.socket, "gethostname", lambda h=host: h)
        assert settings.default_machine() == expected
        assert subjects.is_name(settings.default_machine())
