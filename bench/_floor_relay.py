"""The floor of a relay: what `agent-bridge mcp` could cost if it did nothing but move frames.

    python bench/_floor_relay.py mcp --agent A --project P --name N --host-session-id H

One thread, one `select` over the host's stdin and the broker socket: each host line parsed as
JSON (as the relay must, to know a request) and framed as the relay frames it; each broker frame
decoded, its line written to stdout, and `written` reported for a line that shows messages; at the
real relay's scheduling policy (relay.pump.batched). No requests noted, no replay, no showing
machine, no ledger, no reconnect, no signals: a reading only, never a relay (it loses what the
real one keeps). `bench_cpu_per_pair.py --floor` and `bench_message_throughput.py --floor` run
their sessions through it, to say how much of the relay path's cost any process between the
host's pipe and the broker's socket would pay.
"""

from __future__ import annotations

import json
import os
import select
import sys
from argparse import Namespace

from agent_bridge.ipc import protocol
from agent_bridge.relay import connector, pump
from agent_bridge.relay.options import options_from
from agent_bridge.relay.quick import parse_mcp


def main() -> None:
    parsed = parse_mcp(sys.argv[1:])
    assert parsed is not None, "plain `mcp` options only"
    options = options_from(Namespace(**parsed))
    pump.batched()  # the scheduling the real relay's pump has: the floor differs only in its work
    socket_path = connector.broker_socket(options.home)
    assert socket_path is not None, "no broker running"
    hello = protocol.request(1, "mcp", **options.hello(None), acked=[], offered=[])
    link, _ = connector.hello(socket_path, hello)
    sock = link.sock
    head = f'{{"v":{protocol.PROTOCOL_VERSION},"relay":"line","line":'
    encode_string = json.encoder.encode_basestring
    decoder = protocol.FrameDecoder()
    rest = b""
    for obj in link.take_ready():
        if obj.get("push") == "line":
            os.write(1, (obj["line"] + "\n").encode())
    while True:
        ready, _, _ = select.select([0, sock], [], [], 15)
        if 0 in ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                sock.sendall(protocol.encode({"v": 1, "relay": "eof"}))
                return
            *lines, rest = (rest + chunk).split(b"\n")
            frames = []
            for raw in lines:
                if raw.strip():
                    line = raw.decode("utf-8", "replace")
                    json.loads(line)
                    payload = (head + encode_string(line) + "}").encode()
                    frames.append(protocol.HEADER.pack(len(payload)) + payload)
            sock.sendall(b"".join(frames))
        if sock in ready:
            data = sock.recv(1 << 16)
            if not data:
                return
            out, written = [], []
            for obj in decoder.feed(data):
                if obj.get("push") == "line":
                    out.append((obj["line"] + "\n").encode())
                    if isinstance(obj.get("seq"), int):
                        written.append(protocol.encode({"v": 1, "relay": "written", "seq": obj["seq"]}))
            if out:
                os.write(1, b"".join(out))
            if written:
                sock.sendall(b"".join(written))


if __name__ == "__main__":
    main()
