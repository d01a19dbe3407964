"""`agent-bridge install` and `agent-bridge uninstall`
(`[--claude] [--codex] … [--scope user|project] [--dry-run]`).

Registers the MCP server (`agent-bridge mcp --agent …`) and the SessionStart, PostToolUse and Stop hooks in
each host's own configuration files. Which files and keys a host uses, and the host-specific
edits (Codex's `config.toml`, hosts/codex_config.py), are in its modules under agent_bridge/hosts;
the edits they share are in agent_bridge/hosts/edits.py (the command lines, the JSON edits) and
agent_bridge/hosts/tomledit.py (the TOML edits and their check).
This module plans the edits of the chosen hosts, shows them (`--dry-run`), backs files up and
writes them.

What is written: user scope names the absolute path of the agent-bridge being run (this user's
machine, this user's files). Project scope writes files meant to be committed, so it names the
command `agent-bridge` as found on PATH, and records AGENT_BRIDGE_HOME only when the user set
one explicitly (with a warning that it is machine-specific).

Uninstall removes what install adds: our server entry, our hook handlers (found by their
command line), any host setting install switched on, and containers left empty by that; a file
left holding nothing is deleted (after its backup).

Editing rules (agent_bridge.hosts.edits): a file that does not parse is refused, nothing is
written, also not the other files; comments and layout stay; the result must parse to exactly the
expected document, else the edit is refused.

Leaving no trace: `install` then `uninstall` gives every file back byte for byte when nothing else
touched it. A container that was there empty before install (`"mcpServers": {}`, a file holding
`{}`) is one uninstall would otherwise drop as "emptied": install notes such containers in
`<home>/install-record.json`, and uninstall puts them back. Every changed file that existed is
backed up first, into `<home>/backups/<time>/<its absolute path>` (printed), never beside the
file (project files would show up in `git status`); a file install created needs no backup.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent_bridge import hosts
from agent_bridge.common import paths
from agent_bridge.hosts.edits import FileEdit, InstallError, bridge_env, launcher, write_record

PATH_COMMAND = "agent-bridge"  # what project-scope files name: found on PATH on every machine
BACKUPS = "backups"  # in the state folder: one folder per install or uninstall run that changed a file


# --- what runs ----------------------------------------------------------------------


def run_for_scope(scope: str) -> list[str]:
    """User scope: this machine's absolute path. Project scope: the command on PATH, because the
    files are committed and read on teammates' machines, where this path means nothing."""
    return [PATH_COMMAND] if scope == "project" else launcher()




# --- the plan -----------------------------------------------------------------------


def plan(chosen: list[hosts.Host], scope: str, run: list[str], env: dict[str, str],
         cwd: Path | None = None) -> list[FileEdit]:
    """Every file edit the installation needs (unchanged files included). Raises InstallError."""
    root = (cwd or Path.cwd()).absolute()
    private = scope != "project"  # project files are shared: 0644
    return [edit for host in chosen for edit in host.install_edits(scope, root, run, env, private=private)]


def removal_plan(chosen: list[hosts.Host], scope: str, cwd: Path | None = None) -> list[FileEdit]:
    """Every file edit that removes what install added (unchanged files included)."""
    root = (cwd or Path.cwd()).absolute()
    private = scope != "project"
    return [edit for host in chosen for edit in host.uninstall_edits(scope, root, private=private)]


