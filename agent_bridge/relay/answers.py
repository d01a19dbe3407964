"""The lines the relay writes to the host itself, and the id a broker's line answers, with no I/O
but reading the generated data once.

With no broker at all, `initialize`, `tools/list` and `ping` are answered from data generated
from the real server (`mcp_static.json`, written by `python -m agent_bridge.broker.mcp.static`);
so are the shapes of a tool error and of an `inbox` result.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agent_bridge.core import showing
from agent_bridge.ipc import protocol

STATIC = Path(__file__).parent / "mcp_static.json"
INTERNAL_ERROR = -32603  # JSON-RPC 2.0
INVALID_REQUEST = -32600
# The head of a JSON-RPC answer as the SDK and mcp_fast serialize one: its id (a number or a
# string) and then its result or error (answer_key).
ANSWER_HEAD = re.compile(
    r'\{"jsonrpc":"2\.0","id":(-?(?:0|[1-9]\d*)|"[^"\\]*(?:\\.[^"\\]*)*"),"(?:result|error)":'
)


def answer_key(line: str) -> str | None:
    """The id a line from the broker answers, keyed (showing.key); None for a notification, a
    request, or what is not JSON."""
    head = ANSWER_HEAD.match(line)
    if head is not None:  # an answer as the SDK and mcp_fast write it: the id read from its
        # head, not the whole line parsed (a `decisions` result is tens of KB)
        digits = head.group(1)
        if digits[0] != '"':
            return str(int(digits)) if digits[0] == "-" else digits
    elif '"method"' in line[:200] and '"id"' not in line[:200]:
        return None
    try:  # a string id, or any other shape
        if head is not None:
            return showing.key(json.loads(head.group(1)))
        message = json.loads(line)
    except (ValueError, RecursionError):  # the broker's lines: not checked for depth (hot path)
        return None
    if not isinstance(message, dict) or "id" not in message or "method" in message:
        return None
    return showing.key(message["id"])


def answer(rid: Any, *, result: Any = None, error: dict[str, Any] | None = None) -> str:
    body = {"error": error} if error is not None else {"result": result}
    return json.dumps({"jsonrpc": "2.0", "id": rid, **body}, ensure_ascii=False)


class Static:
    """The generated answers, read on first use (most sessions never need them)."""

    def __init__(self, agent: str) -> None:
        self.agent = agent
        self._data: dict[str, Any] | None = None

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            self._data = json.loads(STATIC.read_text(encoding="utf-8"))
        return self._data

    def initialize(self, params: Any) -> dict[str, Any]:
        """The answer to `initialize` (`result` or `error`) for the version the host asked."""
        wanted = params.get("protocolVersion") if isinstance(params, dict) else None
        answers = self.data["initialize"]["claude" if self.agent == "claude" else "other"]
        found = answers.get(wanted) if isinstance(wanted, str) else None
        return found or answers["unknown"]  # type: ignore[no-any-return]

    def tools_list(self) -> Any:
        return self.data["tools/list"]

    @property
    def inbox_ids_max(self) -> int:
        return int(self.data["inboxIdsMax"])

    def tool_error(self, rid: Any, tool: str, text: str) -> str:
        template = self.data["toolError"]
        marks, result = template["marks"], template["result"]
        filled = [dict(c, text=c["text"].replace(marks["tool"], tool).replace(marks["reason"], text))
                  for c in result["content"]]
        return answer(rid, result=dict(result, content=filled))

    def inbox_result(self, rid: Any, messages: list[dict[str, Any]]) -> str:
        template = self.data["inboxResult"]
        mark = template["marks"]["messages"]
        text = json.dumps(messages, ensure_ascii=False)
        content = [dict(c, text=text) if c["text"] == mark else c for c in template["result"]["content"]]
        return answer(rid, result=dict(template["result"], content=content))


def invalid_request(message: dict[str, Any], problem: str) -> str | None:
    """JSON-RPC "Invalid Request" for a line the relay will not pass on (`message`: its
    top-level members, as far as they could be read): answered with the request's id when it
    has a usable one, else with null (JSON-RPC 2.0); a notification gets no answer (None)."""
    rid = message.get("id")
    if "id" not in message and isinstance(message.get("method"), str):
        return None
    if isinstance(rid, bool) or not isinstance(rid, (int, str)) or protocol.unstorable_text(rid):
        rid = None  # not an id JSON-RPC allows, or one we could not write back as UTF-8
    return answer(rid, error={"code": INVALID_REQUEST, "message": f"Invalid Request: {problem}"})
