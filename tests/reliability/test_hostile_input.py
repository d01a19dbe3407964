"""SPEC §8: every surface answers bad input with a clear error and stores nothing; nothing a
client sends can crash the broker or another session's delivery. Hypothesis throws generated
input at each surface of one live broker (IPC frames, MCP tool arguments through a real stdio
session, hook stdin, CLI arguments, the config), while a witness pair of sessions keeps
exchanging messages through it and must see every one of them, in order."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent_bridge.common import config
from agent_bridge.ipc import blocking, protocol
from agent_bridge.ipc.client import open_bridge_client
from tests.conftest import BrokerProcess, mcp_session, wait_until
from tests.reliability.harness import TrioThread, count, run_agent_bridge

pytestmark = pytest.mark.slow

FUZZ = settings(
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)
ANSWER_TIMEOUT = 20.0  # a connection the broker neither answers nor closes within this is a hang
ERROR_CODES = {"protocol", "bad_request"}
MIN_EXAMPLES = 20  # each surface really saw this many generated inputs


# --- one broker for the module, and a witness that keeps working through it -----------------


@pytest.fixture(scope="module")
def hostile_home() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ab-") as folder:
        yield Path(folder) / "home"


@pytest.fixture(scope="module")
def hostile_env(hostile_home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_BRIDGE_", "CLAUDE_CODE_"))}
    e.update({"AGENT_BRIDGE_HOME": str(hostile_home), "AGENT_BRIDGE_WEB_PORT": "0", "PYTHONUNBUFFERED": "1"})
    return e


@pytest.fixture(scope="module")
def hostile_broker(hostile_env: dict[str, str], hostile_home: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(hostile_env, hostile_home).start()
    try:
        yield b
    finally:
        b.kill()


class Witness:
    """Two sessions: `a` sends numbered messages to `b` one after another; `b` records them."""

    def __init__(self) -> None:
        self.sent = 0
        self.received: list[int] = []
        self.errors: list[str] = []

    async def serve(self, thread: TrioThread, stop: trio.Event, sock_path: str) -> None:
        hello = {"agent": "codex", "project": "/w/witness", "hostSessionId": f"witness-{uuid.uuid4()}"}
        async with (
            open_bridge_client(sock_path, {**hello, "name": "witness-a"}) as (a, a_pushes),
            open_bridge_client(
                sock_path, {**hello, "name": "witness-b", "hostSessionId": f"w-{uuid.uuid4()}"}
            ) as (b, pushes),
        ):
            a_id = a.hello["session"]["id"]
            b_id = b.hello["session"]["id"]
            arrived = trio.Event()
            thread.value = self
            thread.ready()

            # a is sent to as well (by the fuzzers): never let its pushes block it
            async def drain_a() -> None:
                async for _ in a_pushes:
                    pass

            async def receive() -> None:
                nonlocal arrived
                async for push in pushes:
                    m = push.get("message") if push.get("push") == "message" else None
                    if m is None:
                        continue
                    await b.request("ack", ids=[m["id"]])
                    if m["from"]["id"] == a_id and m["kind"] == "message":
                        self.received.append(int(m["text"]))
                        arrived.set()
                        arrived = trio.Event()
                self.errors.append("b's connection closed")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(receive)
                nursery.start_soon(drain_a)
                while not stop.is_set():
                    waiting = arrived
                    try:
                        await a.request("send", to=b_id, text=str(self.sent))
                    except Exception as exc:  # noqa: BLE001 - recorded, the test fails on it
                        self.errors.append(f"send {self.sent}: {exc!r}")
                        break
                    self.sent += 1
                    with trio.move_on_after(ANSWER_TIMEOUT) as late:
                        await waiting.wait()
                    if late.cancelled_caught:
                        self.errors.append(f"message {self.sent - 1} not delivered")
                        break
                    with trio.move_on_after(0.02):
                        await stop.wait()
                nursery.cancel_scope.cancel()

    def check(self, at_least: int) -> None:
        """No errors, every message in order, and (polling with a deadline) still going: at
        least `at_least` messages exchanged so far."""
        wait_until(
            lambda: len(self.received) >= at_least or self.errors, timeout=60, what="the witness to go on"
        )
        assert self.errors == []
        assert self.received == list(range(len(self.received))), (
            "the witness saw a gap, a duplicate or a reordering"
        )


@pytest.fixture(scope="module")
def witness(hostile_broker: BrokerProcess) -> Iterator[Witness]:
    sock_path = hostile_broker.status()["socket"]
    w = Witness()
    thread = TrioThread().start(lambda t, stop: w.serve(t, stop, sock_path))
    try:
        yield w
    finally:
        thread.stop()


def log_problems(home: Path) -> list[str]:
    """Tracebacks in broker.log: an exception escaped a connection handler. (After a ping: the
    broker logs such a failure just after closing the connection.)"""
    blocking.call(home, "ping", timeout=10)
    text = (home / "broker.log").read_text(encoding="utf-8", errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or "handler failed" in line]


def assert_broker_fine(broker: BrokerProcess) -> None:
    assert broker.proc.poll() is None, "the broker died"
    assert blocking.call(broker.home, "ping", timeout=10) == "pong"


# --- IPC frames -------------------------------------------------------------------------


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
ARG_NAMES = [
    "agent",
    "project",
    "kind",
    "name",
    "hostSessionId",
    "claudeSessionId",
    "host",
    "chain",
    "pid",
    "topic",
    "text",
    "scope",
    "source_message_id",
    "query",
    "history",
    "to",
    "reply_to",
    "ids",
    "source",
    "cwd",
    "event",
    "at",
]
arg_values = (
    json_values
    | st.sampled_from(["all", "/abs/dir", "relative", "", " ", "claude", "codex", "job"])
    | st.fixed_dictionaries(
        {"pid": st.integers(-5, 2**40) | json_values, "start": st.integers(-5, 2**40) | json_values}
    )
    | st.fixed_dictionaries({"project": json_values})
    | st.fixed_dictionaries({"sessions": json_values})
)
request_args = st.dictionaries(st.sampled_from(ARG_NAMES) | st.text(max_size=10), arg_values, max_size=5)
safe_ops = st.sampled_from(sorted(protocol.ALL_OPS - {"shutdown"})) | st.text(max_size=12).filter(
    lambda o: o != "shutdown"
)


@st.composite
def requests(draw) -> dict[str, Any]:
    obj: dict[str, Any] = {"v": 1, "id": draw(st.integers(0, 2**53 - 1) | json_values), "op": draw(safe_ops)}
    obj.update({k: v for k, v in draw(request_args).items() if k not in ("v", "id", "op")})
    if draw(st.integers(0, 9)) == 0:
        obj["v"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        del obj[draw(st.sampled_from(["v", "id", "op"]))]
    return obj


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


hello_request = st.builds(
    lambda args: {"v": 1, "id": 1, "op": "hello", **args},
    st.fixed_dictionaries(
        {
            "agent": st.sampled_from(["claude", "codex"]) | json_values,
            "project": st.sampled_from(["/w/fuzz"]) | json_values,
        },
        optional={
            "kind": st.sampled_from(["interactive", "job"]) | json_values,
            "name": st.text(max_size=45) | json_values,
        },
    ),
)
well_formed = st.one_of(
    requests().map(lambda r: frame(encode_json(r))),
    st.lists(requests(), min_size=1, max_size=4).map(lambda rs: b"".join(frame(encode_json(r)) for r in rs)),
    st.tuples(hello_request, st.lists(requests(), max_size=4)).map(
        lambda t: b"".join(frame(encode_json(r)) for r in [t[0], *t[1]])
    ),
)
hostile_bytes = st.one_of(
    st.binary(max_size=600),
    st.binary(min_size=1, max_size=600).map(frame),  # a frame of garbage
    json_values.map(lambda v: frame(encode_json(v))),  # valid JSON of the wrong shape
    # truncated
    st.tuples(well_formed, st.data()).map(lambda t: t[0][: t[1].draw(st.integers(1, max(1, len(t[0]) - 1)))]),
    st.tuples(st.integers(protocol.MAX_FRAME + 1, 2**32 - 1), st.binary(max_size=200)).map(
        lambda t: struct.pack(">I", t[0]) + t[1]
    ),  # a length prefix over the limit
    st.binary(max_size=100).map(lambda b: struct.pack(">I", 0) + b),  # a zero length prefix
    well_formed,
    st.tuples(well_formed, st.binary(max_size=100)).map(lambda t: t[0] + t[1]),  # good frames, then garbage
    st.tuples(hello_request, st.binary(min_size=1, max_size=100)).map(
        lambda t: frame(encode_json(t[0])) + t[1]
    ),
    st.tuples(hello_request, json_values).map(lambda t: frame(encode_json(t[0])) + frame(encode_json(t[1]))),
)


def exchange(sock_path: str, data: bytes) -> tuple[list[dict[str, Any]], bool]:
    """Send `data`, close our writing side, read until the broker closes. Returns the frames
    received and whether the connection was reset instead of closed."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(ANSWER_TIMEOUT)
        s.connect(sock_path)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker refused an early frame and closed before we finished writing
        decoder = protocol.FrameDecoder()
        frames: list[dict[str, Any]] = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                return frames, True
            except TimeoutError:
                raise AssertionError(
                    f"the broker neither answered nor closed within {ANSWER_TIMEOUT}s"
                ) from None
            if not chunk:
                assert decoder.pending == 0, "the broker's last frame is incomplete"
                return frames, False
            frames.extend(decoder.feed(chunk))


