"""`agent-bridge hook wake --agent HOST`: the idle-wake waiter (SPEC §3 "Reach" item 3).

Claude Code runs it as an `asyncRewake` Stop hook: in the background, and when it exits 2 its
stderr reaches the model as a new turn, with no keystroke, also between tool calls of a turn that
is running (seen with Claude Code 2.1.332, NOTES.md). So the waiter:

1. leaves at once unless the host runs it in the background (`Host.runs_waiter`: Claude Code
   2.1.332 or later, by its transcript, and not `claude -p`, which runs asyncRewake hooks
   synchronously and would be held open);
2. finds its host process (pid **and** start time) and watches it: it never outlives it;
3. keeps one waiter per session: a lock in `<home>/waiters/` held for its life, so the Stop of
   every turn does not add one;
4. lets the Stop hook of the same Stop go first: Claude Code starts both at once, and what waits
   at the Stop is the Stop hook's to hand over (as additionalContext, with no error label). The
   Stop hook marks its end with the Stop's `prompt_id` (`mark_idle`); the waiter waits for that
   mark, or for a busy one (at most STOP_HOOK_WAIT);
5. waits on the broker (`wait_active`) until an **active** message waits for its session (passive
   ones never wake anyone);
6. leaves it to the PostToolUse and Stop hooks while the session is busy: the UserPromptSubmit
   hook marks a turn's start (`mark_busy`), the Stop hook its end. A busy session gets the message
   between tool calls or at its Stop without an error label; Claude Code would show the waiter's
   as "Stop hook feedback" (seen with 2.1.332). Claude Code 2.1.332 runs the UserPromptSubmit
   hook of a prompt typed while the previous turn's Stop hooks still run, so a Stop hook may end
   after the next turn began: it leaves a busy mark written by a hook that the host started after
   it (`launch_stamp`) as it is (seen under load: the late "idle" let the waiter take a mid-turn
   message). A Stop hook that handed messages over continued the turn: it marks it busy, and the
   turn's next Stop ends it;
7. hands it over as the Stop and PostToolUse hooks do (`handover`: fetch, write, then
   acknowledge), the "write" being `Host.wake`: Claude Code, stderr and exit 2; Codex, `codex queue
   --resume` (acknowledged once Codex says it queued it), after which the waiter marks the session
   busy and goes on waiting. Killed before its write, it acknowledges nothing.

Codex has no background hooks: its Stop hook starts the waiter as a detached process (`spawn`),
naming the host (pid and start time) in AGENT_BRIDGE_WAKE_HOST.

No broker: it waits for one (looking every few seconds) as long as its host lives. Any failure:
exit 0, one line in broker.log.

Its session's two files in `<home>/waiters/` (its lock and the busy/idle mark) go when the session
ends with its host. The waiter sees that end itself (the pidfd), or, as Claude Code ends it at its
exit with SIGTERM while the host still runs (NOTES.md), leaves at once and lets a child of its own,
detached, see it (`outlive`): the host's exit is not held up, and the child releases the lock so a
waiter of a session that goes on (a SIGTERM for another reason) is not kept out.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent_bridge import hosts
from agent_bridge.common import marks, paths, procinfo
from agent_bridge.hooks import common

EVENT = "Stop"
WAIT_MS = 50_000  # one `wait_active` request; below the broker's limit (WAIT_ACTIVE_MAX_MS), then asked again
ANSWER_SLACK = 10.0  # seconds past WAIT_MS a broker may take to answer before the waiter reconnects
NO_BROKER_RETRY = 2.0  # seconds between looks for a broker when none runs
HOST_POLL = 1.0  # seconds between looks at the host where no pidfd exists (not Linux)
WAITERS_DIR = marks.WAITERS_DIR
HOST_ENV = "AGENT_BRIDGE_WAKE_HOST"  # "pid:start" of the host, from a Stop hook that starts the waiter
FRONT_ENV = "AGENT_BRIDGE_WAKE_FRONT"  # "pid:start" of the host's front (front_of), when it has one
STOP_HOOK_WAIT = 15.0  # seconds the waiter lets the Stop hook of its Stop go first (the hook's timeout is 10)
STOP_MARK_POLL = 0.02  # seconds between looks at the Stop hook's mark
BUSY_POLL = 0.1  # seconds between looks at the session's mark while it is busy and a message waits
BUSY = marks.BUSY
INTERRUPTED = "interrupted"  # in an idle mark where a prompt id would be: the turn was cut short
HOST_END_GRACE = 30.0  # seconds a waiter ended by SIGTERM waits (detached) for its host to end


def main(agent: str) -> int:
    home = paths.home()
    try:
        given = os.environ.get(HOST_ENV)  # started by a Stop hook (Codex): its host, by pid and start time
        host, chain = given_host(given) if given else hosts.current_host()  # before anything detaches
        front = given_host(os.environ.get(FRONT_ENV, ""))[0] if os.environ.get(FRONT_ENV) else None
        hook = common.read_input()
        target = hosts.by_name(agent) or hosts.DEFAULT
        if not target.runs_waiter(hook, os.environ):
            return 0
        if host is None:
            common.log(home, f"wake ({agent})", "no agent host among the ancestors to watch: not waiting")
            return 0
        if os.environ.get(FRONT_ENV) and front is None:
            return 0  # the session's front (a Codex TUI) already ended: nobody to wake
        watch = HostWatch(host, front)
        try:
            if not watch.alive():
                return 0
            watch.stop_on_sigterm()
            lock = marks.hold_lock(home, hook.session_id)
            if lock is None:
                return 0  # this session's waiter is already waiting
            try:
                waits = after_stop_hook(home, hook, watch)  # False: the host ended or stopped it
                code = wait(home, agent, hook, host, chain, watch) if waits else 0
                if code == 0 and watch.ended():
                    marks.forget_files(home, hook.session_id)  # the session ended with its host
                elif code == 0 and watch.stopped:
                    outlive(home, hook.session_id, watch, lock)
                return code
            finally:
                os.close(lock)
        finally:
            watch.close()
    except Exception as exc:  # noqa: BLE001 - whatever it is, the host goes on
        common.log(home, f"wake ({agent})", f"not waiting: {type(exc).__name__}: {exc}")
    return 0


def wait(home: Path, agent: str, hook: common.HookInput, host: procinfo.Proc, chain: list[procinfo.Proc],
         watch: HostWatch) -> int:
    """Until the host ends (0) or an active message was handed over (2)."""
    from agent_bridge.hooks import handover

    target = hosts.by_name(agent) or hosts.DEFAULT

    def write(text: str) -> None:
        if watch.stopped:  # the host is ending it (SIGTERM): a message written now would be lost
            raise WakeFailed("the waiter was stopped (SIGTERM) before it wrote")
        if not target.wake(text, hook):
            raise WakeFailed(f"{target.title} did not take the message")  # so nothing is acknowledged

    while True:
        found = wait_active(home, hook.session_id, watch)
        if found is None:
            return 0  # the host is gone
        if not found:
            continue
        # a turn runs: its PostToolUse or Stop hook hands it over, unless the person cut it short
        def cut() -> bool:
            return cut_short(home, hook, target)

        if stands_aside(read_mark(home, hook.session_id), cut, target):
            while stands_aside(read_mark(home, hook.session_id), cut, target):
                if watch.wait(BUSY_POLL):
                    return 0
            continue
        try:
            handed = handover.hand_over(home, agent, EVENT, hook, host, chain, write, wake=True)
        except WakeFailed as exc:
            common.log(home, f"wake ({agent})", f"{exc}; the message waits for the session's next hook")
            return 0
        if handed and not target.spawned_waiter:
            return 2  # Claude Code's asyncRewake: exit 2 gives the model what was written to stderr
        if handed:
            mark_busy(home, hook, None)  # the woken turn runs; its Stop marks the session idle again


def cut_short(home: Path, hook: common.HookInput, target: hosts.Host) -> bool:
    """The busy turn was cut short (Esc) where the host runs no hook for that
    (`Host.turn_interrupted`, after the busy mark was written): the session is idle."""
    try:
        since = session_mark(home, hook.session_id).stat().st_mtime
    except OSError:
        return False
    return target.turn_interrupted(hook, since)


class WakeFailed(Exception):
    """The host did not take the message (`Host.wake` said so)."""


def given_host(value: str) -> tuple[procinfo.Proc | None, list[procinfo.Proc]]:
    """The host a Stop hook named ("pid:start"), if that process still runs with that start."""
    try:
        pid, start = (int(part) for part in value.split(":", 1))
    except ValueError:
        return None, []
    found = procinfo.describe(pid)
    if found is None or found[0].start != start:
        return None, []
    return found[0], [found[0]]


def spawn(agent: str, raw: bytes, host: procinfo.Proc | None, front: procinfo.Proc | None = None) -> None:
    """Start this session's waiter as a detached process (for a host without background hooks:
    Codex), handing it the Stop hook's input, its host and the host's front (front_of). It holds
    none of the hook's pipes, so the host does not wait for it; it ends with the host or the
    front, and leaves at once when a waiter for the session already waits."""
    import subprocess
    import sys

    if host is None:
        return
    env = dict(os.environ, **{HOST_ENV: f"{host.pid}:{host.start}"})
    env.pop(FRONT_ENV, None)
    if front is not None:
        env[FRONT_ENV] = f"{front.pid}:{front.start}"
    proc = subprocess.Popen([sys.executable, "-m", "agent_bridge", "hook", "wake", "--agent", agent],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True, env=env)
    assert proc.stdin is not None
    try:
        proc.stdin.write(raw)
    finally:
        proc.stdin.close()


def front_of(host: procinfo.Proc | None) -> procinfo.Proc | None:
    """The process a person sees the session in, when the host is a daemon another process
    started: the host leads a session of its own (it left the terminal's), and its parent still
    runs and does not (it runs in a terminal's session). Codex 0.171's TUI is such a front: it
    starts the app-server daemon that runs the hooks, and the daemon outlives it (seen: hook <-
    app-server, its own session <- the TUI, in the terminal's). None otherwise: a host that is what
    the person started (`codex exec`, Claude Code), a daemon whose starter ended (re-parented), or
    one another daemon started (a job, which the broker starts)."""
    if host is None or not hasattr(os, "getsid"):
        return None
    found = procinfo.describe(host.pid)
    if found is None or found[0].start != host.start or found[1] <= 1:
        return None
    parent = procinfo.describe(found[1])
    if parent is None:
        return None
    try:
        if os.getsid(host.pid) != host.pid or os.getsid(parent[0].pid) == parent[0].pid:
            return None
    except OSError:
        return None  # one of them ended
    return parent[0]


def wait_active(home: Path, host_session_id: str, watch: HostWatch) -> bool | None:
    """One `wait_active` round: True when an active message waits, False when the round ended
    without one (ask again), None when the host is gone."""
    from agent_bridge.ipc import blocking, protocol

    address = blocking.broker_socket(home)
    if address is None:
        return None if watch.wait(NO_BROKER_RETRY) else False
    try:
        sock = blocking.connect(address, common.BROKER_TIMEOUT)
    except OSError:
        return None if watch.wait(NO_BROKER_RETRY) else False
    try:
        sock.settimeout(None)
        sock.sendall(
            protocol.encode(
                protocol.request(1, "wait_active", hostSessionId=host_session_id, timeoutMs=WAIT_MS)
            )
        )
        decoder = protocol.FrameDecoder()
        while True:
            ready = watch.wait_readable(sock, WAIT_MS / 1000 + ANSWER_SLACK)
            if ready is None:
                return None
            if not ready:
                return False
            data = sock.recv(65536)
            if not data:  # the broker went away (a restart): ask the next one
                return None if watch.wait(NO_BROKER_RETRY) else False
            for frame in decoder.feed(data):
                if frame.get("id") == 1:
                    result: Any = frame.get("result") if frame.get("ok") else None
                    if result is None:
                        common.log(home, "wake", f"broker refused wait_active: {frame.get('error')}")
                        return None if watch.wait(NO_BROKER_RETRY) else False
                    return bool(result.get("active"))
    except (OSError, protocol.ProtocolError):
        return None if watch.wait(NO_BROKER_RETRY) else False
    finally:
        sock.close()


lock_path = marks.lock_path  # the session's waiter lock (marks.hold_lock)
hold_lock = marks.hold_lock


def session_mark(home: Path, host_session_id: str) -> Path:
    """The session's busy/idle mark (marks.mark_path, where it is read for everyone else)."""
    return marks.mark_path(home, host_session_id)


def launch_stamp(host: procinfo.Proc | None, chain: list[procinfo.Proc]) -> int | None:
    """When the host started this hook: the start time of the process it spawned for it (the one
    below it in the ancestor chain: the hook's shell, or the hook when the shell exec'd it),
    else of this process. In clock ticks since boot on Linux (10 ms), so two hooks' stamps tell
    which one the host started first; None when unknown."""
    below = [p for p, parent in zip(chain, chain[1:], strict=False) if host is not None and parent == host]
    if below:
        return below[0].start
    found = procinfo.describe(os.getpid())  # the host spawned this process itself (or is not an ancestor)
    return found[0].start if found else None


def _write_mark(
    home: Path, host_session_id: str, text: str, unless: Callable[[str], bool] | None = None
) -> bool:
    """Advisory, so no fsync: a lost mark costs a message's way, never the message. Every writer
    holds a lock on the waiters folder meanwhile, so with `unless` the look at the mark and the
    write are one step: the mark stays when `unless(mark)` holds. True when written."""
    folder = home / WAITERS_DIR
    if not folder.is_dir():
        paths.ensure_home(home)
        folder.mkdir(mode=0o700, exist_ok=True)
    target = session_mark(home, host_session_id)
    held = marks.lock_folder(folder)
    try:
        if unless is not None and unless(read_mark(home, host_session_id)):
            return False
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, text.encode("utf-8"))
        finally:
            os.close(fd)
        os.replace(tmp, target)
        return True
    finally:
        if held is not None:
            os.close(held)  # releases the flock


def read_mark(home: Path, host_session_id: str) -> str:
    return marks.read_mark(home, host_session_id)


def is_busy(mark: str) -> bool:
    return mark.split(" ", 1)[0] == BUSY


def stands_aside(mark: str, cut: Callable[[], bool], target: hosts.Host) -> bool:
    """Whether the waiter leaves a waiting message to the session's next hooks: a turn runs (and
    was not cut short: `cut`), or it was cut short where the host does not run a woken turn then."""
    if is_busy(mark):
        return not cut()
    parts = mark.split(" ")
    return len(parts) >= 2 and parts[1] == INTERRUPTED and not target.wakes_after_interrupt


def is_idle_after(mark: str, prompt_id: str) -> bool:
    """The mark of the Stop hook of the Stop that ends `prompt_id`."""
    parts = mark.split(" ")
    return len(parts) >= 2 and parts[0] == "idle" and parts[1] == prompt_id


def _stamp(mark: str) -> int | None:
    parts = mark.split(" ")
    last = parts[-1] if len(parts) >= 2 else ""
    return int(last) if last.isdigit() else None


def mark_idle(home: Path, hook: common.HookInput, launched: int | None, *, interrupted: bool = False) -> bool:
    """The Stop hook has handed over what waited at this Stop (or found nothing): the waiter
    started by the same Stop may wait now, and hand over what comes while the session is idle.

    Unless the next turn already runs: Claude Code 2.1.332 (TUI) runs the UserPromptSubmit hook
    of a prompt typed while the previous turn's Stop hooks still run, so a slow Stop hook can end
    after the next turn was marked busy (seen under load: the waiter then took a message of the
    next turn). A busy mark written by a hook the host started after this one stays, and one
    started in the same clock tick (10 ms) too: only the next turn's UserPromptSubmit hook writes
    a busy mark that close to a Stop (Claude Code 2.1.337 started a prompt typed as the turn ended
    37-79 ms after its Stop hooks on a quiet machine; a Stop that continues the turn is a model
    request apart from the next one). Its `prompt_id` cannot tell: a UserPromptSubmit hook gets
    the previous prompt's id there (seen). False when the mark stayed."""
    def later_turn(mark: str) -> bool:
        stamp = _stamp(mark)
        return is_busy(mark) and stamp is not None and launched is not None and stamp >= launched

    turn = INTERRUPTED if interrupted else hook.prompt_id or "-"
    return _write_mark(home, hook.session_id, f"idle {turn} {_show(launched)}", unless=later_turn)


def mark_busy(home: Path, hook: common.HookInput, launched: int | None) -> None:
    """A turn starts (UserPromptSubmit) or goes on (a Stop hook handed messages over, which
    continues the turn): messages are the PostToolUse and Stop hooks' until it ends."""
    _write_mark(home, hook.session_id, f"{BUSY} {_show(launched)}")


def _show(stamp: int | None) -> str:
    return "-" if stamp is None else str(stamp)


def after_stop_hook(home: Path, hook: common.HookInput, watch: HostWatch) -> bool:
    """Wait until the Stop hook of this Stop has marked its end, or a turn runs (or
    STOP_HOOK_WAIT passed, or the Stop carries no prompt id to match); while the session is
    busy, `wait` stands aside anyway. False when the host ended meanwhile."""
    import time

    if not hook.prompt_id:
        return True
    deadline = time.monotonic() + STOP_HOOK_WAIT
    while time.monotonic() < deadline:
        mark = read_mark(home, hook.session_id)
        if is_idle_after(mark, hook.prompt_id) or is_busy(mark):
            return True
        if watch.wait(STOP_MARK_POLL):
            return False
    common.log(home, "wake", f"no end mark of the Stop hook within {STOP_HOOK_WAIT:g} s: waiting anyway")
    return True


def outlive(home: Path, host_session_id: str, watch: HostWatch, lock: int) -> None:
    """The waiter was stopped (SIGTERM) while its host still runs: Claude Code does that to its
    pending async hooks as it exits. Fork a child, detached from the host's process group and
    pipes, that lets the lock go, waits up to HOST_END_GRACE for the host to end, and then removes
    the session's files if it can take the lock: a waiter that holds it meanwhile belongs to a
    session that went on, and removes them itself when that ends. The waiter itself returns at
    once (the host's exit is not held up)."""
    if not hasattr(os, "fork"):
        return
    if os.fork() != 0:
        return  # the waiter: its lock goes with its exit; the child's copy goes below
    code = 0
    try:
        import signal

        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the child ends as any process does
        os.close(lock)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if watch.ends_within(HOST_END_GRACE):
            again = marks.hold_lock(home, host_session_id)
            if again is not None:
                try:
                    marks.forget_files(home, host_session_id)
                finally:
                    os.close(again)
    except BaseException:  # noqa: BLE001 - the child never returns into the waiter's code
        code = 1
    finally:
        os._exit(code)


class HostWatch:
    """The host process, and the process a person sees its session in when that is another one
    (`front`: a Codex TUI whose app-server daemon runs the hooks), each watched by pid **and**
    start time: on Linux a pidfd that becomes readable when it exits (so a reused pid cannot fool
    it), elsewhere a look every second. The host "ends" when either of them does."""

    def __init__(self, host: procinfo.Proc, front: procinfo.Proc | None = None) -> None:
        self.host = host
        self.procs = (host,) if front is None else (host, front)
        self.fds: list[int] = []
        self.polling = not hasattr(os, "pidfd_open")  # some process is looked at, not watched
        for proc in self.procs if not self.polling else ():
            try:
                self.fds.append(os.pidfd_open(proc.pid))
            except OSError:
                self.polling = True  # already gone (alive() says so) or not allowed: look instead
        self.stopped = False  # a SIGTERM came (stop_on_sigterm)
        self._wakeup: int | None = None  # read end of the signal wake-up pipe

    def stop_on_sigterm(self) -> None:
        """From now on a SIGTERM ends the waiting instead of the process: every wait below
        returns as if the host had gone (`stopped` tells the two apart), so the waiter can still
        see its session's end through (`outlive`). Python runs a handler only between bytecodes,
        so the signal also writes to a pipe the waits select on."""
        import signal

        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        self._wakeup = read

        def stop(*_: Any) -> None:
            self.stopped = True

        signal.signal(signal.SIGTERM, stop)

    def alive(self) -> bool:
        """The same processes as when the waiter started (checked after the pidfds were opened)."""
        for proc in self.procs:
            found = procinfo.describe(proc.pid)
            if found is None or found[0].start != proc.start:
                return False
        return True

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds`; True when the host is gone."""
        return self.wait_readable(None, seconds) is None

    def wait_readable(self, sock: Any, seconds: float) -> bool | None:
        """True when `sock` is readable, False after `seconds`, None when the host is gone."""
        import time

        deadline = time.monotonic() + seconds
        while True:
            if self.stopped:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            watched = [x for x in (sock, *self.fds, self._wakeup) if x is not None]
            step = min(left, HOST_POLL) if self.polling else left
            ready, _, _ = select.select(watched, [], [], step)
            if self._wakeup is not None and self._wakeup in ready:
                self._drain()  # any signal (the hand-over's SIGALRM too); `stopped` says which
                continue
            if any(fd in ready for fd in self.fds):
                return None
            if self.polling and not self.alive():
                return None
            if sock is not None and sock in ready:
                return True

    def ended(self) -> bool:
        """The host (or its front) has exited: a pidfd says so (also while it waits, a zombie,
        for its parent to reap it, when its /proc entry still looks alive), else it is no longer
        there."""
        if self.fds and select.select(self.fds, [], [], 0)[0]:
            return True
        return not self.alive()

    def ends_within(self, seconds: float) -> bool:
        """Whether the host ends within `seconds`."""
        import time

        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if not self.polling:
                ready, _, _ = select.select(self.fds, [], [], max(0.0, left))
                if ready:
                    return True
            elif not self.alive():
                return True
            else:
                time.sleep(min(max(0.0, left), HOST_POLL))
            if left <= 0:
                return False

    def _drain(self) -> None:
        try:
            while self._wakeup is not None and os.read(self._wakeup, 512):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
