"""decisions_query: lookups over 100,000 revisions, 2,000 topics, 50 projects (SPEC §9).

The database is built with the broker's own schema (Store.open), its rows written in bulk: every
topic gets revisions in several scopes over time (mostly its project, some global, a few
addressed to sessions), so the current revision of a topic is spread through the table.

Measured through the store's read path (`reader.reading` + `queries.query_decisions`: open a
read-only connection, one read transaction, render the decision objects), alternating:
- substring: a case-insensitive substring of topic or text, current revisions, every scope
  (what `agent-bridge decisions QUERY` and the dashboard run);
- project: a project lookup as the MCP `decisions` tool makes it (project + global + addressed
  to the calling session).
Baseline, interleaved: the same two lookups as bare SQL on an open APSW connection, rows
fetched, nothing rendered. Target: p99 ≤ 25 ms for each lookup; `value` is the larger p99.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

TARGET_MS = 25.0
WORDS = (
    "postgres sqlite redis kafka camera input hold toggle look shader vulkan metal opengl release "
    "branch main trunk review owner merge squash rebase docker podman nix bazel cmake ninja gradle "
    "maven pnpm npm yarn bun deno node python rust golang zig swift kotlin java typescript eslint "
    "ruff black prettier format lint test pytest vitest jest coverage budget latency throughput "
    "cache eviction ttl retry backoff timeout deadline queue topic stream batch cron nightly weekly "
    "staging production canary rollout feature flag config secret vault token oauth session cookie "
    "csrf cors header gzip brotli http2 grpc rest graphql schema migration index vacuum backup"
).split()


def build(db: Path, revisions: int, topics: int, projects: int, seed: int = 6) -> list[str]:
    """Write the rows; returns the project folders."""
    from agent_bridge.common import domain
    from agent_bridge.store.ids import new_id
    from agent_bridge.store.writer import Store

    rng = random.Random(seed)
    folders = [f"/home/dev/src/project-{p:02d}" for p in range(projects)]
    store = Store.open(db)
    try:
        with store.conn:
            authors = []
            for i in range(projects):
                author_id = new_id()
                store.conn.execute(
                    "INSERT INTO peers(id, name, agent, project, kind, created_at, last_seen_at, "
                    "host_session_id) "
                    "VALUES (?, ?, 'claude', ?, 'interactive', 1, 1, ?)",
                    (author_id, f"claude-project-{i:02d}", folders[i], f"host-{i}"),
                )
                authors.append((author_id, f"claude-project-{i:02d}"))
            head: dict[str, str] = {}
            rows = []
            for n in range(revisions):
                t = n if n < topics else rng.randrange(topics)
                topic = f"topic-{t:04d} {WORDS[t % len(WORDS)]}"
                roll = rng.random()
                if roll < 0.10:
                    scope: domain.Scope = "all"
                elif roll < 0.12:
                    scope = {"sessions": [f"claude-project-{rng.randrange(projects):02d}"]}
                else:
                    scope = {"project": folders[t % projects]}
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(8, 40))).capitalize() + "."
                kind = domain.scope_kind(scope)
                author_id, author_name = authors[t % projects]
                decision_id = new_id()
                rows.append((
                    decision_id, topic, text, domain.search_key(text), domain.scope_to_json(scope), kind,
                    scope["project"] if kind == "project" else None,  # type: ignore[index]
                    author_id, author_name, "claude", 1_790_000_000_000 + n, None, head.get(topic),
                ))
                head[topic] = decision_id
            store.conn.executemany(
                "INSERT INTO decisions(id, topic, text, text_key, scope, scope_kind, scope_project, "
                "author_id, "
                "author_name, author_agent, created_at, source_message_id, supersedes) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                rows,
            )
        store.conn.execute("ANALYZE")
    finally:
        store.close()
    return folders


BARE_SUBSTRING = (
    "SELECT d.* FROM decision_heads h JOIN decisions d ON d.seq = h.seq "
    "WHERE instr(d.topic, :q) > 0 OR instr(d.text_key, :q) > 0 ORDER BY d.seq DESC"
)
BARE_PROJECT = (
    "SELECT d.* FROM decision_heads h JOIN decisions d ON d.seq = h.seq "
    "WHERE d.scope_kind IN ('all', 'sessions') OR d.scope_project = :project ORDER BY d.seq DESC"
)


def main() -> None:
    args = c.parse_args(__doc__ or "")
    revisions, topics, projects, loops = (2_000, 200, 10, 20) if args.quick else (100_000, 2_000, 50, 300)
    from agent_bridge.common.domain import normalize_query
    from agent_bridge.store import queries, reader

    rng = random.Random(9)
    with c.temp_home() as home:
        home.mkdir(parents=True)
        db = home / "bridge.db"
        started = time.perf_counter()
        folders = build(db, revisions, topics, projects)
        c.log(f"decisions_query: built {revisions} revisions in {time.perf_counter() - started:.1f}s")
        bare = reader.open_readonly(db)
        assert bare is not None
        substring_ns: list[int] = []
        project_ns: list[int] = []
        bare_substring_ns: list[int] = []
        bare_project_ns: list[int] = []
        found_substring = found_project = 0
        for i in range(loops):
            needle = normalize_query(rng.choice(WORDS)[1:5] if i % 3 else f"{rng.randrange(topics):04d}")
            p = rng.randrange(projects)
            project, caller = folders[p], {f"id-{p}", f"claude-project-{p:02d}", f"host-{p}"}

            start = time.perf_counter_ns()
            with reader.reading(db) as conn:
                found = queries.query_decisions(conn, needle=needle)
            substring_ns.append(time.perf_counter_ns() - start)
            found_substring += len(found)

            start = time.perf_counter_ns()
            bare.execute(BARE_SUBSTRING, {"q": needle}).fetchall()
            bare_substring_ns.append(time.perf_counter_ns() - start)

            start = time.perf_counter_ns()
            with reader.reading(db) as conn:
                found = queries.query_decisions(conn, lookup={"project": project}, caller_addresses=caller)
            project_ns.append(time.perf_counter_ns() - start)
            found_project += len(found)

            start = time.perf_counter_ns()
            bare.execute(BARE_PROJECT, {"project": project}).fetchall()
            bare_project_ns.append(time.perf_counter_ns() - start)
        # Reported, no target: a substring query over the whole history.
        history_ns: list[int] = []
        for _ in range(max(3, loops // 30)):
            start = time.perf_counter_ns()
            with reader.reading(db) as conn:
                queries.query_decisions(conn, needle=normalize_query(rng.choice(WORDS)[1:5]), history=True)
            history_ns.append(time.perf_counter_ns() - start)
        bare.close()
    p99_substring = c.ms(c.percentile(substring_ns, 99))
    p99_project = c.ms(c.percentile(project_ns, 99))
    value = max(p99_substring, p99_project)
    base = max(c.ms(c.percentile(bare_substring_ns, 99)), c.ms(c.percentile(bare_project_ns, 99)))
    both = substring_ns + project_ns
    c.report(
        "decisions_query",
        value=value,
        unit="ms (p99, the slower of substring and project lookup)",
        baseline=base,
        target=f"p99 <= {TARGET_MS:g} ms for a substring query and for a project lookup",
        ok=p99_substring <= TARGET_MS and p99_project <= TARGET_MS,
        n=len(both),
        p50=c.ms(c.percentile(both, 50)),
        p99=c.ms(c.percentile(both, 99)),
        quick=args.quick,
        details={
            "revisions": revisions,
            "topics": topics,
            "projects": projects,
            "substring_p50_ms": c.ms(c.percentile(substring_ns, 50)),
            "substring_p99_ms": p99_substring,
            "project_p50_ms": c.ms(c.percentile(project_ns, 50)),
            "project_p99_ms": p99_project,
            "bare_substring_p99_ms": c.ms(c.percentile(bare_substring_ns, 99)),
            "bare_project_p99_ms": c.ms(c.percentile(bare_project_ns, 99)),
            "avg_rows_substring": found_substring / loops,
            "avg_rows_project": found_project / loops,
            "history_substring_p50_ms": c.ms(c.percentile(history_ns, 50)),
        },
    )


if __name__ == "__main__":
    main()
