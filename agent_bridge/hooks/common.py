"""What the SessionStart and Stop hooks share: reading the host's hook input, reporting the host
identity to the broker (or leaving it for the next one), logging, and printing the answer.

Light on purpose (SPEC §9, STYLE pattern 6): standard library, `paths`, `procinfo` and the
blocking IPC client only. Never import trio, mcp, quart or hypercorn here.

Host documentation these hooks follow:
- Claude Code, "Hooks reference" (https://code.claude.com/docs/en/hooks): command hooks get one
  JSON object on stdin (`session_id`, `transcript_path`, `cwd`, `hook_event_name`, plus
  `source` for SessionStart and `stop_hook_active` for Stop); exit 0 with JSON on stdout.
- Codex, "Hooks" (https://developers.openai.com/codex/hooks): the same event -> matcher group ->
  handler model and the same stdin fields (plus `model`, `permission_mode`, `turn_id`); a
  SessionStart answer is `hookSpecificOutput.additionalContext`, a Stop answer
  `{"decision": "block", "reason": ...}` (codex-rs/hooks/schema/generated/*.command.output.schema.json).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from agent_bridge.common import jsonlimit, paths, procinfo
from agent_bridge.hosts.base import HookInput  # (defined beside the hosts, which read it)

BROKER_TIMEOUT = 0.8  # seconds for one broker request: a hook must never hold up its host
STDIN_MAX = 8 << 20  # bytes of hook input we accept (a Stop input carries the last reply)
SESSION_ID_MAX = 200  # same bound as any session address
SOURCES = frozenset({"startup", "resume", "clear", "compact", "fork"})


class HookInputError(ValueError):
    """The host's hook input is not what its documentation describes."""


class SessionIdError(HookInputError):
    """The input is usable but its `session_id` cannot be reported (it cannot be encoded):
    `hook` is the rest of the input, with an empty session id, for what needs no identity."""

    def __init__(self, message: str, hook: HookInput) -> None:
        super().__init__(message)
        self.hook = hook


def parse_input(raw: bytes) -> HookInput:
    """Validate the hook's stdin. Raises HookInputError naming what is wrong."""
    from agent_bridge.common import domain

    if len(raw) > STDIN_MAX:
        raise HookInputError(f"hook input of {len(raw)} bytes exceeds {STDIN_MAX}")
    try:
        data = jsonlimit.loads(raw)
    except jsonlimit.TooDeep as exc:
        raise HookInputError(f"hook input: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise HookInputError(f"hook input is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise HookInputError(f"hook input must be a JSON object, got {type(data).__name__}")
    session_id = data.get("session_id")
    if not isinstance(session_id, str) or not session_id.strip():
        raise HookInputError("hook input has no session_id string")
    session_id = session_id.strip()
    if len(session_id) > SESSION_ID_MAX:
        raise HookInputError(f"session_id longer than {SESSION_ID_MAX} characters")
    cwd = data.get("cwd")
    if cwd is None:
        cwd = os.getcwd()  # both hosts start hooks in the session's folder
    try:
        folder = domain.normalize_folder(cwd, what="cwd")
    except domain.InputError as exc:
        raise HookInputError(str(exc)) from None
    source = data.get("source")
    source = source if isinstance(source, str) and source in SOURCES else ""
    stop_hook_active = data.get("stop_hook_active") is True
    transcript = data.get("transcript_path")
    transcript = transcript if isinstance(transcript, str) and "\x00" not in transcript else ""
    prompt_id = data.get("prompt_id")
    prompt_id = prompt_id if isinstance(prompt_id, str) and 0 < len(prompt_id) <= SESSION_ID_MAX else ""
    lone = next((i for i, c in enumerate(session_id) if "\ud800" <= c <= "\udfff"), None)
    if lone is not None:  # valid JSON, but no UTF-8 for the report, the socket or the log
        raise SessionIdError(
            f"session_id is not valid Unicode: a lone surrogate U+{ord(session_id[lone]):04X} "
            f"at position {lone}",
            HookInput("", folder, source, stop_hook_active, transcript, prompt_id),
        )
    return HookInput(session_id, folder, source, stop_hook_active, transcript, prompt_id)


def read_raw() -> bytes:
    """The hook's stdin, up to one byte past the limit (so that `parse_input` can refuse it)."""
    return sys.stdin.buffer.read(STDIN_MAX + 1)


def read_input() -> HookInput:
    return parse_input(read_raw())


def identify_args(
    agent: str, hook: HookInput, event: str, host: procinfo.Proc | None, chain: list[procinfo.Proc]
) -> dict[str, Any]:
    """The `identify` request arguments (SPEC §3 "Host session identity")."""
    return {
        "hostSessionId": hook.session_id,
        "agent": agent,
        "host": procinfo.host_json(host),
        "chain": [p.to_json() for p in chain],
        "cwd": hook.cwd,
        "source": hook.source,
        "event": event,
    }


def report_path(home: Path, host_session_id: str) -> Path:
    """`<home>/reports/<sha256(host session id)[:32]>.json`: one report per host session."""
    return home / paths.REPORTS_DIR / f"{paths.host_session_digest(host_session_id)}.json"


def leave_report(home: Path, args: dict[str, Any]) -> Path:
    """Leave the identity where the next broker finds it (no broker runs now).

    A Stop report does not know the SessionStart `source`; keep the one an earlier report had,
    so a `/clear` is still seen as a new identity by the broker that reads it.
    """
    paths.ensure_home(home)
    folder = home / paths.REPORTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    if sys.platform != "win32" and folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
    target = report_path(home, args["hostSessionId"])
    report = dict(args)
    if not report.get("source"):
        try:
            earlier = jsonlimit.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            earlier = None
        if isinstance(earlier, dict) and earlier.get("hostSessionId") == report["hostSessionId"]:
            source = earlier.get("source")
            if isinstance(source, str) and source in SOURCES:
                report["source"] = source
    paths.write_private(target, json.dumps(report, ensure_ascii=False, separators=(",", ":")))
    return target


def broker_request(home: Path, op: str, args: dict[str, Any]) -> dict[str, Any] | None:
    """Send `op` to the running broker. None when no broker answers, after leaving the report.

    A broker that answers with an error is logged; the hook goes on without it.
    """
    if not (home / paths.BROKER_JSON).exists():
        leave_report(home, args)  # no broker record: skip loading the socket client at all
        return None
    from agent_bridge.ipc import blocking, protocol

    try:
        result = blocking.call(home, op, timeout=BROKER_TIMEOUT, **args)
    except (blocking.BrokerUnavailable, OSError):
        leave_report(home, args)
        return None
    except protocol.ProtocolError as exc:
        log(home, op, f"broker answered with a malformed frame: {exc}")
        return None
    except protocol.RemoteError as exc:
        log(home, op, f"broker refused {op}: {exc.code}: {exc.message}")
        return None
    return result if isinstance(result, dict) else None


def log(home: Path, what: str, line: str) -> None:
    paths.append_log(home, f"hook {what}: " + " ".join(str(line).split()))


def emit(obj: dict[str, Any]) -> None:
    """Print the hook's JSON answer on stdout (one line, UTF-8)."""
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"
    sys.stdout.buffer.write(data.encode("utf-8"))
    sys.stdout.buffer.flush()
