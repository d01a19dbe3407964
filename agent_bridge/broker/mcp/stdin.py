"""The host's lines on stdin, checked before the MCP SDK parses them.

JSON admits a lone surrogate (`"\\ud800"`); UTF-8, and so the broker's database and every
reader, cannot hold one. The SDK's stdio reader fails to validate such a line and drops it
(tests/reliability/test_surrogates.py), so the host's request would never be answered. This
module (run by the broker, on the lines the relay forwards) answers it instead: a `tools/call`
with the tool error the host shows its agent, any other request with JSON-RPC "invalid params".
Every other line goes to the SDK untouched.

Kept apart from the rest of the SDK adapter: it only needs `stdio_server(stdin=...)` and the
SDK's write stream, both public.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import mcp_types as types
import trio
from mcp.shared.message import SessionMessage

from agent_bridge.common import jsonlimit
from agent_bridge.ipc.protocol import unstorable_text

INVALID_PARAMS = -32602  # JSON-RPC 2.0


def refusal(line: str) -> dict[str, Any] | None:
    """The answer to a request line whose params hold a lone surrogate, or None to pass it on."""
    if "\\ud" not in line and "\\uD" not in line:  # a lone surrogate can only arrive escaped
        return None
    try:
        message = jsonlimit.loads(line)
    except ValueError:
        return None  # the SDK answers malformed lines its own way
    if not isinstance(message, dict) or "method" not in message:
        return None
    where = unstorable_text(message.get("params"), "params")
    if where is None:
        return None
    request_id = message.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)) or unstorable_text(request_id):
        return {}  # a notification (or an id we could not echo): nothing to answer, nothing to pass on
    problem = (
        f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape); text must be valid Unicode"
    )
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if message.get("method") == "tools/call" and isinstance(name, str) and unstorable_text(name) is None:
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "result": {
                "content": [
                    {
                        "type": "text",
                        "text": f"Error executing tool {name}: {problem.removeprefix('params.arguments.')}",
                    }
                ],
                "isError": True,
            },
        }
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": INVALID_PARAMS, "message": problem}}


class GuardedStdin:
    """`stdio_server(stdin=guard.lines())`, then `guard.answer_through(write_stream)`."""

    def __init__(self) -> None:
        self._out: Any = None
        self._ready = trio.Event()

    def answer_through(self, write_stream: Any) -> None:
        self._out = write_stream
        self._ready.set()

    async def lines(self, source: AsyncIterable[str]) -> AsyncIterator[str]:
        """The lines of `source` (the host's, as its relay read them: UTF-8, undecodable bytes
        replaced), less the ones answered here."""
        async for line in source:
            answer = refusal(line)
            if answer is None:
                yield line
            elif answer:
                await self._ready.wait()
                await self._out.send(SessionMessage(types.jsonrpc_message_adapter.validate_python(answer)))
