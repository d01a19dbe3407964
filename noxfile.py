"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s typecheck`, `nox -s bench`."""

from __future__ import annotations

import os
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

CHROMIUM = "/usr/bin/chromium"


def ensure_chromium(session: nox.Session) -> None:
    """The browser test drives Debian's Chromium (never a tool's own browser download)."""
    if os.path.exists(CHROMIUM):
        return
    if shutil.which("apt-get") and os.geteuid() == 0:
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "chromium", external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    else:
        session.error(
            f"the browser test needs Debian's chromium at {CHROMIUM}: sudo apt-get install chromium"
        )


def ensure_iproute2(session: nox.Session) -> None:
    """The federation's partition test makes network namespaces with Debian's iproute2 (`ip`), as
    root; elsewhere it is skipped with the reason."""
    if shutil.which("ip") or not (shutil.which("apt-get") and os.geteuid() == 0):
        return
    session.run("apt-get", "install", "-y", "-qq", "iproute2", external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})


def ensure_valgrind(session: nox.Session) -> None:
    """bench/instructions.py counts the broker's instructions under Debian's valgrind; its smoke
    run in the suite needs it."""
    if shutil.which("valgrind") or not (shutil.which("apt-get") and os.geteuid() == 0):
        return
    session.run("apt-get", "install", "-y", "-qq", "valgrind", external=True,
                env={"DEBIAN_FRONTEND": "noninteractive"})


def ensure_host_clis(session: nox.Session) -> dict[str, str]:
    """The real-host tests drive Claude Code and Codex from npm at pinned versions, installed
    into .nox/hostcli when missing (tests/hosts/clis.py). Without npm they skip, except on CI."""
    if shutil.which("npm") is None:
        if os.environ.get("CI"):
            session.error("CI runs the real-host tests (tests/hosts): install Node.js and npm")
        session.warn("npm not found: the real-host tests (tests/hosts) will be skipped")
        return {}
    # prints the bin folder it made sure of
    out = session.run("python", "-m", "tests.hosts.clis", silent=True)
    return {"AGENT_BRIDGE_HOST_BIN": str(out).strip().splitlines()[-1]}


# The whole suite in two passes. First every test that may share the machine, spread over
# pytest-xdist workers (`-n auto`: one per core; tests that must share a worker take an
# `xdist_group` mark). Then the tests marked `serial`, one at a time with nothing else of the
# suite running: the real hosts' TUIs under tmux, the benchmarks' smoke runs, the dashboard's
# fixed default port. Each pass prints its 15 slowest tests, so the cost stays visible in CI.
PASSES = (
    ("-m", "not serial", "-n", "auto", "--dist", "loadgroup", "--durations=15"),
    ("-m", "serial", "-n", "0", "--durations=15"),
)


@nox.session
def tests(session: nox.Session) -> None:
    """The suite in its two passes (PASSES); `nox -s tests -- ARGS` runs pytest once with ARGS
    instead (add `-n auto` to spread them over the cores)."""
    session.install("-e", ".[test,federation]")
    ensure_chromium(session)
    ensure_iproute2(session)
    ensure_valgrind(session)
    env = ensure_host_clis(session)
    if session.posargs:
        session.run("pytest", *session.posargs, env=env)
        return
    for args in PASSES:
        session.run("pytest", *args, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff, then import-linter's contracts on the module layers ([tool.importlinter] in pyproject.toml)."""
    session.install("ruff", "import-linter")
    session.run("ruff", "check", "agent_bridge", "tests", "bench", "docs", "noxfile.py")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".", "mypy")
    session.run("mypy", "agent_bridge")
    # The broker and its store, the relay and its ledger, the showing state machine and the SDK
    # adapter: no Any leaking out of a typed function, no bare generics.
    session.run("mypy", "--strict", "agent_bridge/broker", "agent_bridge/store", "agent_bridge/relay",
                "agent_bridge/common/ledger.py", "agent_bridge/core", "agent_bridge/federation")


@nox.session
def bench(session: nox.Session) -> None:
    """Every bench/bench_*.py (one JSON line each, appended to bench/results.jsonl), then a table.
    Fails when a line says "ok": false. `nox -s bench -- --quick` for tiny sizes."""
    import json

    # The reach and job benchmarks drive the real hosts with the tests' scripted model servers
    # (tests/hosts): they need the test dependencies and the pinned host CLIs, as `tests` does; the
    # federation ones a real nats-server and nats-py, as tests/federation do.
    session.install("-e", ".[test,federation]")
    env = ensure_host_clis(session)
    lines = []
    for script in sorted(os.listdir("bench")):
        if script.startswith("bench_") and script.endswith(".py"):
            out = session.run("python", f"bench/{script}", *session.posargs, silent=True, env=env)
            line = json.loads(str(out).strip().splitlines()[-1])
            print(json.dumps(line, ensure_ascii=False))
            lines.append(line)
    print(f"\n{'bench':<20} {'value':>10} {'baseline':>10} {'ratio':>8}  {'ok':<5} target")
    for line in lines:
        print(f"{line['bench']:<20} {line['value']:>10} {line['baseline']:>10} {line['ratio']:>8}  "
              f"{str(line['ok']).lower():<5} {line['target']}")
    missed = [line["bench"] for line in lines if not line["ok"]]
    if missed:
        session.error(f"targets missed: {', '.join(missed)}")
