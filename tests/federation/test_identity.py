"""The machine's seed: created 0600 from the first byte, a looser one refused in one line; the
commands that show it; the package without the federation extra."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_bridge.federation import identity, keys
from agent_bridge.federation.errors import IdentityError

pytest.importorskip("nkeys", reason="the federation extra: pip install -e '.[test,federation]'")


def test_the_seed_is_created_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "home" / "machine.nk"
    made = identity.ensure(path)
    assert made.created and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert made.public_key.startswith("U") and keys.is_user_public_key(made.public_key)
    assert path.read_text().strip().startswith("SU")
    assert [p.name for p in path.parent.iterdir()] == ["machine.nk"]  # no temporary file left
    again = identity.ensure(path)
    assert (again.public_key, again.created) == (made.public_key, False)


def test_the_seed_is_never_readable_by_others_even_while_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file the creation opens is opened with mode 0600 (whatever the umask)."""
    modes: list[int] = []
    real_open = os.open

    def spy(path: str, flags: int, mode: int = 0o777, *args: object, **kwargs: object) -> int:
        if flags & os.O_CREAT:
            modes.append(mode)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", spy)
    old = os.umask(0)
    try:
        identity.ensure(tmp_path / "machine.nk")
    finally:
        os.umask(old)
    assert modes == [0o600]


def test_first_runs_at_once_keep_one_seed(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "machine.nk"
    keys_seen: list[str] = []
    start = threading.Barrier(8)

    def first_run() -> None:
        start.wait()
        keys_seen.append(identity.ensure(path).public_key)

    threads = [threading.Thread(target=first_run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(keys_seen) == 8 and len(set(keys_seen)) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["machine.nk"]


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620, 0o602])
def test_a_looser_seed_is_refused_in_one_line(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "machine.nk"
    identity.ensure(path)
    path.chmod(mode)
    with pytest.raises(IdentityError) as caught:
        identity.load(path)
    assert (
        "\n" not in str(caught.value) and f"{mode:04o}" in str(caught.value) and "0600" in str(caught.value)
    )
    with pytest.raises(IdentityError):
        identity.ensure(path)  # never repaired silently


def test_not_a_user_seed(tmp_path: Path) -> None:
    path = tmp_path / "machine.nk"
    path.write_text("SAnot-a-user-seed\n")
    path.chmod(0o600)
    with pytest.raises(IdentityError, match="not an NKEY user seed"):
        identity.load(path)
    path.write_text("SU" + "A" * 56 + "\n")
    with pytest.raises(IdentityError, match="not an NKEY seed"):
        identity.load(path)


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent_bridge", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "AGENT_BRIDGE_HOME": str(home)},
        timeout=60,
    )


def test_machine_command(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = run(home, "machine", "--json")
    assert first.returncode == 0, first.stderr
    shown = json.loads(first.stdout)
    assert shown["created"] and not shown["configured"] and keys.is_user_public_key(shown["public_key"])
    assert stat.S_IMODE((home / "machine.nk").stat().st_mode) == 0o600
    (home / "config.toml").write_text('[federation]\nurl = "nats://h"\nmachine = "devbox"\nteam = "acme"\n')
    text = run(home, "machine")
    assert text.returncode == 0
    assert f"devbox={shown['public_key']}" in text.stdout and "machine     devbox\n" in text.stdout
    (home / "machine.nk").chmod(0o644)
    loose = run(home, "machine")
    assert loose.returncode == 1 and loose.stderr.count("\n") == 1 and "0644" in loose.stderr


def test_hub_config_command_refuses_bad_members_in_one_line(tmp_path: Path) -> None:
    key = identity.ensure(tmp_path / "m.nk").public_key
    for args, needle in [
        ([f"a={key}", f"b={key}"], "same public key"),
        ([f"a={key}", f"a={identity.ensure(tmp_path / 'n.nk').public_key}"], "given twice"),
        ([f"Ab={key}"], "machine name"),
        (["a=" + key[:-1] + ("A" if key[-1] != "A" else "B")], "public key"),  # checksum broken
        ([key], "NAME=PUBKEY"),
        ([f"a={key}", "--port", "70000"], "--port"),
        ([f"a={key}", "--team", "A"], "--team"),
    ]:
        out = run(tmp_path / "home", "federation", "hub-config", *args)
        assert (
            out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1 and needle in out.stderr
        ), (args, out.stderr)


def test_the_package_imports_without_the_extra_and_says_what_to_install(tmp_path: Path) -> None:
    """With nats and nkeys unimportable: every federation module imports; using one is one line."""
    script = textwrap.dedent(f"""
        import sys
        for name in ("nats", "nkeys"):
            sys.modules[name] = None  # import fails, as without the extra
        import importlib, pkgutil, agent_bridge.federation as f
        for m in pkgutil.iter_modules(f.__path__):
            importlib.import_module("agent_bridge.federation." + m.name)
        from agent_bridge.federation import identity
        from agent_bridge.federation.errors import MissingExtra
        try:
            identity.ensure(__import__("pathlib").Path({str(tmp_path / "x.nk")!r}))
        except MissingExtra as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("pip install 'agent-bridge[federation]'"), out.stdout
    assert out.stdout.count("\n") == 1
    home = tmp_path / "home"
    cli = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['nkeys'] = None; "
            "from agent_bridge.cli.main import main; sys.exit(main(['machine']))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "AGENT_BRIDGE_HOME": str(home)},
        timeout=60,
    )
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "agent-bridge[federation]" in cli.stderr


def test_local_problems_for_doctor(tmp_path: Path) -> None:
    from agent_bridge.federation import checks

    home = tmp_path / "home"
    assert checks.local_problems(home) == []  # no [federation]: nothing to say
    home.mkdir()
    (home / "config.toml").write_text('[federation]\nurl = "nats://h"\nmachine = "a"\n')
    (problem,) = checks.local_problems(home)
    assert "no seed yet" in problem and "agent-bridge machine" in problem
    identity.ensure(home / "machine.nk")
    assert checks.local_problems(home) == []
    (home / "machine.nk").chmod(0o640)
    (problem,) = checks.local_problems(home)
    assert "0640" in problem
    (home / "config.toml").write_text('[federation]\nurl = "nats://h"\nmachine = "A"\n')
    (problem,) = checks.local_problems(home)
    assert "federation.machine" in problem and "\n" not in problem