def test_hostile_ipc_frames(hostile_broker, hostile_home, witness):
    sock_path = hostile_broker.status()["socket"]
    start = len(witness.received)

    @FUZZ
    @given(data=hostile_bytes)
    def check(data: bytes) -> None:
        ran.append(data)
        frames, _ = exchange(sock_path, data)
        responses = [f for f in frames if "push" not in f]
        for f in responses:
            if f.get("ok") is False:
                err = f["error"]
                assert err["code"] in ERROR_CODES, f
                assert isinstance(err["message"], str) and len(err["message"]) >= 8, f
            else:
                assert f.get("ok") is True and isinstance(f.get("id"), int), f
        if len(data) >= 4 and not responses:
            (length,) = struct.unpack(">I", data[:4])
            # only a frame cut short before the broker saw all of it may close without a word
            assert 0 < length <= protocol.MAX_FRAME and len(data) < 4 + length, (
                f"closed without an answer: {frames}"
            )
        assert not log_problems(hostile_home), log_problems(hostile_home)

    ran: list[Any] = []
    check()
    assert len(ran) >= MIN_EXAMPLES, len(ran)
    assert_broker_fine(hostile_broker)
    witness.check(at_least=start + 5)


def test_every_well_formed_request_gets_an_answer(hostile_broker, hostile_home):
    """Complete frames that parse as requests are each answered (ok, or an error naming the
    problem) in order; the first protocol error closes the connection."""
    sock_path = hostile_broker.status()["socket"]

    @FUZZ
    @given(
        reqs=st.one_of(
            st.lists(requests(), min_size=1, max_size=5),
            st.tuples(hello_request, st.lists(requests(), max_size=4)).map(lambda t: [t[0], *t[1]]),
        )
    )
    def check(reqs: list[dict[str, Any]]) -> None:
        ran.append(reqs)
        frames, _ = exchange(sock_path, b"".join(frame(encode_json(r)) for r in reqs))
        responses = [f for f in frames if "push" not in f]
        expected: list[Any] = []
        for i, r in enumerate(reqs):
            try:
                request_id, op, _ = protocol.parse_request(protocol.decode_payload(encode_json(r)))
            except protocol.ProtocolError:
                expected.append(None)  # a protocol error (no request id), then the connection closes
                break
            expected.append(request_id)
            if i == 0 and op in ("hello", "mcp") and responses and responses[0].get("ok") is False:
                break  # a refused hello (a session's, or a relay's) closes the connection
        assert [f.get("id") for f in responses] == expected
        for f in responses:
            if f.get("ok") is False:
                assert f["error"]["code"] in ERROR_CODES and len(f["error"]["message"]) >= 8, f
        assert not log_problems(hostile_home), log_problems(hostile_home)

    ran: list[Any] = []
    check()
    assert len(ran) >= MIN_EXAMPLES, len(ran)
    assert_broker_fine(hostile_broker)


