"""`agent-bridge demo`: a guided run with four simulated sessions through the real IPC
client, for someone without Claude Code, Codex or opencode at hand."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import trio

from agent_bridge.common import domain, paths
from agent_bridge.ipc.client import BridgeClient, BrokerGone, open_bridge_client

DEMO_HOP_LIMIT = "4"  # a temporary broker uses a short limit so the reply chain goes passive quickly
DEMO_TOPIC = "database"
PUSH_WAIT = 1.5  # how long a simulated session waits for a push it may not get (the job runner)
UP_TIMEOUT = 60  # seconds `up --detach` may take (it gives up after 20)
DOWN_TIMEOUT = 60  # seconds `down` may take (it waits up to 20 for a broker starting, 10 for it to stop)


# What ends the demo: Ctrl-C (SIGINT), a closed terminal (SIGHUP), `timeout` or a process manager
# (SIGTERM). Windows has no SIGHUP.
ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def say(text: str = "") -> None:
    try:
        print(text, flush=True)
    except OSError:  # the terminal is gone (SIGHUP): the demo still cleans up after itself
        pass


class _Ending:
    """SIGTERM and SIGHUP end the demo the one way Ctrl-C does: its broker stopped, its temporary
    folder removed. While the simulated sessions run (Trio), SIGINT is Trio's (KeyboardInterrupt,
    or the wait for Ctrl-C at the end) and the other two are raised again as SIGINT. Before that
    (its broker starting: `up` interrupted halfway would leave a broker nobody stops) and after
    (the clean-up), all three are only noted: the demo finishes starting, skips the run and
    cleans up. A SIGINT ignored by whoever started the demo (a script's `&`) stays ignored."""

    def __init__(self) -> None:
        self.asked = False  # a signal came while starting: skip the run
        self.running = False
        self.takes_sigint = signal.getsignal(signal.SIGINT) is signal.default_int_handler
        taken = (*ENDING_SIGNALS, signal.SIGINT) if self.takes_sigint else ENDING_SIGNALS
        self.before = {signum: signal.getsignal(signum) for signum in taken}

    def __enter__(self) -> _Ending:
        for signum in self.before:
            signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)

    def _note(self, signum: int, frame: object) -> None:
        if not self.running:
            self.asked = True
        elif not self.takes_sigint:
            raise KeyboardInterrupt  # nobody takes SIGINT: end the run here
        else:
            signal.raise_signal(signal.SIGINT)  # Trio's handler, or the wait for Ctrl-C, takes it

    @contextlib.contextmanager
    def running_trio(self) -> Iterator[None]:
        """The run, ended by any of the signals as by Ctrl-C (KeyboardInterrupt, or the wait for
        it); at once if one came before."""
        if self.takes_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # Trio takes it over from this one
        self.running = True
        try:
            if self.asked:
                raise KeyboardInterrupt
            yield
        finally:
            self.running = False
            if self.takes_sigint:
                signal.signal(signal.SIGINT, self._note)


def main(ns: argparse.Namespace) -> int:
    with _Ending() as ending:
        return _main(ns, ending)


