"""Process start times: the same number for the same process, whichever process computes it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agent_bridge.common import procinfo

PROBE = ("import sys; from agent_bridge.common import procinfo; "
         "print(procinfo.{fn}(int(sys.argv[1]))[0].start)")


def _start_seen_by_another_process(fn: str, pid: int) -> int:
    # Each probe is its own interpreter, with its own (randomized) string hashing.
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(fn=fn), str(pid)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return int(out.stdout)


@pytest.fixture
def target():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("fn", ["describe", "_ps_proc"])
def test_two_processes_agree_on_a_start_time(fn, target):
    if fn == "describe" and sys.platform == "win32":
        pytest.skip("no process ancestry on Windows")
    first = _start_seen_by_another_process(fn, target)
    second = _start_seen_by_another_process(fn, target)
    assert first == second


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="compares the ps path with /proc")
def test_the_ps_path_gives_the_real_start_in_epoch_seconds(target):
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    ticks = procinfo._linux_proc(target)[0].start  # type: ignore[index]
    from_proc = btime + ticks / os.sysconf("SC_CLK_TCK")
    from_ps = procinfo._ps_proc(target)[0].start  # type: ignore[index]
    assert abs(from_ps - from_proc) <= 2
    assert from_ps <= time.time()


def test_lstart_is_parsed_as_local_time():
    code = ("from agent_bridge.common import procinfo; "
            "print(procinfo.lstart_epoch('Mon Nov 30 21:46:35  2026'))")
    env = {**os.environ, "TZ": "UTC"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert int(out.stdout) == 1796075195
