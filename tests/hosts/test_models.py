"""The scripted model server itself (tests/hosts/models.py), where no host is needed."""

from __future__ import annotations

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