def backup_folder() -> Path:
    """`<home>/backups/<time>`: this run's backups, one folder (0700) per run."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime())
    root = paths.ensure_home(paths.home()) / BACKUPS
    root.mkdir(mode=0o700, exist_ok=True)
    folder = paths.free_path(root, stamp)
    folder.mkdir(mode=0o700)
    return folder


def backup_path(folder: Path, path: Path) -> Path:
    """Where `path` is kept in `folder`: under its absolute path, so the same name in two places
    cannot collide (`backups/<time>/home/me/.claude.json`)."""
    absolute = path.absolute()
    return folder.joinpath(*absolute.parts[1:]) if absolute.anchor else folder / absolute.name


def apply(edit: FileEdit, backups: Callable[[], Path]) -> Path | None:
    """Write (or delete) one file atomically, after backing the old one up into `backups()`.
    Returns the backup's path."""
    backup = None
    mode = 0o600 if edit.private else 0o644
    if edit.path.exists():
        mode = edit.path.stat().st_mode & 0o7777
        backup = backup_path(backups(), edit.path)
        backup.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        shutil.copy2(edit.path, backup)
    if edit.after is None:
        edit.path.unlink(missing_ok=True)
        for folder in edit.prune:  # innermost first; one still holding anything stays
            try:
                folder.rmdir()
            except OSError:
                break
        return backup
    edit.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = edit.path.with_name(f".{edit.path.name}.agent-bridge-{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="" if edit.exact else None) as f:
            f.write(edit.after)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, edit.path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return backup


def unified_diff(edit: FileEdit) -> str:
    old = (edit.before or "").splitlines(keepends=True)
    new = (edit.after or "").splitlines(keepends=True)
    fromfile = str(edit.path) if edit.before is not None else "/dev/null"
    tofile = str(edit.path) if edit.after is not None else "/dev/null"
    return "".join(difflib.unified_diff(old, new, fromfile=fromfile, tofile=tofile))


def _write_all(command: str, edits: list[FileEdit]) -> int:
    folder: list[Path] = []

    def backups() -> Path:  # made when the first file is backed up
        if not folder:
            folder.append(backup_folder())
        return folder[0]

    for edit in [e for e in edits if e.changed]:
        try:
            backup = apply(edit, backups)
        except OSError as exc:
            print(f"agent-bridge {command}: cannot write {edit.path}: {exc}", file=sys.stderr)
            return 1
        saved = "" if backup else " (new file)"
        print(f"  {edit.path}: {'; '.join(edit.notes)}{saved}")
    write_record(command, edits)
    if folder:
        print(f"  backups of the files as they were: {folder[0]}")
    for edit in edits:
        if not edit.changed:
            print(f"  {edit.path}: {'already up to date' if command == 'install' else 'nothing of ours'}")
    return 0


def chosen_hosts(ns: argparse.Namespace, default: Callable[[], list[hosts.Host]]) -> list[hosts.Host]:
    """The hosts named by their `--<name>` flags, else `default()`."""
    return [h for h in hosts.ALL if getattr(ns, h.name, False)] or default()


def detected_hosts() -> list[hosts.Host]:
    """The hosts whose user config folders exist; all of them when none does."""
    return [h for h in hosts.ALL if h.is_set_up()] or list(hosts.ALL)


def main(ns: argparse.Namespace) -> int:
    if ns.plugin:
        return plugin_main("install", ns)
    chosen = chosen_hosts(ns, detected_hosts)
    titles = ", ".join(f"{h.title} ({ns.scope} scope)" for h in chosen)
    run = run_for_scope(ns.scope)
    env = bridge_env()
    try:
        edits = plan(chosen, ns.scope, run, env)
    except InstallError as exc:
        print(f"agent-bridge install: refused: {exc}", file=sys.stderr)
        return 1
    for warning in [*scope_warnings(ns.scope, env), *other_scope_warnings(chosen, ns.scope),
                    *both_ways_warnings(chosen, plugin_now=False)]:
        print(f"agent-bridge install: warning: {warning}", file=sys.stderr)
    done = _carry_out("install", edits, ns.dry_run, titles, f"{titles}, running {shlex.join(run)}",
                      nothing=f"{titles} already set up with {shlex.join(run)}")
    if done is not None:
        return done
    print(next_steps(chosen, ns.scope))
    return 0


def _carry_out(command: str, edits: list[FileEdit], dry_run: bool, titles: str, doing: str,
               *, nothing: str) -> int | None:
    """Print that nothing changes, or the diff (`--dry-run`), or write the edits: the exit status
    when the command ends here, None once the edits are written."""
    changed = [e for e in edits if e.changed]
    if not changed:
        print(f"agent-bridge {command}: nothing to change; {nothing}.")
        return 0
    if dry_run:
        print(
            f"agent-bridge {command} --dry-run: {titles}; these changes would be made (nothing was written):"
        )
        for edit in changed:
            print(unified_diff(edit), end="")
        return 0
    print(f"agent-bridge {command}: {doing}")
    return 1 if _write_all(command, edits) else None


def scope_warnings(scope: str, env: dict[str, str]) -> list[str]:
    if scope != "project":
        return []
    found = []
    if env:
        found.append(
            f"AGENT_BRIDGE_HOME={env['AGENT_BRIDGE_HOME']} is recorded in the project files; it is a path on "
            "this machine, and every teammate who uses these files gets it too "
            "(unset it to write portable files)"
        )
    if shutil.which(PATH_COMMAND) is None:
        found.append(
            f"`{PATH_COMMAND}` is not on PATH here; the project files name it, so the hosts will not "
            "find it until it is (install it with pipx, or activate its virtualenv before starting them)"
        )
    return found


def other_scope_warnings(chosen: list[hosts.Host], scope: str) -> list[str]:
    """A host already set up at the other scope would start two bridge servers in every session
    of this project (and run each hook twice): say so now, before `doctor` has to."""
    other = "project" if scope == "user" else "user"
    try:
        found = [e for e in removal_plan(chosen, other) if e.changed]
    except InstallError:
        return []  # a file that does not parse there: doctor says so
    if not found:
        return []
    files = ", ".join(str(e.path) for e in found)
    return [f"agent-bridge is also installed at {other} scope ({files}); sessions here would start it twice. "
            f"Keep one: `agent-bridge uninstall --scope {other}`"]


def uninstall_main(ns: argparse.Namespace) -> int:
    if ns.plugin:
        return plugin_main("uninstall", ns)
    chosen = chosen_hosts(ns, lambda: list(hosts.ALL))
    titles = ", ".join(f"{h.title} ({ns.scope} scope)" for h in chosen)
    try:
        edits = removal_plan(chosen, ns.scope)
    except InstallError as exc:
        print(f"agent-bridge uninstall: refused: {exc}", file=sys.stderr)
        return 1
    done = _carry_out(
        "uninstall", edits, ns.dry_run, titles, titles, nothing=f"no agent-bridge entries for {titles}"
    )
    if done is not None:
        return done
    print("Running sessions keep their MCP server until they restart. Your agent-bridge state folder "
          "(messages, decisions) is untouched.")
    return 0


def next_steps(chosen: list[hosts.Host], scope: str) -> str:
    lines = ["Next:"]
    lines.extend(f"  {host.next_step(scope)}" for host in chosen)
    lines.append("  Check everything with: agent-bridge doctor")
    return "\n".join(lines)


# --- the plugin (hosts.plugin_install) ------------------------------------------------------

PLUGIN_HOSTS = ("claude", "codex")  # the hosts whose plugin commands install runs


def plugin_main(command: str, ns: argparse.Namespace) -> int:
    """`install --plugin` / `uninstall --plugin`: the hosts' own plugin commands, user scope."""
    from agent_bridge.hosts import plugin, plugin_install

    named = [h for h in hosts.ALL if getattr(ns, h.name, False)]
    other = [h.title for h in named if h.name not in PLUGIN_HOSTS]
    if other or ns.scope != "user" or ns.dry_run:
        why = (f"{', '.join(other)} has no plugin command to run" if other else
               "--plugin installs for this user only (no --scope project)" if ns.scope != "user" else
               "--plugin runs the hosts' own commands, which have no dry run")
        print(f"agent-bridge {command}: refused: {why}.", file=sys.stderr)
        return 1
    chosen = named or [h for h in hosts.ALL if h.name in PLUGIN_HOSTS and
                       (h.is_set_up() if command == "install" else plugin_install.installed(h.name))]
    if command == "install" and not (plugin.FOLDER / ".claude-plugin" / "marketplace.json").is_file():
        print(f"agent-bridge install: refused: {plugin.FOLDER} holds no plugin (a broken install?)",
              file=sys.stderr)
        return 1
    if command == "install":
        for warning in both_ways_warnings(chosen, plugin_now=True):
            print(f"agent-bridge install: warning: {warning}", file=sys.stderr)
    steps: list[tuple[str, list[str]]] = []
    for host in chosen:
        program = shutil.which(host.name)
        if program is None:
            print(f"agent-bridge {command}: refused: `{host.name}` ({host.title}) is not on PATH; "
                  "the plugin is installed with its own commands", file=sys.stderr)
            return 1
        try:
            if command == "install":
                done = (plugin_install.claude_install(program, plugin.FOLDER) if host.name == "claude"
                        else plugin_install.codex_install(program, plugin.FOLDER, Path.cwd()))
            else:
                done = (plugin_install.claude_uninstall(program) if host.name == "claude"
                        else plugin_install.codex_uninstall(program))
        except InstallError as exc:
            print(f"agent-bridge {command}: {host.title}: {exc}", file=sys.stderr)
            return 1
        steps.append((host.title, done.lines))
    if not any(lines for _, lines in steps):
        titles = ", ".join(t for t, _ in steps) or "no host"
        print(f"agent-bridge {command}: nothing to change; "
              + (f"the plugin {plugin.ID} is installed for {titles}." if command == "install"
                 else f"no plugin {plugin.ID} for {titles}."))
        return 0
    print(f"agent-bridge {command} --plugin ({plugin.ID}):")
    for title, lines in steps:
        for line in lines or ["nothing to change"]:
            print(f"  {title}: {line}")
    if command == "install":
        print("Next: start a new session; `agent-bridge doctor` checks it. The plugin runs `agent-bridge` "
              "found on PATH.")
    return 0


def both_ways_warnings(chosen: list[hosts.Host], *, plugin_now: bool) -> list[str]:
    """A host that has the plugin and the config edits would start two servers and run every hook
    twice: say so when installing the one while the other is there."""
    from agent_bridge.hosts import plugin_install

    found = []
    for host in chosen:
        if host.name not in PLUGIN_HOSTS:
            continue
        if plugin_now:
            try:
                edits = host.uninstall_edits("user", Path.cwd().absolute(), private=True)
                other = any(e.changed for e in edits)
            except InstallError:
                other = False
        else:
            other = plugin_install.installed(host.name) is not None
        if other:
            way = "by config edits" if plugin_now else "as a plugin"
            found.append(f"{host.title} also has agent-bridge {way}; "
                         f"it would run every hook twice. Keep one: agent-bridge uninstall --{host.name}"
                         + ("" if plugin_now else " --plugin"))
    return found
