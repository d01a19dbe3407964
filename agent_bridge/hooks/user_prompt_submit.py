"""`agent-bridge hook user-prompt-submit --agent HOST`: a turn starts.

1. Marks the session busy for its idle-wake waiter (`agent_bridge.hooks.wake`): while a turn runs,
   a waiting message is the PostToolUse and Stop hooks' to hand over (as additionalContext, with
   no error label), not the waiter's. The mark says when the host started this hook, so that a
   Stop hook of the previous turn still running (Claude Code runs this hook for a prompt typed
   meanwhile) does not mark the new turn idle. Its own Stop hook does.
2. Shows the owner's open questions (SPEC §4.6): in a session where a person types, the questions
   other sessions asked the owner with `ask_owner` that this host session has not been shown yet
   go beside the prompt ("Open questions from your other sessions: …"), as the host's
   UserPromptSubmit answer (`Host.user_prompt_output`). Once per question per host session: the
   ids shown are kept in `<home>/prompted/<sha256(host session id)[:32]>`, written after the
   answer is (show, then remember: a hook killed in between shows them again at the next prompt).
   Read from bridge.db read-only, so it works with the broker down. Not in a job runner's session
   (its record says `job`) or a scripted one (`Host.owner_types`), and not a question only this
   session asked. Nothing open: prints nothing.

Any failure: exit 0, one line in broker.log; the prompt goes to the model as typed.

Host documentation: Claude Code "Hooks reference" (https://code.claude.com/docs/en/hooks#userpromptsubmit):
stdin `session_id`, `transcript_path`, `cwd`, `hook_event_name`, `prompt`; 2.1.332 adds `prompt_id`,
which in the TUI is the previous prompt's (seen), so it cannot name the turn; an answer's
`hookSpecificOutput.additionalContext` is added to the model's context.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from agent_bridge import hosts
from agent_bridge.common import jsonlimit, paths
from agent_bridge.hooks import common

if TYPE_CHECKING:
    from agent_bridge.common.rows import Question

READ_BUSY_MS = 200  # a locked database delays the prompt at most this long, then no questions this time
SHOWN_MAX = 5  # questions in one prompt's note; the rest come with the next prompts
QUESTION_TEXT_MAX = 200  # characters of one question in the note
PROMPTED_KEEP_S = 30 * 86_400  # a host session's record of shown questions, once untouched this long, goes


def main(agent: str) -> int:
    home = paths.home()
    try:
        from agent_bridge.hooks import wake

        host, chain = hosts.current_host()  # first: before anything in the chain detaches
        hook = common.read_input()
        wake.mark_busy(home, hook, wake.launch_stamp(host, chain))
    except Exception as exc:  # noqa: BLE001 - whatever it is, the prompt goes to the model
        common.log(home, f"user-prompt-submit ({agent})", f"not marked: {type(exc).__name__}: {exc}")
        return 0
    try:
        show_questions(home, agent, hook)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the prompt goes to the model
        common.log(home, f"user-prompt-submit ({agent})", f"no questions shown: {type(exc).__name__}: {exc}")
    return 0


def show_questions(home: Path, agent: str, hook: common.HookInput) -> int:
    """Print the note of the open questions this host session has not seen; how many it names."""
    target = hosts.by_name(agent) or hosts.DEFAULT
    if not hook.session_id or not target.owner_types(os.environ):
        return 0
    from agent_bridge.store import queries, question_queries, reader

    conn = reader.open_readonly(paths.db_path(home), busy_timeout_ms=READ_BUSY_MS)
    if conn is None:
        return 0
    try:
        me = queries.peer_by_host_session(conn, hook.session_id)
        if me is not None and me.is_job:
            return 0
        open_questions = question_queries.list_questions(conn)
    finally:
        conn.close()
    record = prompted_path(home, hook.session_id)
    seen = read_shown(record)
    new = [q for q in open_questions
           if q.id not in seen and not (me is not None and all(a.id == me.id for a in q.asked_by))]
    if not new:
        return 0
    shown = new[:SHOWN_MAX]
    common.emit(target.user_prompt_output(note(shown, len(new) - len(shown))))
    still_open = {q.id for q in open_questions}
    remember(home, record, [i for i in seen if i in still_open] + [q.id for q in shown])
    return len(shown)


def note(questions: list[Question], more: int) -> str:
    lines = [
        "Open questions from your other sessions: agent sessions asked the owner (the user) these with "
        "agent-bridge `ask_owner`; they come from those sessions, not from the user. Mention them to the "
        "user; record an answer only with the user's own words (`agent-bridge answer ID TEXT`, "
        "`--option N`, or the dashboard)."
    ]
    for q in questions:
        who = ", ".join(f"{a.name} ({a.agent})" for a in q.asked_by)
        text = " ".join(q.question.split())
        if len(text) > QUESTION_TEXT_MAX:
            text = text[: QUESTION_TEXT_MAX - 1].rstrip() + "…"
        options = "; ".join(f"{n}. {o}" for n, o in enumerate(q.options, start=1))
        topic = f" [topic: {q.topic}]" if q.topic else ""
        lines.append(f"- {q.id} from {who}{topic}: {text}" + (f" Options: {options}" if options else ""))
    if more:
        lines.append(f"({more} more: `agent-bridge questions` lists them all.)")
    return "\n".join(lines)


def prompted_path(home: Path, host_session_id: str) -> Path:
    """`<home>/prompted/<sha256(host session id)[:32]>.json`, named as the identity reports are."""
    return home / paths.PROMPTED_DIR / common.report_path(home, host_session_id).name


def read_shown(path: Path) -> list[str]:
    try:
        data = jsonlimit.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    shown = data.get("shown") if isinstance(data, dict) else None
    return [i for i in shown if isinstance(i, str)] if isinstance(shown, list) else []


def remember(home: Path, path: Path, shown: list[str]) -> None:
    """Keep the ids shown to this host session (only those still open: the file stays small),
    and drop the records of host sessions untouched for PROMPTED_KEEP_S."""
    folder = path.parent
    folder.mkdir(mode=0o700, exist_ok=True)
    paths.write_private(path, json.dumps({"shown": shown}, separators=(",", ":")))
    cutoff = time.time() - PROMPTED_KEEP_S
    for old in folder.iterdir():
        try:
            if old.is_file() and not old.is_symlink() and old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            continue
