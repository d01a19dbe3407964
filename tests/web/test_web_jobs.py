"""The dashboard's jobs (SPEC §4.7, §6): GET /api/jobs and the Jobs card, and the cancel action
under the action rules, against a real broker on this Trio loop. The job is a real process group
the broker adopted at its start (a job left running by a broker killed with -9, as the broker
finds it in bridge.db), so cancel signals real processes; the host CLIs are not needed here
(tests/hosts/test_jobs.py runs jobs with them)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from test_web_browser import ARTIFACTS, BROWSER_TIMEOUT, chromium_page
from webfixtures import BrokerInProcess, start_dashboard

from agent_bridge.common import domain, procinfo
from agent_bridge.dashboard import auth
from agent_bridge.store import reader
from agent_bridge.store.ids import now_ms
from agent_bridge.store.writer import Store
from tests.conftest import wait_for

pytestmark = pytest.mark.slow
TIMEOUT = 60
JOB_ID = "5a1c7e2b-0d9f-4c1e-9b7a-3f2e1d0c9b8a"
PROJECT = "/w/jobs-proj"
HOUR = 3_600_000


def record_jobs(home: Path, pid: int) -> dict[str, str]:
    """A parent session, a job running as process group `pid` and one that finished earlier."""
    store = Store.open(home / "bridge.db")
    now = now_ms()  # the running job's hour-long timeout counts from here
    try:
        parent = store.create_peer(agent="claude", name="claude-jobs", project=PROJECT, kind="interactive",
                                   host_session_id="hs-jobs", now=now - 60_000)
        name = domain.job_name("codex", JOB_ID)
        store.record_job(job_id=JOB_ID, name=name, parent_id=parent.id, agent="codex",
                         title="review the diff", task="review the diff", access="read", project=PROJECT,
                         cwd=PROJECT, worktree=None, branch=None, model=None, depth=1, timeout_ms=HOUR,
                         now=now - 20_000)
        found = procinfo.describe(pid)
        assert found is not None
        store.job_event(JOB_ID, 1, "running", now - 19_000, pid=pid, pid_start=found[0].start)
        store.job_event(JOB_ID, 1, "running", now - 10_000, thread="thread-1", last_step="$ git diff --stat")
        done = "0b0c0d0e-0f00-4111-8222-933344455566"
        store.record_job(job_id=done, name=domain.job_name("claude", done), parent_id=parent.id,
                         agent="claude", title="check the migration", task="check the migration",
                         access="edit", project=PROJECT, cwd=PROJECT, worktree=None, branch=None, model=None,
                         depth=1, timeout_ms=HOUR, now=now - 50_000)
        store.end_job_run(done, 1, "finished", now - 40_000, body="Job finished", answer="fine", thread="t0",
                          last_step=None)
    finally:
        store.close()
    return {"parent": parent.id, "name": name, "done": done}


@pytest.fixture
def job_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process group standing for a running job's host (reaped as soon as it exits, as init
    reaps the job of a killed broker)."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()


def job_state(home: Path, job_id: str) -> str:
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        row = conn.execute("SELECT state FROM job_events WHERE job_id = ? ORDER BY seq DESC LIMIT 1",
                           (job_id,)).fetchone()
    return str(row[0])


def answers_to(home: Path, peer_id: str, job_id: str) -> list[str]:
    """What the job's run ends sent to `peer_id`, in order."""
    with reader.reading(home / "bridge.db") as conn:
        assert conn is not None
        return [str(r[0]) for r in conn.execute(
            "SELECT m.body FROM messages m JOIN job_events e ON e.message_id = m.id "
            "WHERE m.to_peer = ? AND e.job_id = ? ORDER BY e.seq", (peer_id, job_id))]


async def test_jobs_read_without_a_broker(nursery: trio.Nursery, tmp_path: Path,
                                          job_process: subprocess.Popen[bytes]) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    made = record_jobs(home, job_process.pid)
    with trio.fail_after(TIMEOUT):
        running = await start_dashboard(nursery, home, standalone=True)
        async with running.client() as client:
            open_jobs = (await client.get("/api/jobs")).json()["jobs"]
            assert [(j["name"], j["state"], j["lastStep"], j["thread"]) for j in open_jobs] == [
                (made["name"], "running", "$ git diff --stat", "thread-1")]
            every = (await client.get("/api/jobs", params={"all": "1"})).json()["jobs"]
            assert [j["state"] for j in every] == ["finished", "running"]  # oldest first
            assert every[0]["answer"] == "fine" and every[1]["parent"]["name"] == "claude-jobs"
            bad = await client.get("/api/jobs", params={"all": "yes"})
            assert bad.status_code == 400 and "all: expected 1" in bad.json()["error"]
            # no broker: the action says how to get one, and nothing is cancelled
            page = (await client.get("/")).text
            page_token = re.search(r'<meta name="ab-token" content="([^"]+)">', page).group(1)
            refused = await client.post(f"/api/jobs/{JOB_ID}/cancel", content="{}", headers={
                "X-AB-Token": page_token, "Origin": running.base, "Content-Type": "application/json"})
            assert refused.status_code == 503 and "read-only" in refused.json()["error"]
        async with running.client(cookie=False) as stranger:
            denied = await stranger.get("/api/jobs")
            assert denied.status_code == 403 and denied.json() == {"error": "forbidden"}
    assert job_state(home, JOB_ID) == "running" and job_process.poll() is None


