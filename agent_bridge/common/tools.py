"""The MCP tools (SPEC §5), one entry each: the one table to extend for a new tool.

Standard library only: the relay reads its retry rules and its advice from here. Everything
else is derived from this table:
- the tools the broker's MCP server lists and calls (broker.mcp.host: `build_server`), with
  the arguments each takes judged by its `schema` (unknown ones refused, JSON types strict);
- the tool ops of the bridge protocol (ipc.protocol: `OPS`) and the broker's handler check;
- the relay's rule for a call in flight when the broker went away (`idempotent`, `unsure`);
- the relay's answers with no broker (agent_bridge/relay/mcp_static.json) and docs/mcp-tools.md.

Adding a tool: an entry here, and its op's handler in broker.state (see docs/mcp-tools.md).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agent_bridge.common import domain, questions


class Tool(NamedTuple):
    name: str
    op: str | None  # the bridge op it carries out as the calling session (None: served from its inbox)
    description: str  # what the model reads: the words an agent searching deferred tools would use
    schema: dict[str, Any]  # the input schema as advertised, limits included; arguments are judged by it
    idempotent: bool  # carrying it out twice changes nothing: the relay resends it after a lost connection
    unsure: str = ""  # not idempotent: what to do when it may or may not have been carried out
    retry_key: str = ""  # an argument that makes a call of it idempotent: one that carries it is resent
    cli: bool = False  # its op is also a control request (an `agent-bridge` command sends it)
    body: str = ""  # "" the op with the given arguments, its answer as JSON; else the body in broker.mcp.host


def _object(required: tuple[str, ...] = (), **properties: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


STRING: dict[str, Any] = {"type": "string"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
# Any JSON value, or a string holding JSON or `all`; the broker judges it (domain.normalize_scope).
SCOPE: dict[str, Any] = {"description": "all|{project:dir}|{sessions:[names]}"}
INBOX_WAIT_MAX = 60  # seconds an `inbox` call may wait for a first message
SENT_WAIT_MAX = 50  # seconds a `sent` call may wait for a change
SENT_IDS_MAX = 100  # message ids one `sent` call may name
JOB_TASK_MAX = 20_000  # characters of a delegated task or a `continue` message
JOB_WAIT_MAX = 50  # seconds a `delegate` call may wait for the job to end
ASK_WAIT_MAX = 50  # seconds an `ask_owner` call may wait for the owner's answer
# The argument a host's plugin adds to each of its session's tool calls where one MCP server serves
# all of the host's sessions (opencode serve): which session calls. The relay's router takes it out
# and hands the call to that session's relay (relay.router); the broker never sees it.
HOST_SESSION_ARGUMENT = "agent_bridge_session"

_TOOLS = (
    Tool(
        "decide",
        "decide",
        "Pin the owner's decision in scope. Research the owner's choice before recording it.",
        _object(
            ("topic", "text"),
            topic={**STRING, "maxLength": domain.TOPIC_MAX},
            text={**STRING, "maxLength": domain.TEXT_MAX},
            scope=SCOPE,
            source_message_id=STRING,
        ),
        idempotent=False,
        unsure="check with `decisions` before retrying",
        cli=True,
        body="tool_decide",
    ),
    Tool(
        "decisions",
        "decisions",
        "Owner decisions, newest first; query: words; history: old too.",
        _object(query={**STRING, "maxLength": domain.QUERY_MAX}, scope=SCOPE, history=BOOLEAN),
        idempotent=True,
        body="tool_decisions",
    ),
    Tool(
        "whoami",
        "whoami",
        "Your id, name, agent, project.",
        _object(),
        idempotent=True,
    ),
    Tool(
        "peers",
        "peers",
        "Agent sessions to message, busy/idle/offline.",
        _object(project=STRING),
        idempotent=True,
    ),
    Tool(
        "send",
        "send",
        "Message agent sessions, running or not. to: name, id, claude|codex, * (project). "
        "message_id: safe retry; `sent` says if read: don't resend.",
        _object(
            ("to", "text"), to=STRING, text={**STRING, "maxLength": domain.MESSAGE_TEXT_MAX}, reply_to=STRING,
            message_id=STRING,
        ),
        idempotent=False,
        cli=True,
        unsure="check with `sent` before sending it again, or send it again with a message_id",
        retry_key="message_id",
    ),
    Tool(
        "sent",
        "sent",
        "Your messages' receipts: shown, acked, woken, replies.",
        _object(
            ids={"type": "array", "maxItems": SENT_IDS_MAX, "items": STRING},
            wait_seconds={"type": "number", "minimum": 0, "maximum": SENT_WAIT_MAX},
        ),
        idempotent=True,
    ),
    Tool(
        "inbox",
        None,
        "Your inbox: agent sessions' messages (not the user's), oldest first; read unless peek.",
        _object(wait_seconds={"type": "number", "minimum": 0, "maximum": INBOX_WAIT_MAX}, peek=BOOLEAN),
        # An `inbox` result never written to the host acknowledges nothing.
        idempotent=True,
        body="tool_inbox",
    ),
    Tool(
        "ask_owner",
        "ask_owner",
        "Ask the owner only what they must decide; check `decisions` first.",
        # `question`, or `withdraw` (an id) alone: neither is required by the schema, the broker
        # refuses a call with neither or both (broker.ops.questions).
        _object(
            question={**STRING, "maxLength": questions.QUESTION_MAX},
            topic={**STRING, "maxLength": domain.TOPIC_MAX},
            options={
                "type": "array",
                "maxItems": questions.OPTIONS_MAX,
                "items": {**STRING, "maxLength": questions.OPTION_MAX},
            },
            scope=SCOPE,
            context={**STRING, "maxLength": questions.CONTEXT_MAX},
            recommended={"type": "integer"},
            wait_seconds={"type": "number", "minimum": 0, "maximum": ASK_WAIT_MAX},
            withdraw=STRING,
        ),
        # Asked again, a question joins the open one it repeats: the same question, nobody added.
        idempotent=True,
    ),
)
_JOB_TOOLS = (
    Tool(
        "delegate",
        "delegate",
        # (shorter than it was by the bytes the third host's name costs in `agent`: SPEC §9's 3,200)
        "Another agent's view or work as a job: read-only unless edit/worktree; answer: a message.",
        _object(
            ("agent", "task"),
            agent={**STRING, "enum": ["claude", "codex", "opencode"]},  # hosts.NAMES (checked by tests)
            task={**STRING, "maxLength": JOB_TASK_MAX},
            title=STRING,
            access={**STRING, "enum": ["read", "edit"]},
            worktree=BOOLEAN,
            model=STRING,
            cwd=STRING,
            wait_seconds={"type": "number", "minimum": 0, "maximum": JOB_WAIT_MAX},
            timeout_seconds={"type": "number"},
        ),
        idempotent=False,
        unsure="check `job` or `agent-bridge jobs` before delegating it again",
    ),
    Tool(
        "job",
        "job",
        "Status, continue (message), cancel a job.",
        _object(("id",), id=STRING, action={**STRING, "enum": ["status", "continue", "cancel"]},
                message=STRING),
        idempotent=False,
        unsure="check the job's status before asking again",
    ),
)
TOOLS: dict[str, Tool] = {tool.name: tool for tool in (*_TOOLS, *_JOB_TOOLS)}


def unsure_advice(name: str | None) -> str:
    """What the agent should do after a call of `name` that may or may not have been carried out."""
    tool = TOOLS.get(name or "")
    return tool.unsure if tool is not None and tool.unsure else TOOLS["decide"].unsure


def idempotent(name: str | None, arguments: Any = None) -> bool:
    """Resent after a lost connection? An unknown tool is refused by the broker, which changes
    nothing; a call that carries its tool's retry key (`send` with a message_id) is answered
    with what it stored the first time."""
    tool = TOOLS.get(name or "")
    if tool is None or tool.idempotent:
        return True
    return bool(tool.retry_key) and isinstance(arguments, dict) and arguments.get(tool.retry_key) is not None
