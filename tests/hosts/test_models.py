"""The scripted model server itself (tests/hosts/models.py), where no host is needed."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading

from tests.hosts.models import AnthropicServer


def test_a_host_that_hangs_up_while_it_is_answered_leaves_no_traceback(capsys):
    """A host gives up a request (or the test ends it) while the answer is being written: the
    request was recorded, and the suite's output shows no traceback for it."""
    server = AnthropicServer().start()
    assert server.httpd is not None
    handled = threading.Event()
    shutdown_request = server.httpd.shutdown_request

    def after(request: socket.socket) -> None:  # the handler's thread, its request done
        shutdown_request(request)
        handled.set()

    server.httpd.shutdown_request = after  # type: ignore[method-assign]
    body = json.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": 'PLAN [["=wait", {"gate": "hold"}]]'}]}).encode()
    try:
        with socket.create_connection(server.httpd.server_address[:2]) as host:
            host.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: model\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), body))
            server.wait_reached("hold", timeout=10)  # recorded, and its answer held
            host.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # closed with a reset: the answer's first write fails
        server.open_gate("hold")
        assert handled.wait(10)
    finally:
        server.open_gate("hold")  # a failed wait leaves no handler held at the gate
        server.close()
    assert len(server.requests) == 1
    assert "Exception occurred" not in capsys.readouterr().err


def answer_events(server: AnthropicServer, body: dict, session: str) -> list[dict]:
    """The events of the server's answer to `body`, posted as Claude Code posts it."""
    assert server.httpd is not None
    conn = http.client.HTTPConnection(*server.httpd.server_address[:2], timeout=10)
    try:
        conn.request("POST", "/v1/messages?beta=true", json.dumps(body),
                     {"content-type": "application/json", "x-claude-code-session-id": session})
        answer = conn.getresponse().read().decode()
    finally:
        conn.close()
    return [json.loads(line[len("data: "):]) for line in answer.splitlines() if line.startswith("data: ")]


def test_a_session_title_request_is_an_aside_answered_with_its_json() -> None:
    """Claude Code 2.1.337's TUI asks for a session title beside the turn's request (as seen,
    trimmed: structured output, no tools, the typed prompt in `<session>` tags). The server
    answers with the JSON it asks for, takes no step of the plan in the prompt (its gate is not
    reached), and leaves it out of the session's turns."""
    typed = '<session>\nPLAN [["=wait", {"gate": "held"}], ["whoami", {}]]\n</session>'
    title = {
        "model": "claude-opus-5-5", "stream": True, "tools": [], "max_tokens": 128000,
        "system": [{"type": "text", "text": 'Return JSON with a single "title" field.'}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": typed}]}],
        "output_config": {"effort": "medium", "format": {"type": "json_schema", "schema": {
            "type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"],
            "additionalProperties": False}}},
    }
    turn = {**title, "tools": [{"name": "ToolSearch", "input_schema": {"type": "object"}}],
            "output_config": {"effort": "medium"}, "messages": [{"role": "user", "content": "hello"}]}
    server = AnthropicServer().start()
    try:
        events = answer_events(server, title, "s1")
        answer_events(server, turn, "s1")
    finally:
        server.close()
    blocks = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
    assert blocks == ["text"] and isinstance(json.loads(text)["title"], str), events
    assert not server.gate("held")[0].is_set()
    assert [r.aside for r in server.of_session("s1")] == [True, False]
    assert [r.body for r in server.turns_of("s1")] == [turn]
