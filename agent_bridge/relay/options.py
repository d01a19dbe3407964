"""A relay's options: the command line's and the environment's, checked, and the hello they make."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_bridge import hosts
from agent_bridge.common import domain, paths, procinfo


@dataclass
class Options:
    agent: str
    project: str
    kind: str
    name: str | None
    host_session_id: str | None
    claude_session_id: str | None
    host: procinfo.Proc | None
    chain: list[procinfo.Proc]
    home: Path

    def hello(self, resume: dict[str, str] | None = None) -> dict[str, Any]:
        """The hello frame; `resume`: the session id and secret this process was given, so a
        reconnect gets exactly that session back (SPEC §3, identity without a host session id)."""
        return {
            "agent": self.agent,
            "project": self.project,
            "kind": self.kind,
            "name": self.name,
            "hostSessionId": self.host_session_id,
            "claudeSessionId": self.claude_session_id,
            "host": procinfo.host_json(self.host),
            "chain": [p.to_json() for p in self.chain],
            "pid": os.getpid(),
            "resume": resume,
        }


def options_from(ns: argparse.Namespace, env: dict[str, str] | os._Environ[str] | None = None) -> Options:
    env = os.environ if env is None else env
    host, chain = hosts.current_host(env)
    agent = ns.agent
    if not agent:
        agent = (hosts.for_process(host.exe if host else "") or hosts.DEFAULT).name
    agent = domain.normalize_agent(agent)
    if ns.name is not None:
        domain.check_session_name(ns.name, what="--name")
    project = domain.normalize_folder(os.path.abspath(ns.project or os.getcwd()), what="--project")
    explicit = ns.host_session_id or env.get("AGENT_BRIDGE_HOST_SESSION_ID") or None
    chosen = hosts.by_name(agent)
    session_env = chosen.session_env if chosen else None  # where the host passes its own session id
    claude_env = (env.get(session_env) or None) if session_env else None
    return Options(
        agent=agent,
        project=project,
        kind="job" if ns.job else "interactive",
        name=ns.name,
        host_session_id=explicit,
        claude_session_id=claude_env,
        host=host,
        chain=chain,
        home=paths.writable_home(paths.home(env)),
    )
