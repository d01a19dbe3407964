"""The store runner's order, against a model (broker.storage.StoreRunner).

Short sends may commit on the loop, in the thread's queue, or in the line of those that wait out
the broker's own passes (run_short). Whatever way each one takes, what a session sees must be what
one queue in the order of arrival would give: a random program of sends from tasks of their own,
passes that hold the thread until released, jobs of sessions' requests, cancellations and the
Checkpointer wanting the thread runs against a real store, and the test checks

- every send answered is stored, and nothing else (a cancelled send is never half there);
- the stored order is the order the sends came in;
- a request's job sees exactly the stored sends that came before it.

Each step settles before the next (every task blocked, and the thread idle unless a pass holds
it), so the order of arrival is the program's.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_bridge.broker.storage import StoreCalls, StoreRunner
from agent_bridge.store.messages import Outgoing, Send
from agent_bridge.store.writer import Store

SETTLE_LIMIT = 10.0  # seconds a step may take to settle before the test calls it stuck

KINDS = ["send"] * 4 + ["pass"] * 2 + ["release", "request", "checkpoint", "cancel"]
steps = st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 30)), max_size=40)  # (kind, which send)


class Scene:
    def __init__(self, runner: StoreRunner, a: str, b: str) -> None:
        self.runner, self.calls, self.a, self.b = runner, StoreCalls(runner), a, b
        self.arrivals: list[tuple[str, str]] = []  # ("send", text) or ("request", name), in order
        self.answered: set[str] = set()
        self.seen_by: dict[str, list[str]] = {}  # a request's name: the texts stored when it ran
        self.scopes: list[trio.CancelScope] = []
        self.held: threading.Event | None = None  # the release of the pass holding the thread
        self.passes = 0
        self.final: list[str] = []  # the texts stored once the program ended

    def stored_texts(self) -> list[str]:
        rows = self.runner.store.conn.execute(
            "SELECT body FROM messages WHERE to_peer = ? ORDER BY rowid", (self.b,)
        ).fetchall()
        return [text for (text,) in rows]

    async def send(self, text: str, scope: trio.CancelScope) -> None:
        with scope:
            await self.calls.send(self.a, [Send((Outgoing(self.b, text, 1, None),))], 2)
            self.answered.add(text)  # before any checkpoint: a started send is answered

    async def request(self, name: str) -> None:
        def job() -> None:
            self.seen_by[name] = self.stored_texts()

        await self.runner.run(job)

    async def a_pass(self, holding: threading.Event, release: threading.Event) -> None:
        def held() -> None:
            holding.set()
            release.wait(SETTLE_LIMIT * 3)

        way = self.runner.run_unseen if self.passes % 2 else self.runner.run_background
        self.passes += 1
        await way(held)

    async def settle(self) -> None:
        """Every task blocked; the thread idle and no send waiting, unless a pass holds it."""
        with trio.fail_after(SETTLE_LIMIT):
            while True:
                await trio.testing.wait_all_tasks_blocked()
                if self.held is not None or (not self.runner._pending and not self.runner._waiting):
                    return
                await trio.sleep(0.0005)


async def play(program: list, folder: Path) -> Scene:
    runner = StoreRunner(Store.open(folder / "bridge.db"))
    a, b = (
        runner.store.create_peer(agent="codex", name=n, project="/w", kind="interactive",
                                 host_session_id=None, now=1).id
        for n in ("a", "b")
    )
    scene = Scene(runner, a, b)
    try:
        async with trio.open_nursery() as nursery:
            for step, which in program:
                if step == "send":
                    text = f"send-{len(scene.scopes)}"
                    scope = trio.CancelScope()
                    scene.scopes.append(scope)
                    scene.arrivals.append(("send", text))
                    nursery.start_soon(scene.send, text, scope)
                elif step == "request":
                    name = f"request-{len(scene.seen_by) + len(scene.arrivals)}"
                    scene.arrivals.append(("request", name))
                    nursery.start_soon(scene.request, name)
                elif step == "pass" and scene.held is None:
                    holding, scene.held = threading.Event(), threading.Event()
                    nursery.start_soon(scene.a_pass, holding, scene.held)
                    # the thread may still be finishing earlier jobs
                    assert await trio.to_thread.run_sync(holding.wait, SETTLE_LIMIT)
                elif step == "release" and scene.held is not None:
                    scene.held.set()
                    scene.held = None
                elif step == "checkpoint" and runner.checkpointer is not None:
                    runner.checkpointer.catch_up_wanted = True  # as its thread sets it
                elif step == "cancel" and which < len(scene.scopes):
                    scene.scopes[which].cancel()
                await scene.settle()
            if scene.held is not None:
                scene.held.set()
                scene.held = None
    finally:
        scene.final = scene.stored_texts()
        await runner.run(runner.close_store)
        runner.stop()
    return scene


@settings(max_examples=150, deadline=None, database=None)
@given(program=steps)
def test_every_way_a_short_send_takes_keeps_one_order_of_arrival(program: list) -> None:
    with tempfile.TemporaryDirectory() as folder:
        scene = trio.run(play, program, Path(folder))
    stored = scene.final
    assert set(stored) == scene.answered  # answered ones stored, cancelled ones not at all
    sends_in_order = [text for kind, text in scene.arrivals if kind == "send"]
    assert stored == [text for text in sends_in_order if text in scene.answered]
    before: list[str] = []
    for kind, name in scene.arrivals:
        if kind == "send":
            before.append(name)
        else:
            assert scene.seen_by[name] == [t for t in before if t in scene.answered], name
