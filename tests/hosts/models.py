"""Scripted model servers on 127.0.0.1 for the real host CLIs: the Anthropic Messages API
(Claude Code), the OpenAI Responses API (Codex) and the OpenAI chat completions API (opencode's
`@ai-sdk/openai-compatible` provider), all streamed as server-sent events.

The model is a script, not a model: the first user prompt of a conversation may carry a plan,
`PLAN [["tool", {args}], ...]`, and each request answers with the next planned tool call (the
number of tool results already in the conversation says which), then a short text. A step
`["=wait", {"gate": NAME}]` holds the next answer until the test opens NAME, so a session can be
kept "working" while another acts. A step named with a capital ("Bash") calls that built-in tool
of Claude Code, one marked "!" ("!exec_command") that of Codex. A planned bridge tool that
Claude Code lists only by name (it defers MCP tools from 2.1.332) is first loaded with
`ToolSearch`, as a model must. A request the host makes beside a turn (`aside`: a session's
title, which Claude Code 2.1.337's TUI asks for as structured output, and opencode with its small
model) is answered as asked and never takes a plan step. Every request is recorded with its
headers, so a test asserts what the model was shown; `turns_of` gives a session's requests
without the asides.

Standard library only (a threading HTTP server): the hosts are Node and Rust programs talking
plain HTTP/1.1; nothing here needs the bridge's own async stack.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PLAN = re.compile(r"PLAN (\[.*\])", re.S)
DONE_TEXT = "done."
GATE = "=wait"  # a plan step ["=wait", {"gate": NAME}]: hold the answer until the test opens NAME
GATE_TIMEOUT = 60.0
SEARCH = "ToolSearch"  # Claude Code's loader of deferred tools (2.1.332)
BUILTIN = "!"  # a Codex plan step "!exec_command" calls that built-in tool of Codex
LOADING = "=load"  # marks, in one request's bookkeeping, the searches this server made to load a tool


class _HTTPServer(ThreadingHTTPServer):
    """A host that hangs up while it is answered (a request it gave up, a host the test ended)
    is no error of the server's: the request was recorded before the answer. Anything else is
    printed as http.server prints it."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    aside: bool = False  # made beside a turn, not one of its steps (ModelServer.beside_turn)
    at: float = field(default_factory=time.monotonic)  # when it arrived (the benchmarks time by it)

    @property
    def text(self) -> str:
        """Everything the model was shown in this request, as one string (for `in` checks)."""
        return json.dumps(self.body, ensure_ascii=False)


