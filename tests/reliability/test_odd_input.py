"""Issue 23, point 3: odd input a user can give ends in one clear line, never a traceback, a
vague "broker did not answer", or a silent "nothing here". Real CLI processes, a real broker."""

from __future__ import annotations

import contextlib
import io
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_bridge.broker import control  # noqa: F401 - imported before the fork to `nobody`
from agent_bridge.cli import main as cli
from agent_bridge.ipc import blocking
from tests.conftest import run_cli
from tests.reliability.test_permissions import as_nobody, needs_root

pytestmark = pytest.mark.slow


def one_line(done, *words: str, code: int | None = None) -> str:
    assert done.returncode != 0, done
    if code is not None:
        assert done.returncode == code, done
    assert "Traceback" not in done.stderr and "Error:" not in done.stderr.split(":", 1)[0], done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def test_bytes_that_are_not_utf8_are_refused_in_one_line(broker, env):
    assert run_cli(env, "decide", "db", "PostgreSQL", "--scope", "all").returncode == 0  # a database to read
    one_line(run_cli(env, "decisions", "\udcff"), "query", "not valid text", code=2)
    one_line(
        run_cli(env, "decisions", "--scope", '{"project": "/a\udcff"}'), "scope", "not valid text", code=2
    )


def test_forget_with_an_absurd_duration_is_one_line_and_the_broker_answers_any_integer(broker, env, home):
    for duration in ("99999999999999999999d", "9" * 400 + "w"):
        one_line(run_cli(env, "forget", "--gone-for", duration), "--gone-for", "at most", code=2)
    # what the CLI no longer sends, another client still may: the broker answers, and serves on
    assert blocking.call(home, "forget", goneForMs=10**30) == {"forgotten": []}
    assert blocking.call(home, "forget", goneForMs=2**63) == {"forgotten": []}
    assert broker.status()["pid"] == broker.pid


@pytest.fixture
def home_is_a_file(env: dict[str, str]) -> Iterator[tuple[dict[str, str], Path]]:
    folder = Path(tempfile.mkdtemp(prefix="ab-file-"))
    try:
        target = folder / "home"
        target.write_text("not a folder\n")
        yield {**env, "AGENT_BRIDGE_HOME": str(target)}, target
    finally:
        shutil.rmtree(folder)


@pytest.mark.parametrize("argv", [
    ["decide", "db", "PostgreSQL"], ["send", "someone", "hi"], ["forget", "someone"], ["decisions"],
    ["sessions"], ["dashboard"], ["up", "--detach"], ["up"], ["status"], ["down"], ["retract", "db"],
])
def test_a_home_that_is_a_regular_file_is_refused_and_nothing_is_created(home_is_a_file, argv):
    env, target = home_is_a_file
    before = sorted(os.listdir(target.parent))
    one_line(run_cli(env, *argv, timeout=60), str(target), "not a folder")
    assert sorted(os.listdir(target.parent)) == before
    assert target.read_text() == "not a folder\n"


@pytest.fixture
def traversable() -> Iterator[Path]:
    """A folder `nobody` can reach (pytest's tmp_path is under a 0700 folder)."""
    folder = Path(tempfile.mkdtemp(prefix="ab-ro-"))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_root
def test_up_detach_in_a_read_only_folder_is_one_line(traversable: Path):
    """As a user who cannot write in the (empty) state folder: the same one line as plain `up`,
    not a traceback ending in PermissionError on broker.lock. (Root writes anywhere, so the
    user is `nobody`, in a fork of this process: it cannot start interpreters of its own here,
    and does not need to, since the refusal comes before any is started.)"""
    nobody = pwd.getpwnam("nobody")
    home = traversable / "home"
    home.mkdir()
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    home.chmod(0o500)

    def attempt(*argv: str) -> dict[str, object]:
        os.environ["AGENT_BRIDGE_HOME"] = str(home)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
        return {"code": code, "stderr": err.getvalue()}

    for argv in (["up", "--detach"], ["up"]):
        seen = as_nobody(lambda argv=argv: attempt(*argv))
        assert "raised" not in seen, seen
        result = seen["result"]
        assert result["code"] == 1, seen
        lines = result["stderr"].strip().splitlines()
        assert len(lines) == 1 and str(home) in lines[0] and "cannot write" in lines[0], seen
    assert os.listdir(home) == []
