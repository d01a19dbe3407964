"""The `agent-bridge` command line's shape (SPEC §2): its commands, their options, and the help
each prints (one line in the list, a paragraph and an example in its own `--help`).

What a command runs is cli.main's, handed in by name (`build_parser(run)`); the owner's commands
run cli.commands, imported when one runs. argparse itself is imported only when the parser is
built, which `agent-bridge hook …` and `agent-bridge mcp …` never do (cli.main's fast paths).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

from agent_bridge import hosts

if TYPE_CHECKING:
    import argparse

Runs = Mapping[str, Callable[["argparse.Namespace"], int]]  # a command's name -> what it runs

AGENTS_HELP = f"the agent host: {', '.join(hosts.NAMES)}, or another short name"


def build_parser(run: Runs) -> argparse.ArgumentParser:
    """The whole command line; `run` has each command's function by name (cli.main's)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="agent-bridge",
        description="A local broker for AI coding-agent sessions: find each other, exchange durable "
        "messages, share pinned owner decisions.",
    )
    from agent_bridge import __version__

    parser.add_argument("--version", action="version", version=f"agent-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # bare `agent-bridge`: the help (cli.main)

    up = sub.add_parser("up", help="run the broker (foreground unless --detach)")
    up.add_argument("--detach", action="store_true",
                    help="start in the background and return once it accepts connections; "
                    "when one already runs, say so and exit 0")
    up.set_defaults(func=run["up"])

    down = sub.add_parser("down", help="stop the running broker")
    down.set_defaults(func=run["down"])

    status = sub.add_parser("status", help="is a broker running, and what does it serve")
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(func=run["status"])

    mcp = sub.add_parser("mcp", help="the stdio MCP server for one agent session (started by the agent host)")
    mcp.add_argument(
        "--agent", help=AGENTS_HELP + f" (default: detected from the host, else {hosts.DEFAULT.name})"
    )
    mcp.add_argument("--name", help="session name (default: <agent>-<basename of the project folder>)")
    mcp.add_argument("--project", help="project folder (default: the current working directory)")
    mcp.add_argument("--job", action="store_true", help="a headless job runner (claude -p, codex exec)")
    mcp.add_argument("--host-session-id", help="the host's session id, when the launcher knows it")
    mcp.set_defaults(func=run["mcp"])

    named = [h.title for h in hosts.ALL]
    titles = f"{', '.join(named[:-1])} and {named[-1]}" if len(named) > 1 else named[0]
    hook = sub.add_parser("hook", help=f"hook commands for {titles} (JSON on stdin)")
    hook_sub = hook.add_subparsers(dest="event", metavar="EVENT", required=True)
    for event, text in (
        ("session-start", "SessionStart: add the session's identity and decisions"),
        ("post-tool-use", "PostToolUse: hand waiting active messages to the model between tool calls"),
        ("stop", "Stop: continue the session while active messages wait"),
        ("wake", "Stop (asyncRewake, Claude Code): wake the idle session when an active message arrives"),
        ("user-prompt-submit", "UserPromptSubmit: a turn starts, the waiter stands aside"),
        ("interrupt", "Interrupt (Codex): a turn cut short, the session is idle"),
        ("ack", "acknowledge messages a host's plugin handed over (opencode), once the host took them"),
        ("status", "a host's plugin marks its session busy or idle (opencode)"),
    ):
        h = hook_sub.add_parser(event, help=text)
        h.add_argument("--agent", choices=hosts.NAMES, default=hosts.DEFAULT.name,
                       help=f"the host (default: {hosts.DEFAULT.name})")
        h.set_defaults(func=run["hook"])

    dash = sub.add_parser(
        "dashboard", help="print the authenticated dashboard URL (serve it if no broker runs)"
    )
    dash.add_argument("--open", action="store_true", help="open it in a browser")
    dash.set_defaults(func=run["dashboard"])

    dec = sub.add_parser(
        "decisions", help="list pinned owner decisions (read-only; works with the broker down)"
    )
    dec.add_argument("query", nargs="?", help="case-insensitive substring of topic or text")
    dec.add_argument("--scope", help='"all", or JSON: {"project": "/abs/dir"} or {"sessions": ["name", ...]}')
    dec.add_argument("--history", action="store_true", help="include superseded revisions")
    dec.add_argument("--json", action="store_true", help="print JSON")
    dec.set_defaults(func=run["decisions"])

    sea = sub.add_parser(
        "search",
        help="find messages, decisions and questions by words (read-only; works with the broker down)",
    )
    sea.add_argument("query", metavar="QUERY", help="words, all of which must match; one of 3 or more "
                     "characters also matches the start of a longer word")
    sea.add_argument("--json", action="store_true", help="print JSON")
    sea.set_defaults(func=run["search"])

    inst = sub.add_parser(
        "install", help=f"register the MCP server and hooks with {titles.replace(' and ', ' and/or ')}"
    )
    for host in hosts.ALL:
        inst.add_argument(f"--{host.name}", action="store_true", help=f"configure {host.title}")
    inst.add_argument(
        "--scope", choices=("user", "project"), default="user", help="where to register (default: user)"
    )
    inst.add_argument("--dry-run", action="store_true", help="print a diff and write nothing")
    inst.add_argument("--plugin", action="store_true",
                      help="install the agent-bridge plugin with the host's own plugin commands instead "
                           "(Claude Code, Codex; user scope)")
    inst.set_defaults(func=run["install"])

    uninst = sub.add_parser("uninstall", help="remove what install added (other entries stay)")
    for host in hosts.ALL:
        uninst.add_argument(f"--{host.name}", action="store_true", help=host.title)
    uninst.add_argument(
        "--scope", choices=("user", "project"), default="user", help="which files (default: user)"
    )
    uninst.add_argument("--dry-run", action="store_true", help="print a diff and write nothing")
    uninst.add_argument("--plugin", action="store_true",
                        help="remove the plugin `install --plugin` installed")
    uninst.set_defaults(func=run["uninstall"])

    doc = sub.add_parser("doctor", help="check the setup and say what to fix")
    doc.set_defaults(func=run["doctor"])

    add_owner_commands(sub, run)
    add_federation_commands(sub)

    demo = sub.add_parser("demo", help="a guided run with simulated sessions")
    demo.add_argument(
        "--home", help="use this state folder (and its running broker) instead of a temporary one"
    )
    demo.add_argument("--no-wait", action="store_true", help="exit at the end instead of waiting for Ctrl-C")
    demo.set_defaults(func=run["demo"])
    _describe(sub)
    return parser


# What each command does, said once more in its own `--help`, with one example.
DESCRIPTIONS: dict[str, tuple[str, str]] = {
    "up": (
        "Run the broker that sessions connect to. In the foreground it runs until Ctrl-C or "
        "`agent-bridge down`; with --detach it starts in the background and returns once it accepts "
        "connections (exit 0 also when one already runs).",
        "agent-bridge up --detach",
    ),
    "down": (
        "Stop this state folder's running broker gracefully (connected sessions reconnect to the "
        "next one); one still starting is waited for, then stopped; says so when none runs.",
        "agent-bridge down",
    ),
    "status": (
        "Say whether a broker runs for this state folder, and where it serves. Exit status 0 when "
        "one runs, 3 when none does.",
        "agent-bridge status --json",
    ),
    "mcp": (
        "The stdio MCP server of one agent session. The agent host starts it (see `agent-bridge "
        "install`); you do not run it yourself.",
        "claude mcp add agent-bridge -- agent-bridge mcp --agent claude",
    ),
    "hook": (
        "Hook commands the agent hosts run at session start and stop, with the event's JSON on "
        "stdin (see `agent-bridge install`).",
        "agent-bridge hook session-start --agent codex < event.json",
    ),
    "dashboard": (
        "Print the dashboard's URL, which carries its access token. With no broker running it "
        "serves the dashboard itself, read-only, until Ctrl-C.",
        "agent-bridge dashboard --open",
    ),
    "decisions": (
        "List the pinned owner decisions, read straight from bridge.db (no broker needed).",
        "agent-bridge decisions db --history",
    ),
    "search": (
        "Find messages, decisions (every revision, marked current, superseded or retracted) and "
        "questions by words, newest first, read straight from bridge.db (no broker needed). Every word "
        "must match, case and accents aside; a word of 3 or more characters also matches the start of "
        "a longer one (datab finds database). No search operators: quotes, OR, NEAR are words too.",
        "agent-bridge search 'postgres migration'",
    ),
    "install": (
        "Register the MCP server and hooks in the hosts' own config files. Run it again at any "
        "time: it changes nothing that is already right. Backups go to <home>/backups/.",
        "agent-bridge install --claude --codex --dry-run",
    ),
    "uninstall": (
        "Remove exactly what install added; every other entry stays as it was.",
        "agent-bridge uninstall --claude --codex",
    ),
    "doctor": (
        "Check the state folder, the broker, the database and each host's registration, and say what to fix.",
        "agent-bridge doctor",
    ),
    "decide": (
        "Record a pinned owner decision, as the decide tool does, with author `cli`; every connected "
        "session in scope gets one notice, and sessions that start later see it in their start note.",
        "agent-bridge decide db 'PostgreSQL 16, no ORM' --scope all",
    ),
    "send": (
        "Send a durable message to a session, as the send tool does, with sender `cli`; a session that "
        "is not connected gets it when it connects. TO may also be an agent kind (the one session of "
        "it connected in this folder's project) or * (every session connected there). Prints the "
        "message's id: `agent-bridge sent ID` follows it.",
        "agent-bridge send claude-myproj 'please rebase on main'",
    ),
    "sent": (
        "Show the receipts of the messages you sent with `agent-bridge send` (or the dashboard), as the "
        "sent tool shows an agent its own: queued, shown or acknowledged, with times; whether a wake was "
        "requested and confirmed; the ids of replies (read-only; no broker needed).",
        "agent-bridge sent 0199a3f2-7c4e-7b1d-9f00-2c5d8e1a4b6f",
    ),
    "retract": (
        "Withdraw a topic's pinned decision: it stops being current, history keeps every revision, "
        "and sessions in scope get one notice.",
        "agent-bridge retract db --reason 'decided too early'",
    ),
    "questions": (
        "List the questions agents asked the owner with ask_owner, oldest first (read-only; no "
        "broker needed). Answer one with `agent-bridge answer`.",
        "agent-bridge questions --all",
    ),
    "answer": (
        "Answer an agent's question: the answer is recorded as a pinned decision (author `cli`, the "
        "question's topic and scope unless --scope says otherwise), and every session that asked gets it "
        "as a message. --decline tells them you will not decide it, and why.",
        "agent-bridge answer 0199a3f2 --option 1",
    ),
    "jobs": (
        "List the jobs agents handed to another agent with `delegate` (read-only; no broker needed): "
        "state, agent, access, runtime, last step, parent. `agent-bridge jobs cancel ID` stops one.",
        "agent-bridge jobs --all",
    ),
    "inbox": (
        "List the messages agents sent to the owner (send with to: \"owner\"), newest first (read-only; "
        "no broker needed). Questions are in `agent-bridge questions`.",
        "agent-bridge inbox --json",
    ),
    "slash": (
        "What the slash commands install adds to Claude Code run (/agent-bridge:send, :inbox, :decide, "
        ":questions, :answer, :jobs): the command NAME with the arguments as the owner typed them, read "
        "from stdin, so no shell parses them. The first word (or a quoted phrase) is the recipient, "
        "topic or question id; the rest is the text.",
        "echo 'codex-app please rebase on main' | agent-bridge slash send",
    ),
    "sessions": (
        "List every known session, connected or gone, with what waits for it (read-only; no broker needed).",
        "agent-bridge sessions",
    ),
    "forget": (
        "Forget sessions that are not connected, dropping what was queued to them. A name that several "
        "gone sessions share is refused: give an id.",
        "agent-bridge forget --gone-for 7d",
    ),
    "machine": (
        "Print this machine's name (from [federation] in config.toml, else a suggestion from the host "
        "name) and its NKEY public key, creating the seed <home>/machine.nk (mode 0600) on first use. Give "
        "NAME=PUBKEY to whoever runs the team's hub.",
        "agent-bridge machine --json",
    ),
    "federation": (
        "Several machines through a NATS JetStream hub (SPEC §10). `hub-config` prints a configuration "
        "that a plain `nats-server -c FILE` runs: JetStream on, one NKEY user per machine, each allowed "
        "only its own subjects, consumers and inbox.",
        "agent-bridge federation hub-config laptop=UAB… devbox=UCD… --team acme > hub.conf",
    ),
    "demo": (
        "A guided run with simulated sessions, for trying the bridge without Claude Code or Codex.",
        "agent-bridge demo",
    ),
}


def _describe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    import argparse
    import textwrap

    for name, command in sub.choices.items():
        if name not in DESCRIPTIONS:
            continue
        text, example = DESCRIPTIONS[name]
        command.description = textwrap.fill(text, 78)
        command.epilog = f"example:\n  {example}"
        command.formatter_class = argparse.RawDescriptionHelpFormatter


def add_owner_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser], run: Runs) -> None:
    """decide, send, sent, retract, questions, answer, jobs, sessions, forget: the owner's controls
    (agent_bridge.cli.commands); `slash` runs `run["slash"]`."""
    from agent_bridge.hosts import slash

    dcd = sub.add_parser(
        "decide", help="record a pinned owner decision (author: cli), as the decide tool does"
    )
    dcd.add_argument("topic", help="what it is about (case-insensitive identity, at most 200 characters)")
    dcd.add_argument("text", help="the decision, at most 4000 characters")
    dcd.add_argument("--scope", help='"all", or JSON: {"project": "/abs/dir"} or {"sessions": ["name", ...]} '
                     "(default: the current folder as a project)")
    dcd.add_argument("--json", action="store_true", help="print the decide tool's JSON result")
    dcd.set_defaults(func=lambda ns: _commands().decide(ns.topic, ns.text, ns.scope, ns.json))

    snd = sub.add_parser(
        "send", help="send a durable message to a session (sender: cli), as the send tool does"
    )
    snd.add_argument("to", help="the session's name, id or host session id (see `agent-bridge sessions`); "
                     "an agent kind (claude, codex): the one session of it connected in the current folder's "
                     "project; * : every session connected there")
    snd.add_argument("text", help="the message")
    snd.add_argument("--message-id", metavar="UUID",
                     help="a uuid of yours: sending again with it returns the message stored the first time")
    snd.add_argument("--json", action="store_true", help="print the send tool's JSON result")
    snd.set_defaults(func=lambda ns: _commands().send(ns.to, ns.text, ns.json, ns.message_id))

    snt = sub.add_parser(
        "sent", help="receipts of the messages you sent: shown, acknowledged, woken, replies (read-only)"
    )
    snt.add_argument("ids", nargs="*", metavar="ID", help="a message's id (default: the 20 newest)")
    snt.add_argument("--json", action="store_true", help="print the sent tool's JSON result")
    snt.set_defaults(func=lambda ns: _commands().sent(ns.ids, ns.json))

    inb = sub.add_parser(
        "inbox", help="messages agents sent to the owner, newest first (read-only; broker may be down)"
    )
    inb.add_argument("--json", action="store_true", help="print JSON")
    inb.set_defaults(func=lambda ns: _commands().inbox(ns.json))

    sla = sub.add_parser(
        "slash", help="run a slash command's owner command with the arguments as typed on stdin (install "
        "writes the commands)"
    )
    sla.add_argument("name", choices=tuple(slash.COMMANDS), help="the slash command")
    sla.set_defaults(func=run["slash"])

    ret = sub.add_parser("retract", help="withdraw a topic's pinned decision (history keeps every revision)")
    ret.add_argument("topic", help="the decision's topic")
    ret.add_argument("--reason", help="why, shown in history and in the notice sessions get")
    ret.add_argument("--json", action="store_true", help="print the retraction and who was told, as JSON")
    ret.set_defaults(func=lambda ns: _commands().retract(ns.topic, ns.reason, ns.json))

    qst = sub.add_parser(
        "questions", help="questions agents asked the owner (read-only; works with the broker down)"
    )
    qst.add_argument("--all", action="store_true", help="answered and declined ones too")
    qst.add_argument("--json", action="store_true", help="print JSON")
    qst.set_defaults(func=lambda ns: _commands().questions(ns.all, ns.json))

    ans = sub.add_parser("answer", help="answer an agent's question as a pinned decision, or decline it")
    ans.add_argument(
        "id", metavar="ID", help="the question's id, or its start (see `agent-bridge questions`)"
    )
    ans.add_argument("text", nargs="?", help="the answer, at most 4000 characters")
    ans.add_argument("--option", type=int, metavar="N", help="answer with the question's option N (from 1)")
    ans.add_argument("--decline", metavar="REASON", help="decline the question; the askers are told why")
    ans.add_argument("--scope", help='the decision\'s scope instead of the question\'s: "all", or JSON: '
                     '{"project": "/abs/dir"} or {"sessions": ["name", ...]}')
    ans.add_argument(
        "--json", action="store_true", help="print the question, the decision and who was told, as JSON"
    )
    ans.set_defaults(
        func=lambda ns: _commands().answer(ns.id, ns.text, ns.option, ns.decline, ns.scope, ns.json)
    )

    job = sub.add_parser("jobs", help="jobs agents delegated to another agent: running and queued "
                                      "(read-only)")
    job.add_argument("--all", action="store_true", help="ended ones too")
    job.add_argument("--json", action="store_true", help="print JSON")
    job.set_defaults(func=lambda ns: _commands().jobs(ns.all, ns.json))
    job_sub = job.add_subparsers(dest="jobs_command", metavar="{cancel}")
    jcn = job_sub.add_parser("cancel", help="cancel a job: a queued one ends, a running one is stopped")
    jcn.add_argument("id", metavar="ID",
                     help="the job's id, its start, or its name (see `agent-bridge jobs`)")
    jcn.add_argument("--json", action="store_true", help="print the job as JSON")
    jcn.set_defaults(func=lambda ns: _commands().jobs_cancel(ns.id, ns.json))

    ses = sub.add_parser(
        "sessions", help="every known session, connected or gone (read-only; works with the broker down)"
    )
    ses.add_argument("--json", action="store_true", help="print JSON")
    ses.set_defaults(func=lambda ns: _commands().sessions(ns.json))

    fgt = sub.add_parser(
        "forget", help="forget sessions that are not connected, dropping what was queued to them"
    )
    fgt.add_argument("sessions", nargs="*", metavar="SESSION", help="a session's name, id or host session id")
    fgt.add_argument(
        "--gone-for", metavar="DURATION", help="every session gone this long: 90s, 30m, 12h, 7d, 2w"
    )
    fgt.add_argument("--json", action="store_true", help="print JSON")
    fgt.set_defaults(func=lambda ns: _commands().forget(ns.sessions, ns.gone_for, ns.json))