def test_a_bad_frame_in_a_session_is_answered_and_closes_only_that_connection(
    hostile_broker, hostile_home, witness
):
    """Found by the fuzzing above: a malformed frame after hello escaped the session's nursery
    as an exception group (no answer, a traceback in the log); and good requests sent in the
    same write as a bad frame were dropped unanswered."""
    sock_path = hostile_broker.status()["socket"]
    start = len(witness.received)
    hello = frame(b'{"v":1,"id":1,"op":"hello","agent":"codex","project":"/w/fuzz","kind":"job"}')
    for bad in (frame(b"nonsense"), frame(b'{"v":2,"id":3,"op":"ping"}'), struct.pack(">I", 0), b"\xff" * 9):
        frames, _ = exchange(
            sock_path,
            hello + frame(b'{"v":1,"id":2,"op":"whoami"}') + bad + frame(b'{"v":1,"id":4,"op":"ping"}'),
        )
        answers = [(f.get("id"), f.get("ok")) for f in frames if "push" not in f]
        assert answers == [(1, True), (2, True), (None, False)], (bad, frames)
        assert frames[-1]["error"]["code"] == "protocol"
        frames, _ = exchange(sock_path, frame(b'{"v":1,"id":7,"op":"ping"}') + bad)
        assert [(f.get("id"), f.get("ok")) for f in frames] == [(7, True), (None, False)]
    assert not log_problems(hostile_home), log_problems(hostile_home)
    assert_broker_fine(hostile_broker)
    witness.check(at_least=start + 1)