@dataclass
class ModelServer:
    """Base: records requests, serves until closed. Subclasses answer one API."""

    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    httpd: ThreadingHTTPServer | None = None
    gates: dict[str, tuple[threading.Event, threading.Event]] = field(default_factory=dict)

    def gate(self, name: str) -> tuple[threading.Event, threading.Event]:
        """(reached, opened): a session is waiting at the gate / the test let it go on."""
        with self.lock:
            return self.gates.setdefault(name, (threading.Event(), threading.Event()))

    def open_gate(self, name: str) -> None:
        self.gate(name)[1].set()

    def wait_reached(self, name: str, timeout: float = GATE_TIMEOUT) -> None:
        if not self.gate(name)[0].wait(timeout):
            raise AssertionError(f"no session reached gate {name!r} within {timeout} s")

    def next_step(
        self, steps: list[tuple[str, dict[str, Any]]], done: int
    ) -> tuple[str, dict[str, Any]] | None:
        """The planned call after `done` results (None: answer with text), once every gate
        planned before it is open."""
        calls = [i for i, (tool, _) in enumerate(steps) if tool != GATE]
        position = calls[done] if done < len(calls) else len(steps)
        for tool, args in steps[:position]:
            if tool == GATE:
                reached, opened = self.gate(str(args["gate"]))
                reached.set()
                if not opened.wait(GATE_TIMEOUT):
                    raise AssertionError(f"gate {args['gate']!r} never opened")
        return steps[position] if position < len(steps) else None

    def start(self) -> ModelServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                body = b"{}"
                self.send_response(404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"unparsed": raw.decode("utf-8", "replace")}
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                  aside=server.beside_turn(body))
                with server.lock:
                    server.requests.append(request)
                payload = server.encode(list(server.answer(request)))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = _HTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()

    def answer(self, request: Request) -> Iterator[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def beside_turn(self, body: dict[str, Any]) -> bool:
        """Whether the host makes this request beside a turn (a session's title), by what the
        request declares; such a request never takes a step of the plan."""
        return False

    def encode(self, events: list[tuple[str, dict[str, Any]]]) -> bytes:
        """The answer's server-sent events, each named."""
        return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()

    def of_session(self, session_id: str) -> list[Request]:
        """Every request of the session, oldest first, the asides too (what the host sent)."""
        with self.lock:
            return [r for r in self.requests if self.session_of(r) == session_id]

    def turns_of(self, session_id: str) -> list[Request]:
        """The requests of the session's turns, oldest first: `of_session` without the asides."""
        return [r for r in self.of_session(session_id) if not r.aside]

    def session_of(self, request: Request) -> str | None:
        raise NotImplementedError


def plan_of(prompt: str) -> list[tuple[str, dict[str, Any]]]:
    found = PLAN.search(prompt)
    if not found:
        return []
    # the plan's own JSON value: text after it (opencode adds more to the prompt) is not part of it
    steps, _ = json.JSONDecoder().raw_decode(prompt, found.start(1))
    return [(str(step[0]), dict(step[1])) for step in steps]


# --- Anthropic Messages API (Claude Code) -------------------------------------------------


def _anthropic_texts(content: Any) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"]


def _output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a request asks its answer to follow (structured output), or None."""
    config = body.get("output_config")
    wanted = config.get("format") if isinstance(config, dict) else None
    if not isinstance(wanted, dict) or wanted.get("type") != "json_schema":
        return None
    schema = wanted.get("schema")
    return schema if isinstance(schema, dict) else None


def _example(schema: dict[str, Any]) -> Any:
    """A value `schema` accepts, for the schemas the hosts were seen asking for (Claude Code
    2.1.337's session title: an object with a string `title`)."""
    kind = schema.get("type")
    if kind == "object":
        return {name: _example(part) for name, part in (schema.get("properties") or {}).items()}
    if kind == "string":
        return "Scripted session"
    raise ValueError(f"no example for a schema of type {kind!r} yet: {schema}")


def _loading(block: dict[str, Any], prefix: str) -> bool:
    """A ToolSearch call this server made to load a planned tool (not a planned search)."""
    query = (block.get("input") or {}).get("query") if isinstance(block.get("input"), dict) else None
    return block.get("name") == SEARCH and isinstance(query, str) and query.startswith(f"select:{prefix}")


class AnthropicServer(ModelServer):
    """`POST /v1/messages` answered as a stream: the next planned `mcp__agent-bridge__*` call
    (`prefix`: the plugin's server is `mcp__plugin_agent-bridge_agent-bridge__*`)."""

    prefix = "mcp__agent-bridge__"

    def session_of(self, request: Request) -> str | None:
        return request.headers.get("x-claude-code-session-id")

    def beside_turn(self, body: dict[str, Any]) -> bool:
        """Structured output asked for, no tools offered: the session title Claude Code 2.1.337's
        TUI asks for beside the turn's own request, at the first typed prompt (again at the next
        while no answer gave one), the typed prompt in `<session>` tags; `claude -p` asks none
        (seen). The answer is its `ai-title` entry in the transcript."""
        return _output_schema(body) is not None and not body.get("tools")

    def answer(self, request: Request) -> Iterator[tuple[str, dict[str, Any]]]:
        messages = request.body.get("messages") or []
        # The plan is the last prompt's (a resumed session or a Stop hook's feedback is a new
        # prompt); the tool results since it say how far along it is.
        start = 0
        for i, message in enumerate(messages):
            content = message.get("content")
            if message.get("role") == "user" and not (
                isinstance(content, list)
                and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
            ):
                start = i
        prompt = " ".join(_anthropic_texts(messages[start].get("content"))) if messages else ""
        steps = [] if request.aside else plan_of(prompt)
        # Claude Code 2.1.332 defers MCP tools: the model must load a tool with ToolSearch before
        # it can call it, as a real model does. Those searches are not steps of the plan.
        names = {
            b.get("id"): LOADING if _loading(b, self.prefix) else b.get("name")
            for m in messages
            if m.get("role") == "assistant"
            for b in (m.get("content") if isinstance(m.get("content"), list) else ())
            if isinstance(b, dict) and b.get("type") == "tool_use"
        }
        results = [
            b
            for m in messages[start:]
            for b in (m.get("content") if isinstance(m.get("content"), list) else ())
            if isinstance(b, dict) and b.get("type") == "tool_result"
        ]
        done = sum(1 for b in results if names.get(b.get("tool_use_id")) != LOADING)  # planned searches count
        searched = bool(results) and names.get(results[-1].get("tool_use_id")) == LOADING
        model = request.body.get("model", "claude")
        yield "message_start", {"type": "message_start", "message": {
            "id": f"msg_{len(self.requests)}", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}}
        step = self.next_step(steps, done)
        if step is not None:
            tool, args = step
            name = tool if tool[:1].isupper() else f"{self.prefix}{tool}"  # "Bash": a built-in tool
            listed = {t.get("name") for t in request.body.get("tools") or () if isinstance(t, dict)}
            loaded = {
                r.get("tool_name")
                for m in messages
                for b in (m.get("content") if isinstance(m.get("content"), list) else ())
                if isinstance(b, dict)
                and b.get("type") == "tool_result"
                and isinstance(b.get("content"), list)
                for r in b["content"]
                if isinstance(r, dict) and r.get("type") == "tool_reference"
            }
            if name not in listed and name not in loaded and SEARCH in listed and not searched:
                name, args = SEARCH, {"query": f"select:{name}"}
            yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
                "type": "tool_use", "id": f"toolu_{len(self.requests)}", "name": name,
                "input": {}}}
            yield (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)},
                },
            )
            stop = "tool_use"
        else:
            schema = _output_schema(request.body)
            text = DONE_TEXT if schema is None else json.dumps(_example(schema))
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}
            yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                          "delta": {"type": "text_delta", "text": text}}
            stop = "end_turn"
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        )
        yield "message_stop", {"type": "message_stop"}