def _main(ns: argparse.Namespace, ending: _Ending) -> int:
    own_home = ns.home is None  # never the real state folder unless asked for by name
    given = None if own_home else Path(ns.home).expanduser().absolute()
    if given is not None:
        home = given
        try:
            paths.check_home(home)  # never another user's folder: neither its broker nor its database
        except paths.HomeError as exc:
            print(f"agent-bridge demo: {exc}", file=sys.stderr)
            return 1
        print(
            f"agent-bridge demo: warning: --home {home}: the demo writes to this state folder: four "
            f"simulated sessions, their messages and a pinned decision on topic {DEMO_TOPIC!r} for the "
            f"folder {demo_project(home)} (no real session's folder). Undo with `agent-bridge retract "
            f"{DEMO_TOPIC}` and `agent-bridge forget` (see `agent-bridge sessions`).",
            file=sys.stderr,
            flush=True,
        )
    starting: subprocess.Popen[bytes] | None = None  # the `up` that started the demo's broker
    made: Path | None = None
    try:
        home = given if given is not None else (made := Path(tempfile.mkdtemp(prefix="agent-bridge-demo-")))
        env = {**os.environ, "AGENT_BRIDGE_HOME": str(home)}
        if own_home:
            env.setdefault("AGENT_BRIDGE_HOP_LIMIT", DEMO_HOP_LIMIT)
            env["AGENT_BRIDGE_WEB_PORT"] = "0"
        record = paths.read_broker_json(home)
        if not (record and isinstance(record.get("pid"), int) and paths.pid_alive(record["pid"])):
            say(f"Starting a broker in {home} …")
            with tempfile.TemporaryFile() as why:
                # In a session of its own: a closed terminal's SIGHUP, or `timeout` signalling
                # the whole group, leaves it to finish starting the broker, which the clean-up
                # then stops (else the broker it spawns would come up after the clean-up looked).
                starting = subprocess.Popen(
                    [sys.executable, "-m", "agent_bridge", "up", "--detach"], env=env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=why, start_new_session=True,
                )
                code = starting.wait(timeout=UP_TIMEOUT)
                # killed by the signal that ends the demo, sent to its group before `up` had a
                # session of its own (then it started nothing): not a failure to report
                if code != 0 and not (code < 0 and ending.asked):
                    why.seek(0)
                    said = why.read().decode("utf-8", "replace").strip()
                    say(f"agent-bridge demo: could not start a broker: {said}")
                    return 1
            record = paths.read_broker_json(home)
        try:
            with ending.running_trio():
                assert record is not None
                finished = run_sessions(_run, home, record, not ns.no_wait, starting is not None, own_home)
        except KeyboardInterrupt:  # a signal came while its broker started: the run is skipped
            finished = False
        if not finished:
            say("\nInterrupted.")
        return 0
    finally:
        _clean_up(given or made, starting, remove=made)


def run_sessions(run: Callable[..., Awaitable[None]], *args: Any) -> bool:
    """Run the simulated sessions; False if Ctrl-C (or a signal raised again as it) ended them.

    Trio raises KeyboardInterrupt in whichever task runs when the signal comes. In a client's
    reader task, that closes the connection first, so a request waiting on it fails with
    BrokerGone in the same group: a consequence of the interruption, not an error to show."""
    try:
        trio.run(run, *args)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        return False
    return True


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, alone or with only the closed connections it caused, in any nesting of groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if not isinstance(exc, BaseExceptionGroup):
        return False
    ki, rest = exc.split(KeyboardInterrupt)
    return ki is not None and (rest is None or rest.split(BrokerGone)[1] is None)


def _clean_up(home: Path | None, starting: subprocess.Popen[bytes] | None, remove: Path | None) -> None:
    """Stop the broker the demo started (once the `up` that starts it has finished) and remove
    the demo's temporary folder. No signal interrupts it (_Ending notes them), and `down` runs in
    a session of its own, out of reach of one sent to the demo's whole group."""
    try:
        if starting is not None and home is not None:
            try:
                starting.wait(timeout=UP_TIMEOUT)  # interrupted while it started the broker
            except subprocess.TimeoutExpired:
                starting.kill()  # `down` still waits for a broker holding the lock, then stops it
                starting.wait()
            env = {**os.environ, "AGENT_BRIDGE_HOME": str(home)}
            down = subprocess.run([sys.executable, "-m", "agent_bridge", "down"], env=env,
                                  capture_output=True, text=True, timeout=DOWN_TIMEOUT,
                                  start_new_session=True)
            if down.returncode != 0:
                say(f"agent-bridge demo: could not stop its broker: {down.stderr.strip()}")
            elif "stopped" in down.stdout:
                say("Stopped the demo broker.")
    finally:
        if remove is not None:
            shutil.rmtree(remove, ignore_errors=True)


def demo_project(home: Path) -> str:
    """The simulated sessions' folder: inside the demo's state folder, so a decision scoped to it
    concerns no real session even when the demo runs on a real home (--home)."""
    return domain.normalize_folder(str(home / "demo-project"))