# --- MCP tool arguments, through a real stdio session --------------------------------------


TOOLS = {
    "decide": ["topic", "text", "scope", "source_message_id"],
    "decisions": ["query", "scope", "history"],
    "whoami": [],
    "peers": ["project"],
    "send": ["to", "text", "reply_to"],
    "inbox": ["wait_seconds", "peek"],
    "ask_owner": ["question", "topic", "options", "scope"],
}
tool_values = json_values | st.text(min_size=3000, max_size=20000) | st.sampled_from(
    ["all", '"all"', '{"project": "/w/fuzz"}', '{"sessions": []}', "{", "/w/fuzz", "witness-b", "fuzzer"]
) | st.fixed_dictionaries({"project": json_values}) | st.fixed_dictionaries({"sessions": json_values})


# Values a tool would accept, so that most calls are valid but for one or two arguments: the
# interesting failures are the ones deep in a call that passed the first checks.
PLAUSIBLE = {
    "topic": st.text(min_size=1, max_size=30),
    "text": st.text(min_size=1, max_size=60),
    "scope": st.sampled_from(
        ["all", {"project": "/w/fuzz"}, {"sessions": ["fuzzer"]}, '{"project": "/w/fuzz"}']
    ),
    "source_message_id": st.text(max_size=40),
    "query": st.text(max_size=20),
    "history": st.booleans(),
    "project": st.sampled_from(["/w/fuzz", "/w/witness"]),
    "to": st.sampled_from(["fuzzer", "witness-a", "witness-b"]),
    "reply_to": st.text(max_size=40),
    "wait_seconds": st.sampled_from([0, 0.05]),
    "peek": st.booleans(),
    "question": st.text(min_size=1, max_size=60),
    "options": st.lists(st.text(min_size=1, max_size=20), max_size=4),
}


@st.composite
def tool_calls(draw) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(sorted(TOOLS)) | st.text(max_size=10))
    args: dict[str, Any] = {}
    for key in TOOLS.get(name, []):
        if draw(st.integers(0, 3)):  # most arguments present, most of them plausible
            args[key] = draw(PLAUSIBLE[key] if draw(st.integers(0, 2)) else tool_values)
    if draw(st.integers(0, 4)) == 0:
        args[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    return name, args


def test_hostile_mcp_tool_arguments(hostile_broker, hostile_env, hostile_home, witness):
    from mcp.shared.exceptions import MCPError

    start = len(witness.received)

    async def serve(thread: TrioThread, stop: trio.Event) -> None:
        async with mcp_session(
            hostile_env, "--agent", "claude", "--project", "/w/fuzz", "--name", "fuzzer"
        ) as s:
            thread.value = s
            thread.ready()
            await stop.wait()

    thread = TrioThread().start(serve)
    try:
        session = thread.value
        me = json.loads(thread.run(session.call_tool, "whoami", {}).content[0].text)

        def mine() -> tuple[int, int]:
            return (
                count(hostile_home, "SELECT count(*) FROM messages WHERE from_peer = ?", (me["id"],)),
                count(hostile_home, "SELECT count(*) FROM decisions WHERE author_id = ?", (me["id"],)),
            )

        @FUZZ
        @given(call=tool_calls())
        def check(call: tuple[str, dict[str, Any]]) -> None:
            ran.append(call)
            name, args = call
            wait = args.get("wait_seconds")
            assume(
                not (
                    name == "inbox"
                    and isinstance(wait, int | float)
                    and not isinstance(wait, bool)
                    and 0.2 < wait <= 60
                )
            )
            before = mine()
            try:
                result = thread.run(session.call_tool, name, args)
            except MCPError as exc:  # a protocol-level refusal (an unknown tool, say)
                assert len(str(exc)) >= 8
                assert mine() == before
                return
            text = "\n".join(c.text for c in result.content if hasattr(c, "text"))
            assert "Traceback" not in text
            if result.is_error:
                assert len(text) >= 12, text
                assert mine() == before, f"{name} failed but stored something: {text}"
            else:
                json.loads(result.content[0].text)

        ran: list[Any] = []
        check()
        assert len(ran) >= MIN_EXAMPLES, len(ran)
        # the fuzzed session itself still works
        assert json.loads(thread.run(session.call_tool, "whoami", {}).content[0].text)["id"] == me["id"]
    finally:
        thread.stop()
    assert not log_problems(hostile_home), log_problems(hostile_home)
    assert_broker_fine(hostile_broker)
    witness.check(at_least=start + 5)


# --- hook stdin ------------------------------------------------------------------------------


hook_inputs = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"session_id": json_values | st.text(min_size=1, max_size=250)},
        optional={
            "cwd": json_values | st.sampled_from(["/w/fuzz", "relative", "C:\\x", ""]),
            "source": json_values | st.sampled_from(["startup", "resume", "clear", "compact", "fork"]),
            "stop_hook_active": json_values,
            "hook_event_name": json_values,
            "transcript_path": json_values,
        },
    ).map(lambda d: json.dumps(d).encode()),
)


