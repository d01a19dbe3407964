"""An acknowledgement yields to the requests woken with it (broker.connection.Requests.ack): a
sender with sends in flight waits on their answers (its window), nobody waits on an
acknowledgement's, and an acknowledgement's commit ahead of the sends made each of them wait for
it (docs/performance.md, stop 71).

Two session connections are served as the broker serves them (`Requests.serve` over a
`FramedStream`), each on an in-memory stream whose bytes the test puts in without a checkpoint:
a sender's `send` and a receiver's `ack` arrive in the same step, so Trio wakes both serving
tasks in the same pass and runs that pass in either order (it shuffles each batch of ready
tasks). What the store would do is replaced by a log of which request reached it first; the
framing, the serving loop and the dispatch are the broker's own."""

from __future__ import annotations

import json
import struct
from typing import Any

import trio
import trio.testing

from agent_bridge.broker import connection
from agent_bridge.ipc.stream import FramedStream
from tests.test_pipelining import frame

ROUNDS = 40  # in either order half the time, 40 rounds in send-first order by chance: 2**-40


class _Broker:
    sessions: dict[str, Any] = {}  # nobody for `_deliveries_first` to wait on


async def test_an_ack_woken_with_another_session_s_send_reaches_the_store_after_it(monkeypatch) -> None:
    reached: list[str] = []

    async def send_batch(broker: Any, session: Any, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        reached.append("send")  # where the broker commits the sends (one transaction)
        return [{"message": {"id": f"m-{len(reached)}", "to": {"id": "rx"}}} for _ in batch]

    async def answer(
        broker: Any, session: Any, request_id: int, op: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        reached.append(op)  # where the broker records an acknowledgement (op_ack: one transaction)
        return {"v": 1, "id": request_id, "ok": True, "result": {"acked": len(args["ids"])}}

    monkeypatch.setattr(connection, "send_batch", send_batch)
    monkeypatch.setattr(connection, "answer", answer)

    incoming = {name: trio.testing.MemoryReceiveStream() for name in ("tx", "rx")}
    outgoing = {name: trio.testing.MemorySendStream() for name in ("tx", "rx")}
    async with trio.open_nursery() as nursery:
        for name in ("tx", "rx"):
            conn = FramedStream(trio.StapledStream(outgoing[name], incoming[name]))
            requests = connection.Requests(_Broker(), object(), conn)  # type: ignore[arg-type]
            nursery.start_soon(requests.serve)
        order = []
        for i in range(1, ROUNDS + 1):
            await trio.testing.wait_all_tasks_blocked()
            reached.clear()
            # both in one step: no checkpoint between them
            incoming["tx"].put_data(frame({"v": 1, "id": i, "op": "send", "to": "rx", "text": f"m{i}"}))
            incoming["rx"].put_data(frame({"v": 1, "id": i, "op": "ack", "ids": [f"m-{i}"]}))
            await trio.testing.wait_all_tasks_blocked()
            order.append(tuple(reached))
            for name in ("tx", "rx"):  # each answered
                answered = outgoing[name].get_data_nowait()
                (length,) = struct.unpack(">I", answered[:4])
                assert json.loads(answered[4:4 + length])["id"] == i
        nursery.cancel_scope.cancel()
    assert order == [("send", "ack")] * ROUNDS