async def _run(home: Path, record: dict[str, Any], wait: bool, started: bool, own_home: bool) -> None:
    project = demo_project(home)
    sessions = [
        ("claude", "interactive", "the Claude Code session"),
        ("codex", "interactive", "the Codex session"),
        ("opencode", "interactive", "the opencode session"),
        ("codex", "job", "a headless `codex exec` job"),
    ]
    async with trio.open_nursery() as nursery:
        clients: list[tuple[BridgeClient, Any, dict[str, Any]]] = []
        for agent, kind, _ in sessions:
            client, pushes = await nursery.start(_connect, record["socket"], agent, kind, project)
            assert client.hello is not None
            clients.append((client, pushes, client.hello["session"]))
        hop_limit = int(clients[0][0].hello["hopLimit"]) if clients[0][0].hello else 10
        say("\n1. Four simulated sessions connected through the real bridge protocol:")
        for (_agent, kind, what), (_, _, s) in zip(sessions, clients, strict=True):
            say(f"   {s['name']:<22} {kind:<12} ({what})")

        claude, codex, opencode, job = clients
        say("\n2. The owner answers a question; the Claude session records it as a pinned decision")
        say("   for the demo's project folder (every session working there):")
        result = await claude[0].request("decide", topic=DEMO_TOPIC, text="PostgreSQL 16, no ORM")
        decision = result["decision"]
        say(f"   decide(topic={DEMO_TOPIC!r}) -> {domain.decision_line(decision)}")
        say(f"   deliveredTo: {', '.join(result['deliveredTo'])}   (the job runner is never notified)")
        for client, pushes, s in clients:
            got = await _drain(client, pushes)
            kinds = [m["kind"] for m in got]
            status = "received the decision notice" if "decision" in kinds else "received nothing"
            say(f"   {s['name']:<22} {status}")

        say(f"\n3. A reply chain between the two interactive sessions (hop limit {hop_limit}):")
        sender, receiver = claude, codex
        parent: str | None = None
        for n in range(1, hop_limit + 2):
            args: dict[str, Any] = {"to": receiver[2]["name"], "text": f"reply #{n}"}
            if parent:
                args["reply_to"] = parent
            message = (await sender[0].request("send", **args))["message"]
            active = domain.is_active(message["hop"], hop_limit)
            mode = "active: may wake the recipient" if active else "passive: delivered, wakes no one"
            say(f"   {sender[2]['name']} -> {receiver[2]['name']}  hop {message['hop']:>2}  {mode}")
            await _drain(receiver[0], receiver[1])
            parent = message["id"]
            sender, receiver = receiver, sender

        say("\n4. An agent kind addresses the one connected session of that agent in the project:")
        sent = (await claude[0].request("send", to="opencode", text="the schema is in db/"))["message"]
        got = await _drain(opencode[0], opencode[1])
        status = "received it" if [m["id"] for m in got] == [sent["id"]] else "received nothing"
        say(f"   send(to='opencode') -> {opencode[2]['name']} {status}")

        say("\n5. The job runner can look decisions up too:")
        found = await job[0].request("decisions")
        say(f"   decisions() -> {[d['topic'] for d in found]}")

        web = record.get("web")
        url_file = home / paths.DASHBOARD_URL
        if wait:
            say("\n6. The dashboard shows the sessions, the messages and the decision:")
            say(f"   {_read(url_file) or web or 'not serving'}")
            say(
                "   Look at: Sessions (four connected), Messages (the reply chain), "
                f"Decisions ({DEMO_TOPIC})."
            )
            # the asked-for Ctrl-C ends it quietly
            with trio.open_signal_receiver(signal.SIGINT) as interrupts:
                say("\nPress Ctrl-C to end the demo.")
                async for _ in interrupts:
                    break
            say("")
        else:
            ends = ["the four sessions disconnect"]
            if started:
                ends.append("the demo's broker stops")
            if own_home:
                ends.append("its temporary folder is removed")
            say(f"\n6. With --no-wait the demo ends here: {', '.join(ends)}.")
            say("   Run `agent-bridge demo` without --no-wait to look at them on the dashboard.")
        nursery.cancel_scope.cancel()


async def _connect(
    socket: str, agent: str, kind: str, project: str, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    hello = {"agent": agent, "project": project, "kind": kind}
    async with open_bridge_client(socket, hello) as (client, pushes):
        await client.request("whoami")  # a session in use, as an agent's first tool call makes it
        task_status.started((client, pushes))
        await trio.sleep_forever()


async def _drain(client: BridgeClient, pushes: Any) -> list[dict[str, Any]]:
    """Take what the broker pushed, acknowledge it (the demo's 'agent' has seen it)."""
    got: list[dict[str, Any]] = []
    with trio.move_on_after(PUSH_WAIT):
        async for frame in pushes:
            if frame.get("push") == "message":
                got.append(frame["message"])
                break
    while True:
        try:
            frame = pushes.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if frame.get("push") == "message":
            got.append(frame["message"])
    if got:
        await client.request("ack", ids=[m["id"] for m in got])
    return got


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