@pytest.mark.parametrize("event", ["session-start", "stop"])
def test_hostile_hook_stdin(hostile_broker, hostile_env, hostile_home, event):
    @settings(FUZZ, max_examples=60)
    @given(stdin=hook_inputs, agent=st.sampled_from(["claude", "codex"]))
    def check(stdin: bytes, agent: str) -> None:
        ran.append(stdin)
        out = run_agent_bridge(hostile_env, "hook", event, "--agent", agent, stdin=stdin)
        assert out.returncode == 0, out.stderr
        assert b"Traceback" not in out.stderr, out.stderr.decode()
        if out.stdout.strip():
            answer = json.loads(out.stdout)
            if event == "session-start":
                assert answer["hookSpecificOutput"]["hookEventName"] == "SessionStart"
                assert isinstance(answer["hookSpecificOutput"]["additionalContext"], str)
            else:
                assert answer["decision"] == "block" and isinstance(answer["reason"], str)

    ran: list[Any] = []
    check()
    assert len(ran) >= MIN_EXAMPLES, len(ran)
    assert_broker_fine(hostile_broker)


# --- CLI arguments ---------------------------------------------------------------------------


argv_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
SIDE_EFFECTS = {"up", "down", "install", "mcp", "dashboard", "demo", "doctor"}
cli_argvs = st.one_of(
    st.tuples(
        st.just("decisions"),
        st.lists(argv_text | st.sampled_from(["--scope", "--history", "--json", "all", "{"]), max_size=4),
    ).map(lambda t: [t[0], *t[1]]),
    st.tuples(argv_text, argv_text | json_values.map(json.dumps)).map(
        lambda t: ["decisions", t[0], "--scope", t[1]]
    ),
    st.lists(argv_text | st.sampled_from(["--json", "--help", "-x"]), max_size=3).map(
        lambda a: ["status", *a]
    ),
    st.lists(argv_text | st.sampled_from(["--agent", "claude", "codex", "session-start"]), max_size=3).map(
        lambda a: ["hook", *a]
    ),
    st.lists(argv_text, min_size=1, max_size=3).filter(lambda a: a[0] not in SIDE_EFFECTS and a[0] != "hook"),
)


def test_hostile_cli_arguments(hostile_broker, hostile_env):
    @settings(FUZZ, max_examples=60)
    @given(argv=cli_argvs)
    def check(argv: list[str]) -> None:
        ran.append(argv)
        # hooks read stdin; everything else ignores it
        out = run_agent_bridge(hostile_env, *argv, stdin=b"{}")
        assert b"Traceback" not in out.stderr, out.stderr.decode()
        assert out.returncode in (0, 1, 2), (out.returncode, out.stderr)
        if out.returncode != 0:
            assert len(out.stderr.strip()) >= 10, "a refusal that does not say why"

    ran: list[Any] = []
    check()
    assert len(ran) >= MIN_EXAMPLES, len(ran)
    assert_broker_fine(hostile_broker)


# --- the config file and the environment --------------------------------------------------


toml_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    argv_text.map(json.dumps),
    st.sampled_from(["true", "[1, 2]", "{a = 1}", "'10'", "10", "1", "100", "101", "0", "nan", "inf"]),
)
config_texts = st.one_of(
    st.text(max_size=80),
    st.tuples(st.sampled_from(["hop_limit", "hop_limt", "port", "Hop_Limit"]), toml_values).map(
        lambda t: f"{t[0]} = {t[1]}\n"
    ),
)


@FUZZ
@given(text=config_texts, env_value=st.none() | argv_text | st.integers(-5, 200).map(str))
def test_hostile_config(text: str, env_value: str | None) -> None:
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        (home / "config.toml").write_text(text, encoding="utf-8")
        env = {} if env_value is None else {"AGENT_BRIDGE_HOP_LIMIT": env_value}
        try:
            settings_ = config.load(home, env)
        except config.ConfigError as exc:
            assert len(str(exc)) >= 10
        else:
            assert 1 <= settings_.hop_limit <= 100