async def test_cancel_under_the_action_rules_stops_the_process_group(
    tmp_path: Path, job_process: subprocess.Popen[bytes]
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    made = record_jobs(home, job_process.pid)
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, job_process.wait, abandon_on_cancel=True))
            broker = BrokerInProcess(home)
            await broker.start(nursery)
            base, token = broker.dashboard_url().split("/?t=")
            cookie = {"Cookie": f"{auth.COOKIE}={token}"}
            async with httpx.AsyncClient(base_url=base, headers=cookie) as client:
                page = (await client.get("/")).text
                page_token = re.search(r'<meta name="ab-token" content="([^"]+)">', page).group(1)
                good = {"X-AB-Token": page_token, "Origin": base, "Content-Type": "application/json"}
                path = f"/api/jobs/{JOB_ID}/cancel"
                for headers, status in [({**good, "X-AB-Token": "nope"}, 403),
                                        ({**good, "Origin": "http://evil.example"}, 403),
                                        ({**good, "Content-Type": "text/plain"}, 400)]:
                    assert (await client.post(path, content="{}", headers=headers)).status_code == status
                extra = await client.post(path, content=json.dumps({"why": "x"}), headers=good)
                assert extra.status_code == 400 and "unknown field" in extra.json()["error"]
                unknown = await client.post("/api/jobs/no-such-job/cancel", content="{}", headers=good)
                assert unknown.status_code == 400
                assert "no job has id or name 'no-such-job'" in unknown.json()["error"]
                assert job_process.poll() is None and job_state(home, JOB_ID) == "running"  # nothing done yet
                done = await client.post(path, content="{}", headers=good)
                assert done.status_code == 200 and done.json()["job"]["name"] == made["name"]
                async def cancelled() -> bool:
                    return job_state(home, JOB_ID) == "cancelled"

                await wait_for(cancelled, what="the cancelled state")
                assert job_process.poll() is not None  # the process group got the signal
                [said] = answers_to(home, made["parent"], JOB_ID)
                assert said.startswith(f"Job {made['name']} (codex, read access) was cancelled: review")
                again = await client.post(path, content="{}", headers=good)
                assert again.status_code == 400 and "has already ended (cancelled)" in again.json()["error"]
            await broker.stop()


def drive_cancel(url: str, name: str, artifacts: Path) -> list[str]:
    from playwright.sync_api import expect

    problems: list[str] = []
    with chromium_page(problems, 1280, 900) as (_browser, _context, page):
        page.goto(url)
        card = page.locator("#jobs-card")
        expect(card).to_be_visible()
        item = page.locator("#jobs li.job", has_text=name)
        expect(item.locator(".job-state")).to_have_text("running")
        expect(item).to_contain_text("codex, read access")
        expect(item).to_contain_text("for claude-jobs")
        expect(item).to_contain_text("last step: $ git diff --stat")
        finished = page.locator("#jobs li.job", has_text="check the migration")
        expect(finished.locator(".job-state")).to_have_text("finished")
        expect(finished.locator("button")).to_have_count(0)  # an ended job has nothing to cancel
        item.get_by_role("button", name="Cancel").click()
        expect(page.locator("#jobs-result")).to_contain_text(name)
        expect(item.locator(".job-state")).to_have_text("cancelled")  # the live update
        expect(item.locator("button")).to_have_count(0)
        # its answer is in the recent messages, marked as a job's
        answer = page.locator("#messages li", has_text=f"Job {name} (codex, read access) was cancelled")
        expect(answer.locator(".tag.job")).to_have_text("job's answer")
        page.screenshot(path=str(artifacts / "dashboard-jobs.png"), full_page=True)
    return problems


async def test_the_jobs_card_cancels_a_running_job_in_headless_chromium(
    tmp_path: Path, job_process: subprocess.Popen[bytes]
) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    made = record_jobs(home, job_process.pid)
    with trio.fail_after(BROWSER_TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(trio.to_thread.run_sync, job_process.wait, abandon_on_cancel=True))
            broker = BrokerInProcess(home)
            await broker.start(nursery)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            problems = await trio.to_thread.run_sync(
                partial(drive_cancel, broker.dashboard_url(), made["name"], ARTIFACTS),
                abandon_on_cancel=True)
            assert job_process.poll() is not None and job_state(home, JOB_ID) == "cancelled"
            await broker.stop()
    assert problems == []
