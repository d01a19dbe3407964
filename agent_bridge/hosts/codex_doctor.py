"""What `agent-bridge doctor` checks of Codex: the MCP server and hooks registered in its files,
the [features] key that turns its hooks on, and what only the installed Codex can say (whether it
reads the project's `.codex` and trusts the hooks), asked of `codex app-server` rather than
guessed. Also doctor's line on Codex's idle wake.

The host module (hosts.codex) calls `codex_checks` from `Codex.doctor_checks`; nothing here runs
in a hook.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent_bridge.hosts.base import FAIL, OK, SKIP, WARN, Check
from agent_bridge.hosts.codex_config import (
    WAKE_ENV,
    codex_home,
    codex_program,
    codex_version,
    hooks_feature_key,
)

APP_SERVER_TIMEOUT = 15.0  # seconds for the whole `codex app-server` exchange (about 0.4 s here)


class ProbeError(Exception):
    pass


def codex_app_server(program: str, cwd: Path, *, plugins: bool = False,
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(config layers, hooks) as the installed Codex sees them for `cwd`: `codex app-server`'s
    `config/read` (with `includeLayers`: a project layer Codex ignores carries `disabledReason`)
    and `hooks/list` (each hook's `key`, `sourcePath`, `command`, `currentHash`, `trustStatus`).
    Read-only: it starts no session, and with plugins off it contacts nothing. `plugins`: on,
    for the plugins' hooks (plugin_install trusts them)."""
    import json
    import subprocess
    import threading

    from agent_bridge.common import jsonlimit

    requests = [
        {
            "id": 1,
            "method": "initialize",
            "params": {"clientInfo": {"name": "agent-bridge-doctor", "version": "1"}},
        },
        {"method": "initialized"},
        {"id": 2, "method": "config/read", "params": {"cwd": str(cwd), "includeLayers": True}},
        {"id": 3, "method": "hooks/list", "params": {"cwds": [str(cwd)]}},
    ]
    # Plugins off for this probe: with them, Codex 0.171 looks up its plugin marketplace on the
    # network at start (seen as a DNS query); the answers asked for here do not depend on them.
    try:
        proc = subprocess.Popen(
            [program, "-c", f"features.plugins={str(plugins).lower()}", "app-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=cwd,
        )
    except OSError as exc:
        raise ProbeError(f"cannot run {program} app-server: {exc}") from None
    answers: dict[int, dict[str, Any]] = {}
    timer = threading.Timer(APP_SERVER_TIMEOUT, proc.kill)  # a hung app-server cannot hang doctor
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        proc.stdin.flush()
        for line in proc.stdout:
            try:
                message = jsonlimit.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and message.get("id") in (1, 2, 3):
                answers[message["id"]] = message
            if len(answers) == 3:
                break
    except OSError:  # it exited before reading its requests: reported below as no answer
        pass
    finally:
        timer.cancel()
        proc.kill()
        proc.wait()
    for n in (2, 3):
        if n not in answers:
            raise ProbeError(
                f"{program} app-server did not answer (it exited, or took over {APP_SERVER_TIMEOUT:.0f} s)"
            )
        error = answers[n].get("error")
        if error is not None:
            raise ProbeError(
                f"{program} app-server: {error.get('message', error) if isinstance(error, dict) else error}"
            )
    layers = answers[2].get("result", {}).get("layers") or []
    hooks = [h for entry in answers[3].get("result", {}).get("data") or [] for h in entry.get("hooks") or []]
    return layers, hooks


# hooks/list eventName -> our hook (the names Codex 0.171's app-server gives)
_CODEX_EVENTS = {"sessionStart": "session-start", "postToolUse": "post-tool-use", "stop": "stop",
                 "userPromptSubmit": "user-prompt-submit"}


def codex_trust_checks(program: str, cwd: Path, project_dir: Path, in_project: bool) -> list[Check]:
    import tomlkit

    from agent_bridge.hosts.edits import is_our_hook

    try:
        layers, hooks = codex_app_server(program, cwd)
    except ProbeError as exc:
        return [
            Check("Codex hooks trust", WARN, f"could not ask Codex: {exc}", "run `codex` and check /hooks")
        ]
    checks = []
    ignored = [
        layer
        for layer in layers
        if isinstance(layer, dict)
        and (layer.get("name") or {}).get("type") == "project"
        and layer.get("disabledReason")
    ]
    if in_project:
        if ignored:
            checks.append(
                Check(
                    "Codex project config",
                    FAIL,
                    f"Codex ignores {project_dir}: {ignored[0]['disabledReason']}",
                    f"trust the project: start `codex` in {cwd} and accept the trust prompt, or run "
                    f'`codex exec --trust` there once, or add [projects."{cwd}"] trust_level = "trusted" '
                    f'to {codex_home() / "config.toml"}',
                )
            )
        else:
            checks.append(Check("Codex project config", OK, f"{project_dir} is read (trusted project)"))
    ours = [h for h in hooks if isinstance(h, dict) and h.get("eventName") in _CODEX_EVENTS
            and is_our_hook(h.get("command"), _CODEX_EVENTS[h["eventName"]])]
    untrusted = [h for h in ours if h.get("trustStatus") != "trusted" and not h.get("isManaged")]
    config = codex_home() / "config.toml"
    if not ours:
        checks.append(Check("Codex hooks trust", SKIP, "Codex lists no agent-bridge hook here"))
    elif untrusted:
        snippet = "".join(
            f"\n  [hooks.state.{tomlkit.string(str(h.get('key'))).as_string()}]\n  trusted_hash = "
            f"{tomlkit.string(str(h.get('currentHash'))).as_string()}"
            for h in untrusted
        )
        states = ", ".join(sorted({str(h.get("trustStatus")) for h in untrusted}))
        checks.append(
            Check(
                "Codex hooks trust",
                FAIL,
                f"{len(untrusted)} agent-bridge hook(s) not trusted ({states}): Codex skips them, "
                "`codex exec` without a word",
                "start `codex`, open /hooks and trust the agent-bridge SessionStart, PostToolUse and Stop "
                f"hooks; or, having read them, add to {config}:{snippet}",
            )
        )
    else:
        checks.append(Check("Codex hooks trust", OK, f"{len(ours)} agent-bridge hooks trusted"))
    return checks


def codex_checks(home: Path, cwd: Path) -> list[Check]:
    from agent_bridge.hosts.checks import (
        SERVER,
        duplicate_hooks,
        hooks_check,
        load_toml,
        our_hook_commands,
        reach_check,
        registered_events,
        server_check,
    )

    user_dir = codex_home()
    project_dir = cwd / ".codex"
    if not user_dir.is_dir() and not project_dir.is_dir():
        return [Check("Codex", SKIP, f"no {user_dir} folder: Codex not set up for this user")]
    fix = "agent-bridge install --codex"
    candidates: list[tuple[str, Any, str | None]] = []
    features: list[tuple[Path, dict[str, Any]]] = []
    in_project = False
    for config in (user_dir / "config.toml", project_dir / "config.toml"):
        data, error = load_toml(config)
        if error:
            candidates.append((str(config), None, error))
        if not data:
            continue
        servers = data.get("mcp_servers")
        if isinstance(servers, dict) and SERVER in servers:
            candidates.append((str(config), servers[SERVER], None))
            in_project = in_project or config.parent == project_dir
        if isinstance(data.get("features"), dict):
            features.append((config, data["features"]))
    user_hooks, project_hooks = [user_dir / "hooks.json"], [project_dir / "hooks.json"]
    in_project = in_project or bool(our_hook_commands(project_hooks))
    found = [server_check("Codex MCP server", candidates, home, fix, env_required=True),
             hooks_check("Codex hooks", user_hooks + project_hooks, home, fix)]
    program = codex_program()
    version = codex_version(program) if program else None
    found.append(_codex_feature_check(features, version, fix))
    if program is None:
        found.append(
            Check("Codex hooks trust", SKIP, "no codex on PATH: cannot ask Codex whether it trusts the hooks")
        )
    else:
        found += codex_trust_checks(program, cwd, project_dir, in_project)
    found.append(
        reach_check(
            "Codex",
            registered_events(user_hooks + project_hooks),
            "the block decision (Codex has no additionalContext on Stop)",
            codex_wake_text(os.environ.get(WAKE_ENV)),
        )
    )
    twice = duplicate_hooks(user_hooks, project_hooks, same_command_runs_once=False)
    if twice:
        found.append(
            Check(
                "Codex hooks scope",
                FAIL,
                "registered at user and project scope ("
                + "; ".join(twice)
                + "): Codex runs the matching hooks of every file, so each runs twice",
                "keep one: agent-bridge uninstall --codex --scope project (or --scope user)",
            )
        )
    return found


def _codex_feature_check(features: list[tuple[Path, dict[str, Any]]], version: tuple[int, int, int] | None,
                         fix: str) -> Check:
    name = "Codex hooks feature"
    wanted = hooks_feature_key(version)
    shown = ".".join(map(str, version)) if version else "not on PATH"
    off = [f"{path}: [features] {key} = false" for path, table in features for key in ("hooks", "codex_hooks")
           if table.get(key) is False]
    if off:
        return Check(name, FAIL, "hooks are switched off: " + "; ".join(off), fix)
    if wanted == "codex_hooks":
        if any(table.get("codex_hooks") is True for _, table in features):
            return Check(name, OK, f"[features] codex_hooks = true (Codex {shown} needs it)")
        return Check(name, FAIL, f"Codex {shown} runs hooks only with [features] codex_hooks = true", fix)
    deprecated = [str(path) for path, table in features if "codex_hooks" in table]
    if deprecated and version:
        return Check(name, WARN, f"[features] codex_hooks is deprecated (Codex {shown} warns on every run): "
                     + ", ".join(deprecated), fix)
    return Check(name, OK, f"hooks are on (Codex {shown}: on by default)" if version else
                 "hooks are on unless switched off (no codex on PATH to ask its version)")


def codex_wake_text(setting: str | None) -> str:
    """doctor's line on Codex's idle wake, for AGENT_BRIDGE_CODEX_WAKE's value here."""
    if setting == "0":
        return "off (AGENT_BRIDGE_CODEX_WAKE=0 here): an idle Codex sees a message at its next turn"
    when = (
        "; also where no TUI is known (AGENT_BRIDGE_CODEX_WAKE=1 here)" if setting == "1" else
        ". It does not fire: in `codex exec`; in a TUI of `codex resume` that joined an app-server "
        "daemon an earlier TUI left running (its hooks cannot tell whether that TUI is open: "
        "AGENT_BRIDGE_CODEX_WAKE=1 wakes there too); after Esc (Codex runs no queued turn then); "
        "there the message waits for the next turn"
    )
    return ("`codex queue` by a waiter the Stop or Interrupt hook starts, on by default, while the TUI "
            "that started the session's app-server daemon runs (its daemon outlives it)" + when)