def add_federation_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """machine, federation hub-config: several machines' brokers through a NATS hub
    (agent_bridge.federation.commands, SPEC §10)."""
    mac = sub.add_parser("machine", help="this machine's name and NKEY public key (creates its seed, 0600)")
    mac.add_argument("--json", action="store_true", help="print JSON")
    mac.set_defaults(func=lambda ns: _federation().machine(ns.json))

    fed = sub.add_parser("federation", help="several machines through a NATS JetStream hub")
    fed_sub = fed.add_subparsers(dest="federation_command", metavar="{status,hub-config}", required=True)
    fst = fed_sub.add_parser("status", help="the hub connection, the team's machines, the outbox")
    fst.add_argument("--json", action="store_true", help="print JSON")
    fst.set_defaults(func=lambda ns: _federation().status(ns.json))
    hcf = fed_sub.add_parser("hub-config", help="print a nats-server configuration for these machines")
    hcf.add_argument("members", nargs="+", metavar="NAME=PUBKEY",
                     help="each machine's name and public key, as `agent-bridge machine` prints them")
    hcf.add_argument("--team", default="ab", help="the team's subject prefix (default: ab)")
    hcf.add_argument("--port", type=int, default=4222, help="the client port (default: 4222)")
    hcf.add_argument("--store", metavar="DIR", help="JetStream's folder (default: ./agent-bridge-hub)")
    hcf.add_argument("--listen", metavar="HOST", default="0.0.0.0",
                     help="the address to listen on (default: 0.0.0.0, every interface)")
    hcf.add_argument("--tls-cert", metavar="FILE", help="the hub's TLS certificate (PEM): clients must use tls://")
    hcf.add_argument("--tls-key", metavar="FILE", help="its private key (PEM)")
    hcf.add_argument("--cluster", metavar="NAME", help="one node of a hub of several: the cluster's name")
    hcf.add_argument("--node", metavar="NODE", help="this node's name, unique in the cluster")
    hcf.add_argument("--routes", metavar="HOST:PORT,...", help="every node's route port, comma-separated")
    hcf.add_argument("--cluster-port", type=int, default=6222, help="this node's route port (default: 6222)")
    hcf.add_argument("--cluster-secret-file", metavar="FILE",
                     help="the secret the nodes' routes share (the same file for every node)")
    hcf.set_defaults(
        func=lambda ns: _federation().hub_config(
            ns.members, ns.team, ns.port, ns.store, ns.listen, ns.tls_cert, ns.tls_key,
            (ns.cluster, ns.node, ns.routes, ns.cluster_secret_file), ns.cluster_port,
        )
    )


def _federation() -> ModuleType:
    from agent_bridge.federation import commands

    return commands


def _commands() -> ModuleType:
    from agent_bridge.cli import commands

    return commands
