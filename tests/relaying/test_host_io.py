"""The host's input (agent_bridge.relay.host_io) on a real pipe: its lines, the end of each
read, and what a signal's handler finds unread at every step."""

from __future__ import annotations

import os

from agent_bridge.relay.host_io import HostInput, write_all


def test_lines_of_one_read_then_a_mark_and_every_line_is_found_unread_until_handled():
    read_end, write_end = os.pipe()
    try:
        write_all(write_end, b'{"a":1}\n\n{"b":2}\n{"c":')
        host = HostInput(read_end)
        lines = host.lines()
        assert next(lines) == '{"a":1}'
        # a handler now: the line being handled, those after it, and the partial one
        assert host.unread().split(b"\n") == [b'{"a":1}', b"", b'{"b":2}', b'{"c":']
        assert next(lines) == '{"b":2}'  # the blank line is skipped
        assert b'{"a":1}' not in host.unread()
        assert next(lines) is None  # what was read together is handed over
        write_all(write_end, b'3}\n{"d":\xff}')
        os.close(write_end)
        write_end = -1
        assert list(lines) == ['{"c":3}', None, '{"d":\ufffd}']  # bad bytes replaced, as the SDK does
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_a_signal_that_comes_during_a_read_is_handled_once_its_bytes_are_where_unread_looks():
    """The relay's SIGINT and SIGTERM handler reads `unread` for the host's cancels: one that
    comes while a read's bytes are on their way to `pending` runs right after they got there
    (HostInput.deferring); one that comes otherwise runs at once."""
    read_end, write_end = os.pipe()
    try:
        write_all(write_end, b'{"a":1}\n{"b"')
        host = HostInput(read_end)
        seen: list[bytes] = []
        on_signal = host.deferring(lambda: seen.append(host.unread()))
        host.reading = True  # the moment between os.read returning and its bytes placed
        on_signal()
        assert seen == []  # put off
        assert host.read()
        assert seen == [b'\n{"a":1}\n{"b"']  # then run: no line current, one pending, one partial
        assert not host.reading
        on_signal()  # not reading: at once
        assert len(seen) == 2
    finally:
        os.close(read_end)
        os.close(write_end)