# --- OpenAI Responses API (Codex) ---------------------------------------------------------


def _openai_texts(item: dict[str, Any]) -> list[str]:
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    return [
        c.get("text", "") for c in content or () if isinstance(c, dict) and isinstance(c.get("text"), str)
    ]


class OpenAIServer(ModelServer):
    """`POST /v1/responses` answered as a stream: the next planned call in the
    `mcp__agent_bridge` namespace."""

    namespace = "mcp__agent_bridge"

    def session_of(self, request: Request) -> str | None:
        return request.headers.get("session-id") or request.headers.get("thread-id")

    def answer(self, request: Request) -> Iterator[tuple[str, dict[str, Any]]]:
        items = [i for i in request.body.get("input") or [] if isinstance(i, dict)]
        start = 0
        for i, item in enumerate(items):
            if item.get("role") == "user" and not any(
                "<environment_context>" in t for t in _openai_texts(item)
            ):
                start = i
        prompt = " ".join(_openai_texts(items[start])) if items else ""
        steps = plan_of(prompt)
        done = sum(1 for item in items[start:] if item.get("type") == "function_call_output")
        rid = f"resp_{len(self.requests)}"
        yield "response.created", {"type": "response.created", "response": {"id": rid}}
        step = self.next_step(steps, done)
        if step is not None:
            tool, args = step
            item = {
                "type": "function_call",
                "id": f"fc_{len(self.requests)}",
                "call_id": f"call_{len(self.requests)}",
                "namespace": self.namespace,
                "name": tool,
                "arguments": json.dumps(args),
            }
            if tool.startswith(BUILTIN):  # "!exec_command": Codex's own tool, outside the bridge's namespace
                del item["namespace"]
                item["name"] = tool[len(BUILTIN):]
        else:
            item = {"type": "message", "role": "assistant", "id": f"msg_{len(self.requests)}",
                    "content": [{"type": "output_text", "text": DONE_TEXT, "annotations": []}]}
        yield (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        )
        yield "response.completed", {"type": "response.completed", "response": {
            "id": rid, "usage": {"input_tokens": 1, "input_tokens_details": None, "output_tokens": 1,
                                 "output_tokens_details": None, "total_tokens": 2}}}


# --- OpenAI chat completions (opencode through @ai-sdk/openai-compatible) -----------------


def _chat_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return " ".join(
        c.get("text", "") for c in content or () if isinstance(c, dict) and isinstance(c.get("text"), str)
    )


class ChatServer(ModelServer):
    """`POST /v1/chat/completions` answered as a stream of `chat.completion.chunk` frames: the next
    planned call of a bridge tool, which opencode names `agent-bridge_<tool>` (a step marked "!",
    "!bash", calls that built-in tool of opencode). A request that offers no tools (opencode's
    title request, made with the small model before the main one) is an aside: it gets a text."""

    server = "agent-bridge"
    separator = "_"  # opencode's; GitHub Copilot CLI 1.0.102 names an MCP tool `agent-bridge-<tool>`

    def session_of(self, request: Request) -> str | None:
        return request.headers.get("x-session-affinity")

    def beside_turn(self, body: dict[str, Any]) -> bool:
        return not body.get("tools")

    def answer(self, request: Request) -> Iterator[tuple[str, dict[str, Any]]]:
        messages = [m for m in request.body.get("messages") or [] if isinstance(m, dict)]
        start = 0
        for i, message in enumerate(messages):
            if message.get("role") == "user":
                start = i
        prompt = _chat_text(messages[start]) if messages else ""
        if prompt.startswith('"') and prompt.endswith('"'):
            # `opencode run` 1.18.33 quotes an argument with spaces: `"…"`, each `"` in it as `\"`
            prompt = prompt[1:-1].replace('\\"', '"')
        steps = [] if request.aside else plan_of(prompt)
        done = sum(1 for m in messages[start:] if m.get("role") == "tool")
        step = self.next_step(steps, done)
        n = len(self.requests)
        chunk = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0,
                 "model": request.body.get("model", "m")}
        if step is not None:
            tool, args = step
            name = tool[len(BUILTIN):] if tool.startswith(BUILTIN) else f"{self.server}{self.separator}{tool}"
            delta: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [{
                "index": 0, "id": f"call_{n}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}]}
            finish = "tool_calls"
        else:
            delta, finish = {"role": "assistant", "content": DONE_TEXT}, "stop"
        yield "", {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield "", {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def encode(self, events: list[tuple[str, dict[str, Any]]]) -> bytes:
        """Unnamed `data:` frames ending in `data: [DONE]`, as the chat completions API streams."""
        return ("".join(f"data: {json.dumps(data)}\n\n" for _, data in events) + "data: [DONE]\n\n").encode()
