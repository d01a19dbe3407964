"""Real Claude Code and Codex CLIs driving agent-bridge, each against a scripted model server.

Each test gets a throw-away world: a HOME with the hosts' configuration written by the real
`agent-bridge install --claude --codex`, an AGENT_BRIDGE_HOME beside it, a project folder, and
the two scripted model servers. The broker is started first with `agent-bridge up --detach`
(as after a first session): Codex starts MCP servers with a cleared environment, so a broker
started from one would take the default dashboard port, which parallel test runs share.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent_bridge.common import tools
from agent_bridge.store import reader
from tests.hostbin import CLAUDE_OFFLINE_ENV
from tests.hosts import clis
from tests.hosts.models import AnthropicServer, OpenAIServer

AGENT_BRIDGE = str(Path(sys.executable).parent / "agent-bridge")
RUN_TIMEOUT = 90  # seconds one host run may take; a few at most when all is well
BRIDGE_TOOLS = tuple(tools.TOOLS)  # every tool the bridge serves


@pytest.fixture(scope="session")
def host_bin() -> Path:
    try:
        return clis.ensure()
    except clis.Missing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the real-host tests, but: {exc}")
        if shutil.which("npm") is None:
            pytest.skip(f"real-host tests skipped: {exc}")
        raise


@dataclass
class HostRun:
    """One finished (or running) host process and what it wrote."""

    proc: subprocess.Popen[str]
    log: Path  # Claude's --debug-file, or Codex's stderr
    out: str = ""
    err: str = ""

    def wait(self) -> HostRun:
        self.out, self.err = self.proc.communicate(timeout=RUN_TIMEOUT)
        assert self.proc.returncode == 0, (
            f"host exited {self.proc.returncode}:\n{self.err[-3000:]}\n{self.out[-3000:]}"
        )
        if self.log.suffix == ".err":
            self.log.write_text(self.err, encoding="utf-8")
        return self

    @property
    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in self.out.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    pass
        return found

    @property
    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""


@dataclass
class Tui:
    """A host's TUI in a private tmux server (`tmux -L NAME`), read from its screen."""

    socket: str
    log: Path
    pid: int | None = None

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def start(self, script: str) -> None:
        if shutil.which("tmux") is None:  # the interactive tests drive the TUIs through tmux
            if os.environ.get("CI"):
                pytest.fail("CI runs the interactive host tests, but tmux is not installed")
            pytest.skip("tmux is not installed: the interactive host tests are skipped")
        self.tmux("new-session", "-d", "-x", "200", "-y", "50", script)
        self.pid = int(self.tmux("display-message", "-p", "#{pane_pid}").strip())

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-S", "-200")

    def type(self, text: str) -> None:
        """Type `text` and press Enter once the TUI shows it (an Enter that arrives with the
        typed text can be taken as part of a paste, and the prompt is not sent)."""
        self.tmux("send-keys", "-l", text)
        tail = text[-30:]
        poll_until(
            lambda: tail in self.screen().replace("\n", ""), "the typed text on the screen", timeout=30
        )
        self.tmux("send-keys", "Enter")

    def running(self) -> bool:
        return self.pid is not None and os.path.exists(f"/proc/{self.pid}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)
        folder = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (folder / self.socket).unlink(missing_ok=True)  # the server is gone; its socket file stays


@dataclass
class World:
    root: Path
    host_bin: Path
    claude_model: AnthropicServer
    codex_model: OpenAIServer
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    tuis: list[Tui] = field(default_factory=list)
    # the plugin's world (tests/hosts/test_plugin.py): the hosts pass their own environment to
    # the plugin, which records no AGENT_BRIDGE_HOME, so the bridge's home is HOME's default
    plugin: bool = False

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def bridge_home(self) -> Path:
        return self.home / ".local" / "state" / "agent-bridge" if self.plugin else self.root / "ab"

    @property
    def project(self) -> Path:
        return self.root / "proj"

    @property
    def codex_home(self) -> Path:
        return self.home / ".codex"

    def base_env(self) -> dict[str, str]:
        """What a user's shell would pass: the hosts on PATH (install asks `codex --version`),
        no AGENT_BRIDGE_HOME (install recorded it), nothing from the environment these tests
        run in."""
        return {
            # the plugin runs `agent-bridge` found on PATH (as after `pipx install agent-bridge`)
            "PATH": os.pathsep.join([str(self.host_bin),
                                     *([str(Path(AGENT_BRIDGE).parent)] if self.plugin else []),
                                     os.environ.get("PATH", "/usr/bin:/bin")]),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.root / "tmp"),
            "SHELL": "/bin/sh",
            # a checkout run with PYTHONPATH=$PWD (a git worktree beside an editable install):
            # the agent-bridge the hosts start is this checkout's too
            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
        }

    def bridge(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**self.base_env(), "AGENT_BRIDGE_HOME": str(self.bridge_home), "AGENT_BRIDGE_WEB_PORT": "0"}
        done = subprocess.run(
            [AGENT_BRIDGE, *args], env=env, cwd=self.project, capture_output=True, text=True, timeout=60
        )
        assert not check or done.returncode == 0, f"agent-bridge {' '.join(args)}: {done.stderr}{done.stdout}"
        return done

    def job_env(self) -> dict[str, str]:
        """What a broker that runs jobs needs in its environment here: both hosts offline
        against the scripted models (a job's host inherits the broker's environment)."""
        return {**CLAUDE_OFFLINE_ENV, "ANTHROPIC_BASE_URL": self.claude_model.url,
                "CLAUDE_CODE_TMPDIR": str(self.root / "tmp"),
                "CODEX_HOME": str(self.codex_home), "FAKE_MODEL_KEY": "test-key"}

    def restart_broker(self, env: dict[str, str], *, down: bool = True) -> None:
        """Stop the world's broker (unless not `down`) and start one with `env` added to its
        environment (`up --detach`: when one already runs, that one stays)."""
        if down:
            self.bridge("down", check=False)
        full = {**self.base_env(), "AGENT_BRIDGE_HOME": str(self.bridge_home), "AGENT_BRIDGE_WEB_PORT": "0",
                **env}
        done = subprocess.run([AGENT_BRIDGE, "up", "--detach"], env=full, cwd=self.project,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr

    # --- Claude Code ---------------------------------------------------------------------

    def claude(self, prompt: str, *, session_id: str | None = None, resume: str | None = None,
               cwd: Path | None = None, tag: str = "claude", skip_permissions: bool = True) -> HostRun:
        """`claude -p PROMPT`; with `skip_permissions` False, in the default permission mode (a
        tool or `!` command runs only when a rule allows it)."""
        env = {
            **self.base_env(),
            **CLAUDE_OFFLINE_ENV,
            "ANTHROPIC_BASE_URL": self.claude_model.url,
            "MCP_CONNECTION_NONBLOCKING": "0",  # -p waits for the MCP server before the first request
            "CLAUDE_CODE_TMPDIR": str(self.root / "tmp"),
        }
        log = self.root / f"{tag}-{uuid.uuid4().hex[:8]}.debug"
        args = [
            str(self.host_bin / "claude"),
            "-p",
            prompt,
            *(["--dangerously-skip-permissions"] if skip_permissions else []),
            "--output-format",
            "stream-json",
            "--verbose",
            "--include-hook-events",
            "--debug-file",
            str(log),
        ]
        if session_id:
            args += ["--session-id", session_id]
        if resume:
            args += ["--resume", resume]
        return self._start(args, env, cwd, log)

    def trust_for_claude(self, folder: Path) -> None:
        """Record `folder` as trusted in ~/.claude.json, as Claude Code's trust dialog does
        (`projects[folder].hasTrustDialogAccepted`): its TUI asks first in a folder not trusted,
        and there `claude mcp list` 2.1.337 starts no user-scope server ("Not checked (folder
        not trusted; run `claude` here)"; a local-scope one it still starts, seen)."""
        state_file = self.home / ".claude.json"
        state = json.loads(state_file.read_text(encoding="utf-8")) if state_file.exists() else {}
        state.setdefault("projects", {}).setdefault(str(folder), {})["hasTrustDialogAccepted"] = True
        state_file.write_text(json.dumps(state), encoding="utf-8")

    def claude_tui(self, session_id: str, *, cwd: Path | None = None) -> Tui:
        """An interactive Claude Code (its TUI) in a private tmux server, offline (NOTES.md, "The
        TUI offline"): onboarding done, the API key approved, the folder trusted, the
        dangerous-mode prompt skipped. Only an interactive session can be idle."""
        folder = cwd or self.project
        self.trust_for_claude(folder)
        key = CLAUDE_OFFLINE_ENV["ANTHROPIC_API_KEY"]
        state_file = self.home / ".claude.json"
        state = json.loads(state_file.read_text(encoding="utf-8"))
        state.update({"hasCompletedOnboarding": True,
                      "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []}})
        state_file.write_text(json.dumps(state), encoding="utf-8")
        settings_file = self.home / ".claude" / "settings.json"
        settings = json.loads(settings_file.read_text(encoding="utf-8"))
        settings["skipDangerousModePermissionPrompt"] = True
        settings_file.write_text(json.dumps(settings), encoding="utf-8")
        env = {**self.base_env(), **CLAUDE_OFFLINE_ENV, "ANTHROPIC_BASE_URL": self.claude_model.url,
               "CLAUDE_CODE_TMPDIR": str(self.root / "tmp"), "TERM": "xterm-256color"}
        log = self.root / f"tui-{uuid.uuid4().hex[:8]}.debug"
        script = self.root / f"tui-{uuid.uuid4().hex[:8]}.sh"
        script.write_text(
            "#!/bin/sh\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            + f"cd {shlex.quote(str(folder))}\n"
            + shlex.join(
                [
                    "exec",
                    str(self.host_bin / "claude"),
                    "--dangerously-skip-permissions",
                    "--session-id",
                    session_id,
                    "--debug-file",
                    str(log),
                ]
            )
            + "\n"
        )
        script.chmod(0o755)
        tui = Tui(f"ab-{uuid.uuid4().hex[:10]}", log)
        self.tuis.append(tui)
        tui.start(str(script))
        return tui

    # --- Codex ---------------------------------------------------------------------------

    def codex(self, prompt: str, *, resume: str | None = None, extra: tuple[str, ...] = (),
              cwd: Path | None = None, tag: str = "codex") -> HostRun:
        env = {**self.base_env(), "CODEX_HOME": str(self.codex_home), "FAKE_MODEL_KEY": "test-key"}
        args = [str(self.host_bin / "codex"), "exec"]
        if resume:
            args += ["resume", resume]
        # Hooks: `codex exec` skips untrusted hooks; trusting them for one run keeps HOME's
        # config exactly as `agent-bridge install` wrote it. MCP: Codex 0.171 leaves an optional
        # MCP server that is still starting out of a step's tools ("omitting pending optional
        # MCP server"); `required` makes `codex exec` wait for it (README, "Connect Codex").
        args += [
            "--skip-git-repo-check",
            "--json",
            "--dangerously-bypass-approvals-and-sandbox",
            # the plugin's world: its hooks are trusted by `install --plugin`, its server is the plugin's
            *([] if self.plugin else
              ["--dangerously-bypass-hook-trust", "-c", "mcp_servers.agent-bridge.required=true"]),
            *extra,
            prompt,
        ]
        return self._start(args, env, cwd, self.root / f"{tag}-{uuid.uuid4().hex[:8]}.err")

    def codex_tui(self, *, cwd: Path | None = None, env: dict[str, str] | None = None,
                  resume: str | None = None) -> Tui:
        """An interactive Codex (its TUI) in a private tmux server, offline (NOTES.md, "The TUI
        offline"): the folder trusted, plugins off, and the agent-bridge hooks trusted the way a
        user's /hooks review records it (`[hooks.state."<key>"] trusted_hash`, the hashes asked of
        this Codex's app-server, as doctor does). The TUI starts an app-server daemon that
        outlives it: `open_world` ends it. `resume`: `codex resume THREAD` (a second TUI of the
        world finds the folder and the hooks trusted already)."""
        from agent_bridge.hosts import codex_doctor as codex_host

        folder = cwd or self.project
        env = {
            **self.base_env(),
            "CODEX_HOME": str(self.codex_home),
            "FAKE_MODEL_KEY": "test-key",
            **(env or {}),
        }
        config = self.codex_home / "config.toml"
        if f'[projects."{folder}"]' not in config.read_text(encoding="utf-8"):
            config.write_text(
                config.read_text(encoding="utf-8") + f'\n[projects."{folder}"]\ntrust_level = "trusted"\n',
                encoding="utf-8",
            )
        saved = dict(os.environ)
        os.environ.update(env)  # codex_app_server runs the codex of this world with its CODEX_HOME
        try:
            _, hooks = codex_host.codex_app_server(str(self.host_bin / "codex"), folder)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        known = config.read_text(encoding="utf-8")
        config.write_text(
            known + "".join(f'\n[hooks.state."{h["key"]}"]\ntrusted_hash = "{h["currentHash"]}"\n'
                            for h in hooks if f'[hooks.state."{h["key"]}"]' not in known),
            encoding="utf-8",
        )
        env["TERM"] = "xterm-256color"
        script = self.root / f"codex-tui-{uuid.uuid4().hex[:8]}.sh"
        script.write_text(
            "#!/bin/sh\n"
            + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            + f"cd {shlex.quote(str(folder))}\n"
            + shlex.join(["exec", str(self.host_bin / "codex"), *(["resume", resume] if resume else []),
                          "--dangerously-bypass-approvals-and-sandbox"])
            + "\n"
        )
        script.chmod(0o755)
        tui = Tui(f"ab-{uuid.uuid4().hex[:10]}", self.root / "codex-tui.log")
        self.tuis.append(tui)
        tui.start(str(script))
        return tui

    def leftovers(self) -> list[int]:
        """Processes of this world still running: any whose program or environment names its
        folder (a Codex app-server daemon, an agent-bridge hook or waiter, an MCP server)."""
        found = []
        marker = str(self.root).encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                with open(f"/proc/{entry}/environ", "rb") as f:
                    environ = f.read()
            except OSError:
                continue
            if marker in cmdline or marker in environ:
                found.append(int(entry))
        return found

    def _start(self, args: list[str], env: dict[str, str], cwd: Path | None, log: Path) -> HostRun:
        proc = subprocess.Popen(args, env=env, cwd=cwd or self.project, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return HostRun(proc, log)

    # --- the bridge's own record -----------------------------------------------------------

    def receipts(self, host_session_id: str) -> list[dict[str, Any]]:
        """The receipts of the messages to the session with this host session id, oldest first."""
        with reader.reading(self.bridge_home / "bridge.db") as conn:
            assert conn is not None
            cursor = conn.execute(
                "SELECT r.message_id, r.delivered_at, r.acked_at FROM receipts r "
                "JOIN peers p ON p.id = r.peer_id JOIN messages m ON m.id = r.message_id "
                "WHERE p.host_session_id = ? AND m.hop < 100 ORDER BY r.rowid",
                (host_session_id,),
            )
            return [dict(zip(("id", "deliveredAt", "ackedAt"), row, strict=True)) for row in cursor]

    def peers(self) -> list[dict[str, Any]]:
        with reader.reading(self.bridge_home / "bridge.db") as conn:
            assert conn is not None
            cursor = conn.execute("SELECT id, name, agent, project, kind, host_session_id FROM peers")
            return [
                dict(zip(("id", "name", "agent", "project", "kind", "hostSessionId"), row, strict=True))
                for row in cursor
            ]


def wait_gone(pid: int, timeout: float = 30) -> None:
    """Until process `pid` has exited (a TUI's, after its tmux server was killed)."""
    deadline = time.monotonic() + timeout
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)


def poll_until(predicate: Any, what: str, timeout: float = 60) -> Any:
    """Poll a condition with a deadline (returns as soon as it holds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def codex_provider(url: str, *, plugins: bool = False) -> str:
    """The offline model provider (NOTES.md, "Driving the real hosts offline")."""
    return (
        'model = "gpt-test"\nmodel_provider = "scripted"\ncheck_for_update_on_startup = false\n\n'
        "[analytics]\nenabled = false\n\n"
        f'[model_providers.scripted]\nname = "scripted"\nbase_url = "{url}/v1"\nwire_api = "responses"\n'
        'env_key = "FAKE_MODEL_KEY"\nrequires_openai_auth = false\nsupports_websockets = false\n'
        "request_max_retries = 0\nstream_max_retries = 0\n\n"
        # Plugins on (the default) make Codex sync a plugin catalogue from github.com at start.
        + ("" if plugins else "[features]\nplugins = false\n")
    )


@contextmanager
def open_world(host_bin: Path, *, plugin: bool = False) -> Iterator[World]:
    """A throw-away world (see the module docstring), torn down on exit: every host process,
    TUI and the broker stopped, the folder removed (kept with AGENT_BRIDGE_KEEP_HOST_WORLD).
    `plugin`: nothing installed (the test installs the plugin), Codex's plugins on."""
    root = Path(tempfile.mkdtemp(prefix="abh-"))  # short: the broker socket path must fit sun_path
    claude_model, codex_model = AnthropicServer().start(), OpenAIServer().start()
    w = World(root, host_bin, claude_model, codex_model, plugin=plugin)
    if plugin:
        claude_model.prefix = "mcp__plugin_agent-bridge_agent-bridge__"
    keep = os.environ.get("AGENT_BRIDGE_KEEP_HOST_WORLD")
    for folder in (w.home, w.project, w.root / "tmp", w.codex_home):
        folder.mkdir(parents=True, exist_ok=True)
    (w.codex_home / "config.toml").write_text(codex_provider(codex_model.url, plugins=plugin),
                                              encoding="utf-8")
    try:
        if not plugin:
            w.bridge("install", "--claude", "--codex")
        w.bridge("up", "--detach")
        yield w
    finally:
        for tui in w.tuis:
            tui.close()
            if tui.pid is not None:
                wait_gone(tui.pid)
        for proc in w.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        w.bridge("down", check=False)
        for pid in w.leftovers():  # what a host left running (the Codex TUI's daemon): ours, by pid
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        claude_model.close()
        codex_model.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def world(host_bin: Path) -> Iterator[World]:
    with open_world(host_bin) as w:
        yield w


# --- what the model saw -------------------------------------------------------------------

NOTE_PREFIX = "SessionStart hook additional context:"


def claude_system_texts(body: dict[str, Any]) -> list[str]:
    """Texts of the `role: "system"` messages Claude Code puts in `messages` (hook context)."""
    texts = []
    for message in body.get("messages") or ():
        content = message.get("content")
        blocks = [content] if isinstance(content, str) else [
            b.get("text", "") for b in content or () if isinstance(b, dict)]
        for text in blocks:
            if message.get("role") == "system" or (isinstance(text, str) and NOTE_PREFIX in text):
                texts.append(text)
    return texts


def claude_note(body: dict[str, Any]) -> str:
    """The latest SessionStart note Claude Code put before the model ("" when none)."""
    notes = [t.rsplit(NOTE_PREFIX, 1)[1].strip().split("\n\n", 1)[0]
             for t in claude_system_texts(body) if NOTE_PREFIX in t]
    return notes[-1] if notes else ""


def claude_tool_names(body: dict[str, Any]) -> set[str]:
    return {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}


def tool_results(body: dict[str, Any], *, with_searches: bool = False) -> list[dict[str, Any]]:
    """Claude: every `tool_result` block in the conversation, in order, but (unless `with_searches`)
    those of `ToolSearch` (the loading of deferred tools that Claude Code 2.1.332 asks for)."""
    found, searches = [], set()
    for message in body.get("messages") or ():
        content = message.get("content")
        for block in content if isinstance(content, list) else ():
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_use"
                and block.get("name") == "ToolSearch"
                and not with_searches
            ):
                searches.add(block.get("id"))
            if (
                isinstance(block, dict)
                and block.get("type") == "tool_result"
                and block.get("tool_use_id") not in searches
            ):
                found.append(block)
    return found


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(c.get("text", "") for c in content or () if isinstance(c, dict))


def codex_messages(body: dict[str, Any], role: str) -> list[str]:
    texts = []
    for item in body.get("input") or ():
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == role:
            texts.append("".join(c.get("text", "") for c in item.get("content") or () if isinstance(c, dict)))
    return texts


def codex_outputs(body: dict[str, Any]) -> list[list[str]]:
    """Codex: each tool call's output as the model got it: the MCP result's text blocks
    (after Codex's own "Wall time" line)."""
    found = []
    for item in body.get("input") or ():
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            output = item.get("output")
            texts = [output] if isinstance(output, str) else [
                str(c.get("text", "")) for c in output or () if isinstance(c, dict)]
            found.append([t for t in texts if not t.startswith("Wall time:")])
    return found


def plan(*steps: tuple[str, dict[str, Any]]) -> str:
    return "PLAN " + json.dumps([list(s) for s in steps])


# Host log lines about the bridge that must never appear.
CLAUDE_BAD_LOG = re.compile(
    r"SIGINT failed|hook error|hook.*(fail|invalid|not valid)|agent-bridge.*(error|fail|deprecat|traceback)",
    re.I,
)


def GATE_STEP(name: str) -> tuple[str, dict[str, Any]]:  # noqa: N802 - a plan step, spelled like one
    """A plan step that holds the model's next answer until the test opens gate `name`."""
    from tests.hosts.models import GATE

    return GATE, {"gate": name}
