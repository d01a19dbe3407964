"""Real opencode sessions (`opencode run --format json`, `-s` to continue one) on the bridge, as
the model saw them: opencode-ai at the pinned version (tests/hosts/clis.py), offline against the
scripted chat completions server (tests/hosts/models.py ChatServer), configured by the real
`agent-bridge install --opencode` on top of the user's own opencode.json with comments.

Offline (NOTES.md, "opencode"): opencode installs `@opencode-ai/plugin` into each config folder
at start and waits for the registry; pointed at a closed loopback port with no retries it gives
up at once. The user's config folder is given what a successful install leaves (`seed_installed`):
an install that never succeeds is attempted at every start, and at the end of a run too, under a
lock that a run ending mid-attempt leaves behind for the next start to wait on (docs/reach.md).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.hosts import clis
from tests.hosts.conftest import GATE_STEP, HostRun, World, open_world, plan, poll_until
from tests.hosts.models import ChatServer

pytestmark = pytest.mark.slow

# The user's own config, with comments and a trailing comma (opencode reads JSONC): the scripted
# model as its provider. `{url}` is the model server's.
USER_CONFIG = """{
  // my opencode settings
  "$schema": "https://opencode.ai/config.json",
  "model": "fake/m", /* the scripted model */
  "small_model": "fake/m",
  "autoupdate": false,
  "share": "disabled",
  "provider": {
    "fake": {
      "npm": "@ai-sdk/openai-compatible",
      "options": {"baseURL": "{url}/v1", "apiKey": "x"},
      "models": {"m": {"tool_call": true}}, // tools on
    },
  },
}
"""
OFFLINE_ENV = {
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "npm_config_registry": "http://127.0.0.1:9/",  # closed: the plugin package install gives up at once
    "npm_config_fetch_retries": "0",
}


class OpencodeWorld:
    def __init__(self, world: World, model: ChatServer) -> None:
        self.world = world
        self.model = model

    @property
    def config(self) -> Path:
        return self.world.home / ".config" / "opencode" / "opencode.json"

    def run(self, prompt: str, *, session: str | None = None) -> HostRun:
        w = self.world
        env = {**w.base_env(), **OFFLINE_ENV}
        args = [str(w.host_bin / "opencode"), "run", "--format", "json"]
        if session:
            args += ["-s", session]
        args.append(prompt)
        return w._start(args, env, None, w.root / f"opencode-{uuid.uuid4().hex[:8]}.err")


def seed_installed(folder: Path) -> None:
    """What opencode's install of `@opencode-ai/plugin` into a config folder leaves when the
    registry answers (`node_modules`, `package.json`, `package-lock.json` naming it), as a user's
    first online start does. Read from opencode 1.18.33's bundled source (`Npm.install`): with
    `node_modules` there and every `package.json` dependency in the lock file it installs
    nothing; else it takes the lock `npm-install:<folder>` (a folder in
    `~/.local/state/opencode/locks`) and asks the registry. Offline, that happens at every start
    and again as a run's instance is disposed (`Config.loadInstanceState`, its install forked
    detached); a run that exits between taking the lock and releasing it leaves it, and the next
    start waits at config load until it is stale (60 s). Seen with bench/opencode_runs.py."""
    wanted = {"@opencode-ai/plugin": clis.OPENCODE_VERSION}
    (folder / "node_modules").mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_text(json.dumps({"dependencies": wanted}), encoding="utf-8")
    lock = {"lockfileVersion": 3, "requires": True, "packages": {"": {"dependencies": wanted}}}
    (folder / "package-lock.json").write_text(json.dumps(lock), encoding="utf-8")


@contextmanager
def open_opencode_world(host_bin: Path) -> Iterator[OpencodeWorld]:
    """A world (tests/hosts/conftest.py `open_world`) with the user's own opencode.json, the
    scripted chat model as its provider, and `agent-bridge install --opencode` run."""
    model = ChatServer().start()
    try:
        with open_world(host_bin) as world:
            ow = OpencodeWorld(world, model)
            ow.config.parent.mkdir(parents=True, exist_ok=True)
            ow.config.write_text(USER_CONFIG.replace("{url}", model.url), encoding="utf-8")
            seed_installed(ow.config.parent)
            world.bridge("install", "--opencode")
            yield ow
    finally:
        model.close()


@pytest.fixture
def oc(host_bin: Path) -> Iterator[OpencodeWorld]:
    with open_opencode_world(host_bin) as ow:
        yield ow


def session_of(run: HostRun) -> str:
    return next(str(e["sessionID"]) for e in run.events if str(e.get("sessionID", "")).startswith("ses_"))


def tool_texts(body: dict[str, Any]) -> list[str]:
    """The contents of the `tool` messages (tool results) of one chat completions request."""
    return [m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
            for m in body.get("messages") or () if m.get("role") == "tool"]


def system_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] if isinstance(m.get("content"), str) else json.dumps(m.get("content"))
            for m in body.get("messages") or () if m.get("role") == "system"]


def test_install_doctor_uninstall_keep_the_users_jsonc(oc: OpencodeWorld) -> None:
    w = oc.world
    installed = oc.config.read_text(encoding="utf-8")
    assert "// my opencode settings" in installed and "/* the scripted model */" in installed
    assert "// tools on" in installed and '"agent-bridge": {' in installed
    plugin = w.home / ".config" / "opencode" / "plugin" / "agent-bridge.js"
    assert plugin.read_text(encoding="utf-8").startswith("// agent-bridge plugin for opencode")
    doctor = w.bridge("doctor", check=False).stdout
    assert "ok    opencode MCP server" in doctor and "ok    opencode plugin" in doctor
    assert "ok    opencode reach" in doctor
    assert "ok    opencode version" in doctor, doctor
    again = w.bridge("install", "--opencode")  # idempotent: nothing changes
    assert oc.config.read_text(encoding="utf-8") == installed, again.stdout
    w.bridge("uninstall", "--opencode")
    assert oc.config.read_bytes() == USER_CONFIG.replace("{url}", oc.model.url).encode()
    assert not plugin.exists() and not plugin.parent.exists()


def test_tools_answer_and_the_session_stays_itself_across_runs(oc: OpencodeWorld) -> None:
    first = oc.run(plan(("whoami", {}))).wait()
    session = session_of(first)
    [asked] = [r for r in oc.model.turns_of(session) if tool_texts(r.body)]
    me = json.loads(tool_texts(asked.body)[0])
    assert me["agent"] == "opencode", me
    second = oc.run(plan(("whoami", {})), session=session).wait()
    assert session_of(second) == session
    again = [r for r in oc.model.turns_of(session) if tool_texts(r.body)][-1]
    assert json.loads(tool_texts(again.body)[-1])["id"] == me["id"]
    [peer] = [p for p in oc.world.peers() if p["agent"] == "opencode"]
    assert peer["hostSessionId"] == session and peer["id"] == me["id"]


def test_the_decisions_note_is_in_the_first_request(oc: OpencodeWorld) -> None:
    oc.world.bridge("decide", "camera", "Hold to look", "--scope", "all")
    run = oc.run("say hi").wait()
    first = oc.model.turns_of(session_of(run))[0]
    note = [t for t in system_texts(first.body) if "camera: Hold to look" in t]
    assert note and "agent-bridge_send" in note[0], system_texts(first.body)


def test_a_message_arrives_between_tool_calls_exactly_once(oc: OpencodeWorld) -> None:
    run = oc.run(plan(("whoami", {}), GATE_STEP("sent"), ("whoami", {}), ("whoami", {})))
    oc.model.wait_reached("sent")
    [peer] = poll_until(
        lambda: [p for p in oc.world.peers() if p["agent"] == "opencode" and p["hostSessionId"]],
        "the opencode session's identity")
    poll_until(lambda: [s.get("state") for s in json.loads(oc.world.bridge("sessions", "--json").stdout)
                        if s.get("id") == peer["id"]] == ["busy"], "the session marked busy (session.status)")
    text = "codex here: the schema changed"
    sent = json.loads(oc.world.bridge("send", peer["name"], text, "--json").stdout)
    oc.model.open_gate("sent")
    run.wait()
    requests = oc.model.turns_of(peer["hostSessionId"])
    carrying = [r for r in requests if "codex here: the schema changed" in r.text]
    assert carrying, [r.text[-500:] for r in requests]
    first = carrying[0]
    # in the result of the tool called after the send, once, and in no other tool result after it
    assert sum("codex here: the schema changed" in t for t in tool_texts(requests[-1].body)) == 1
    assert "not from the user" in first.text
    message_id = sent.get("message", sent).get("id") if isinstance(sent, dict) else None
    receipts = poll_until(lambda: [r for r in oc.world.receipts(peer["hostSessionId"]) if r["ackedAt"]],
                          "the acknowledgement after opencode stored the tool result", timeout=30)
    assert not message_id or receipts[0]["id"] == message_id



def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(port: int, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        raw = answer.read()
    return json.loads(raw) if raw else None


def serve(oc: OpencodeWorld) -> tuple[int, HostRun]:
    """`opencode serve` on a free loopback port, once it answers."""
    w = oc.world
    port = free_port()
    run = w._start([str(w.host_bin / "opencode"), "serve", "--port", str(port), "--hostname", "127.0.0.1"],
                   {**w.base_env(), **OFFLINE_ENV}, None, w.root / "opencode-serve.err")

    def up() -> bool:
        try:
            api(port, "GET", "/session/status")
            return True
        except OSError:
            return False

    poll_until(up, "opencode serve listening", timeout=60)
    return port, run


def state_of(w: World, peer_id: str) -> str | None:
    listed = json.loads(w.bridge("sessions", "--json").stdout)
    return next((s.get("state") for s in listed if s.get("id") == peer_id), None)


def test_a_message_wakes_an_idle_session_and_two_sessions_of_one_serve_are_each_itself(
    oc: OpencodeWorld,
) -> None:
    """`opencode serve` (a session that stays open): after its turn the session is idle; a message
    sent then starts a turn, as a user message framed as another agent's, acknowledged once taken.
    A second session of the same serve (one opencode process, one MCP server) is a session of its
    own: its own identity, its messages only its own, the wake of the one addressed only."""
    w = oc.world
    port, serving = serve(oc)
    session = str(api(port, "POST", "/session", {})["id"])
    prompt = {"parts": [{"type": "text", "text": plan(("whoami", {}))}]}
    api(port, "POST", f"/session/{session}/prompt_async", prompt)
    poll_until(lambda: any(tool_texts(r.body) for r in oc.model.turns_of(session)),
               "the first turn's tool call")
    poll_until(lambda: api(port, "GET", "/session/status") == {}, "the session idle", timeout=60)
    [peer] = [p for p in w.peers() if p["hostSessionId"] == session]

    def state() -> str | None:
        listed = json.loads(w.bridge("sessions", "--json").stdout)
        return next((s.get("state") for s in listed if s.get("id") == peer["id"]), None)

    poll_until(lambda: state() == "idle", "the session marked idle (session.status)", timeout=30)
    before = len(oc.model.of_session(session))
    text = "claude here: wake up and look"
    w.bridge("send", "opencode", text)  # the agent kind: the one connected opencode session here
    woken = poll_until(lambda: [r for r in oc.model.of_session(session)[before:] if text in r.text],
                       "the woken turn's request", timeout=60)
    users = [m for m in woken[0].body["messages"] if m.get("role") == "user" and text in json.dumps(m)]
    assert users and "not from the user" in json.dumps(users[-1])
    poll_until(lambda: [r for r in w.receipts(session) if r["ackedAt"]], "the acknowledgement", timeout=30)
    # the sender's receipt records the wake, confirmed by the acknowledgement (as for the other hosts)
    [receipt] = json.loads(w.bridge("sent", "--json").stdout)
    assert receipt["woken"] == "confirmed", receipt
    poll_until(lambda: state() == "idle", "idle again after the woken turn", timeout=60)

    # Session B of the same serve: whoami is B's own; its send to A comes from B and wakes A only.
    other = str(api(port, "POST", "/session", {})["id"])
    before, before_b = len(oc.model.of_session(session)), len(oc.model.of_session(other))
    text = "session B here: your turn"
    steps = plan(("whoami", {}), ("send", {"to": peer["name"], "text": text}))
    api(port, "POST", f"/session/{other}/prompt_async", {"parts": [{"type": "text", "text": steps}]})
    woken = poll_until(lambda: [r for r in oc.model.of_session(session)[before:] if text in r.text],
                       "session A woken by session B's message", timeout=60)
    me = json.loads(next(t for r in oc.model.turns_of(other) for t in tool_texts(r.body) if '"agent"' in t))
    assert me["hostSessionId"] == other and me["id"] != peer["id"], me
    assert me["name"] in json.dumps(woken[0].body)  # A is told who wrote: B, by its name
    by_session = {p["hostSessionId"]: p["id"] for p in w.peers() if p["agent"] == "opencode"}
    assert by_session == {session: peer["id"], other: me["id"]}, by_session
    poll_until(lambda: all(r["ackedAt"] for r in w.receipts(session)), "acknowledged by A", timeout=30)
    assert w.receipts(other) == []  # nothing was ever B's to take
    # and one to B, once idle, wakes B, not A
    poll_until(lambda: state_of(w, me["id"]) == "idle" and state() == "idle", "both idle", timeout=60)
    before, before_b = len(oc.model.of_session(session)), len(oc.model.of_session(other))
    w.bridge("send", me["name"], "codex here: only for B")
    poll_until(lambda: [r for r in oc.model.of_session(other)[before_b:] if "only for B" in r.text],
               "session B woken", timeout=60)
    poll_until(lambda: all(r["ackedAt"] for r in w.receipts(other)), "acknowledged by B", timeout=30)
    assert not any("only for B" in r.text for r in oc.model.of_session(session)[before:])
    assert len(w.receipts(session)) == 2  # A's own two, no more
    assert serving.proc.poll() is None


def test_project_scope_install_and_uninstall(oc: OpencodeWorld) -> None:
    w = oc.world
    w.bridge("install", "--opencode", "--scope", "project")
    config = w.project / "opencode.json"
    plugin = w.project / ".opencode" / "plugin" / "agent-bridge.js"
    assert json.loads(config.read_text(encoding="utf-8"))["mcp"]["agent-bridge"]["enabled"] is True
    assert plugin.read_text(encoding="utf-8").startswith("// agent-bridge plugin for opencode")
    w.bridge("uninstall", "--opencode", "--scope", "project")
    assert not config.exists() and not (w.project / ".opencode").exists()


def test_a_message_to_a_killed_session_waits_for_its_next_run(oc: OpencodeWorld) -> None:
    """opencode killed mid-turn with a message waiting: nothing is acknowledged, and the next run of
    the session (`-s`) gets the message between its tool calls, once."""
    run = oc.run(plan(("whoami", {}), GATE_STEP("kill"), ("whoami", {})))
    oc.model.wait_reached("kill")
    [peer] = poll_until(
        lambda: [p for p in oc.world.peers() if p["agent"] == "opencode" and p["hostSessionId"]],
        "the opencode session's identity")
    session = peer["hostSessionId"]
    text = "claude here: do not lose this"
    oc.world.bridge("send", peer["name"], text)
    run.proc.kill()
    run.proc.communicate(timeout=30)
    oc.model.open_gate("kill")
    assert [r["ackedAt"] for r in oc.world.receipts(session)] == [None]
    oc.run(plan(("whoami", {}), ("whoami", {})), session=session).wait()
    latest = oc.model.turns_of(session)[-1]
    assert sum(text in t for t in tool_texts(latest.body)) == 1, tool_texts(latest.body)
    poll_until(lambda: [r for r in oc.world.receipts(session) if r["ackedAt"]], "the acknowledgement",
               timeout=30)


# --- jobs (SPEC §4.7): opencode run headless, the bridge and the access from the command's environment


def run_opencode_job(oc: OpencodeWorld, task: str, *, access: str = "read", thread: str | None = None,
                     note: str = "") -> tuple[Any, bytes]:
    """Start the job's command as the broker does (its own process group, stdin from the command)."""
    from agent_bridge import hosts
    from tests.hosts.test_job_hosts import launch

    w = oc.world
    host = hosts.by_name("opencode")
    assert host is not None
    command = host.job_command(launch(w, "opencode", task, access=access, thread=thread, note=note))
    env = {**w.base_env(), **OFFLINE_ENV, **command.env}
    proc = subprocess.Popen(command.argv, cwd=w.project, env=env, start_new_session=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    w.procs.append(proc)  # type: ignore[arg-type]  # killed at teardown if still running
    out, err = proc.communicate(command.stdin, timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return host.job_report(out), out


def job_writes(project: Path) -> str:
    return "--looks-like-a-flag " + plan(
        ("!bash", {"command": f"echo by-the-job > {project / 'shell.txt'}", "description": "write"}),
        ("!write", {"filePath": str(project / "written.txt"), "content": "by the job"}))


def test_an_opencode_job_under_read_leaves_the_project_byte_identical(oc: OpencodeWorld) -> None:
    from tests.hosts.test_job_hosts import tree

    w = oc.world
    w.bridge("uninstall", "--opencode")  # the bridge comes from the job's command, not from install
    (w.project / "keep.txt").write_text("the owner's file\n", encoding="utf-8")
    before = tree(w.project)
    report, _ = run_opencode_job(oc, job_writes(w.project), note="agent-bridge: camera: Hold to look")
    assert report.answer == "done." and report.failed is None and str(report.thread).startswith("ses_")
    assert tree(w.project) == before
    first = oc.model.turns_of(str(report.thread))[0]
    tools = {t.get("function", {}).get("name") for t in first.body.get("tools") or ()}
    assert "agent-bridge_whoami" in tools and "bash" not in tools and "write" not in tools, tools
    user = [m for m in first.body["messages"] if m.get("role") == "user"][0]
    assert "camera: Hold to look" in json.dumps(user) and "--looks-like-a-flag" in json.dumps(user)


def test_an_opencode_job_under_edit_writes_and_continue_resumes_its_session(oc: OpencodeWorld) -> None:
    w = oc.world
    report, _ = run_opencode_job(oc, job_writes(w.project), access="edit")
    assert report.answer == "done."
    assert (w.project / "shell.txt").exists() and (w.project / "written.txt").exists()
    again, _ = run_opencode_job(oc, "and now: PLAN []", access="edit", thread=report.thread)
    assert again.thread == report.thread and again.answer == "done."
    last = oc.model.turns_of(str(report.thread))[-1]
    assert "--looks-like-a-flag" in last.text and "and now" in last.text


@pytest.fixture
def oc_jobs(oc: OpencodeWorld) -> Iterator[OpencodeWorld]:
    """A broker that runs jobs: every host offline against its scripted model."""
    from tests.hosts.test_jobs import group_alive, jobs

    oc.world.restart_broker({**oc.world.job_env(), **OFFLINE_ENV})
    yield oc
    oc.world.bridge("down", check=False)
    for job in jobs(oc.world):
        if job["pid"]:
            poll_until(lambda pid=job["pid"]: not group_alive(pid), f"job {job['name']}'s processes to end",
                       timeout=10)


def test_codex_delegates_to_opencode_and_opencode_to_codex(oc_jobs: OpencodeWorld) -> None:
    from tests.hosts.test_jobs import after_delegate, job_messages, jobs

    w = oc_jobs.world
    w.bridge("decide", "db", "PostgreSQL, decided before the job")
    w.codex(plan(("delegate", {"agent": "opencode", "task": plan(("whoami", {})) + " check it",
                              "wait_seconds": 50}), ("whoami", {}))).wait()
    [job] = jobs(w)
    assert job["state"] == "finished" and job["agent"] == "opencode" and job["answer"] == "done.", job
    assert str(job["thread"]).startswith("ses_")
    first = oc_jobs.model.turns_of(str(job["thread"]))[0]
    assert "PostgreSQL, decided before the job" in first.text
    said = f"Job {job['name']} (opencode, read access) finished"
    assert said in after_delegate(w.codex_model.requests, job).text

    run = oc_jobs.run(plan(("delegate", {"agent": "codex", "task": plan(("whoami", {})) + " review",
                                         "wait_seconds": 50}), ("whoami", {}))).wait()
    [back] = [j for j in jobs(w) if j["agent"] == "codex"]
    assert back["state"] == "finished" and back["answer"] == "done.", back
    assert [to for to, _ in job_messages(w)][-1].startswith("opencode")
    said = f"Job {back['name']} (codex, read access) finished"
    assert said in after_delegate(oc_jobs.model.turns_of(session_of(run)), back).text


def test_cancel_ends_an_opencode_jobs_process_group(oc_jobs: OpencodeWorld) -> None:
    from tests.hosts.test_jobs import group_alive, job_messages, jobs

    w = oc_jobs.world
    task = plan(("whoami", {}), GATE_STEP("held")) + " never ends"
    w.codex(plan(("delegate", {"agent": "opencode", "task": task}),)).wait()
    oc_jobs.model.wait_reached("held")
    [job] = jobs(w)
    pgid = job["pid"]
    assert job["state"] == "running" and group_alive(pgid)
    assert "Stopping" in w.bridge("jobs", "cancel", job["name"]).stdout
    poll_until(lambda: not group_alive(pgid), "the job's process group to end", timeout=10)
    poll_until(lambda: jobs(w)[0]["state"] == "cancelled", "the cancelled state")
    [(to, body)] = job_messages(w)
    assert to.startswith("codex") and f"Job {job['name']} (opencode, read access) was cancelled" in body
    oc_jobs.model.open_gate("held")


def test_send_and_decide_from_opencode_reach_a_codex_session(oc: OpencodeWorld) -> None:
    """A Codex session held in its turn; opencode records a decision (delivered to Codex) and
    sends it a message, which Codex's Stop hook hands to its model."""
    w = oc.world
    codex = w.codex(plan(("whoami", {}), GATE_STEP("codex-ends")))
    w.codex_model.wait_reached("codex-ends")
    name = next(p["name"] for p in w.peers() if p["agent"] == "codex")
    run = oc.run(plan(("decide", {"topic": "ci", "text": "green before merge", "scope": "all"}),
                      ("send", {"to": name, "text": "opencode here: ship it"}))).wait()
    results = [t for r in oc.model.turns_of(session_of(run)) for t in tool_texts(r.body)]
    decided = next(json.loads(t) for t in results if '"deliveredTo"' in t)
    assert name in decided["deliveredTo"] and decided["decision"]["author"]["agent"] == "opencode"
    w.codex_model.open_gate("codex-ends")
    codex.wait()
    assert any("opencode here: ship it" in r.text for r in w.codex_model.requests)


def test_an_aborted_turn_is_idle_and_a_message_then_wakes_it(oc: OpencodeWorld) -> None:
    """An abort (what Esc does in the TUI) ends the turn in `session.status` idle: the session is
    marked idle, and a message sent then starts a turn."""
    w = oc.world
    port, _ = serve(oc)
    session = str(api(port, "POST", "/session", {})["id"])
    prompt = {"parts": [{"type": "text", "text": plan(("whoami", {}), GATE_STEP("aborted"), ("whoami", {}))}]}
    api(port, "POST", f"/session/{session}/prompt_async", prompt)
    oc.model.wait_reached("aborted")
    [peer] = poll_until(lambda: [p for p in w.peers() if p["hostSessionId"] == session], "the identity")
    poll_until(lambda: state_of(w, peer["id"]) == "busy", "the session marked busy")
    api(port, "POST", f"/session/{session}/abort", {})
    poll_until(lambda: state_of(w, peer["id"]) == "idle", "the aborted session marked idle", timeout=30)
    before = len(oc.model.of_session(session))
    text = "codex here: after the abort"
    w.bridge("send", peer["name"], text)
    poll_until(lambda: [r for r in oc.model.of_session(session)[before:] if text in r.text],
               "the woken turn's request", timeout=60)
    oc.model.open_gate("aborted")


def test_opencode_run_ending_leaves_a_late_message_waiting(oc: OpencodeWorld) -> None:
    """A message that arrives after the last tool call of an `opencode run`: the run ends at its
    idle without a wake (the plugin knows it runs under `run`), and the message waits, unacknowledged."""
    run = oc.run(plan(("whoami", {}), GATE_STEP("late")))
    oc.model.wait_reached("late")
    [peer] = poll_until(
        lambda: [p for p in oc.world.peers() if p["agent"] == "opencode" and p["hostSessionId"]],
        "the opencode session's identity")
    text = "claude here: too late for this run"
    oc.world.bridge("send", peer["name"], text)
    oc.model.open_gate("late")
    run.wait()
    assert not any(text in r.text for r in oc.model.requests)
    assert [r["ackedAt"] for r in oc.world.receipts(peer["hostSessionId"])] == [None]
