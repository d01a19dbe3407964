"""`agent-bridge install --plugin` and `uninstall --plugin`: the plugin (hosts.plugin) registered
through the hosts' own commands, from the installed package's marketplace folder (plugin.FOLDER).

- Claude Code 2.1.332: `claude plugin marketplace add DIR --json`, `claude plugin install ID --json`;
  `claude plugin uninstall ID --json` and `claude plugin marketplace remove NAME --json`. It writes
  `~/.claude/settings.json` (`enabledPlugins`, `extraKnownMarketplaces`),
  `~/.claude/plugins/installed_plugins.json`, `known_marketplaces.json` and a cache copy; its
  uninstall leaves the cache copy (marked `.orphaned_at`) and empty `{}` entries behind.
- Codex 0.171.0: `codex plugin marketplace add DIR --json`, `codex plugin add ID --json`; `codex
  plugin remove ID --json`, `codex plugin marketplace remove NAME`. It writes `[marketplaces.NAME]`
  and `[plugins."ID"]` to config.toml and a cache copy it runs from. Its plugin hooks start
  untrusted (`codex exec` skips them): install trusts them as the /hooks review does, one
  `[hooks.state."KEY"]` per hook with the two halves of `hooks/list`'s `currentHash`
  (`trusted_hash`, `trusted_content_hash`; NOTES.md "Plugins"). Its remove leaves the marketplace,
  the trust entries and `plugins/data/`.

Leaving no trace: install keeps the text of each file the host will write, and which of its
folders did not exist, in `<home>/install-record.json` ("plugins"); uninstall, after the hosts'
own commands and after removing what they leave, puts a file back as it was when it holds nothing
more than it did then (the hosts leave empty containers), and removes the folders they made.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from agent_bridge import __version__
from agent_bridge.hosts import plugin
from agent_bridge.hosts.codex_config import codex_home
from agent_bridge.hosts.edits import InstallError, read_record_key, write_record_key

COMMAND_TIMEOUT = 60.0  # seconds for one host command; each took under one here
RECORD_KEY = "plugins"


class Step:
    """What one host's plugin install or uninstall did, for the user: one line per change."""

    def __init__(self) -> None:
        self.lines: list[str] = []


def run_host(argv: list[str], what: str) -> dict[str, Any]:
    """Run a host's plugin command; its JSON answer. Raises InstallError with the host's words."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        raise InstallError(f"cannot run {argv[0]} to {what}: {exc}") from None
    answer: dict[str, Any] = {}
    try:
        parsed = json.loads(done.stdout or "{}")
        answer = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    if done.returncode != 0 or answer.get("outcome") == "failed":
        lines = [line.strip() for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()]
        said = answer.get("message") or next((line for line in lines if line.startswith("Error")),
                                             lines[0] if lines else "no output")
        raise InstallError(f"`{' '.join(argv[1:])}` failed to {what}: {said}")
    return answer


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _pruned(value: Any) -> Any:
    """`value` without empty objects and lists, at any depth (what the hosts leave behind)."""
    if isinstance(value, dict):
        kept = {k: _pruned(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in ({}, [])}
    return value


# --- the record ------------------------------------------------------------------------


def remember(host: str, files: list[Path], folders: list[Path]) -> None:
    """Before the first install: the files' texts (None: absent) and the folders that are absent."""
    record = read_record_key(RECORD_KEY)
    if host in record:
        return  # installed before (and not uninstalled): keep what was there before that
    record[host] = {"files": {str(p): _text(p) for p in files},
                    "folders": [str(f) for f in folders if not f.exists()]}
    write_record_key(RECORD_KEY, record)


def restore(host: str, parse: Any, step: Step) -> None:
    """After uninstall: each recorded file back to its text when it holds no more than it did
    then; the recorded folders removed when empty; the record forgotten."""
    record = read_record_key(RECORD_KEY)
    kept = record.pop(host, None)
    if not isinstance(kept, dict):
        return
    for name, text in (kept.get("files") or {}).items():
        path, now = Path(name), _text(Path(name))
        if now is None or now == text:
            continue
        was, left = (parse(text), parse(now)) if text is not None else ({}, parse(now))
        if text is None and isinstance(left, dict):
            left.pop("version", None)  # its format's version (installed_plugins.json)
        if _pruned(left) != _pruned(was):
            _drop_leftovers(path, left, was, parse, step)
            continue
        if text is None:
            path.unlink()
            step.lines.append(f"{path}: deleted (the host made it for the plugin)")
        else:
            path.write_text(text, encoding="utf-8")
            step.lines.append(f"{path}: back as it was before the install")
    for name in sorted(kept.get("folders") or [], key=len, reverse=True):
        try:
            Path(name).rmdir()
            step.lines.append(f"{name}: removed (the host made it for the plugin)")
        except OSError:
            pass
    write_record_key(RECORD_KEY, record)


def _drop_leftovers(path: Path, left: Any, was: Any, parse: Any, step: Step) -> None:
    """A file that holds more than before the install (the user changed it since): only the empty
    entries the host left that were not there before go (JSON, which the host rewrote anyway)."""
    empty = [k for k, v in left.items() if v in ({}, []) and k not in was] if isinstance(left, dict) else []
    if parse is not _json_or_empty or not empty or not isinstance(was, dict):
        step.lines.append(f"{path}: left as it is (it holds more than before the install)")
        return
    path.write_text(json.dumps({k: v for k, v in left.items() if k not in empty}, indent=2,
                               ensure_ascii=False) + "\n", encoding="utf-8")
    step.lines.append(f"{path}: removed the empty {', '.join(empty)} the host left (the rest changed since)")


def _json_or_empty(text: str | None) -> Any:
    try:
        return json.loads(text or "{}")
    except ValueError:
        return None


def _toml_or_empty(text: str | None) -> Any:
    import tomllib

    try:
        return tomllib.loads(text or "")
    except tomllib.TOMLDecodeError:
        return None


def _remove_tree(folder: Path, step: Step) -> None:
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
        step.lines.append(f"{folder}: removed (the host's copy of the plugin)")


# --- Claude Code -------------------------------------------------------------------------


def claude_dir() -> Path:
    return Path.home() / ".claude"


def claude_files() -> tuple[Path, Path, Path]:
    """settings.json, installed_plugins.json, known_marketplaces.json."""
    folder = claude_dir()
    return (folder / "settings.json", folder / "plugins" / "installed_plugins.json",
            folder / "plugins" / "known_marketplaces.json")


def claude_state() -> tuple[bool, bool]:
    """(the marketplace is known, the plugin is installed and enabled), from Claude Code's files."""
    settings, installed, known = claude_files()
    markets = _load(known) or {}
    plugins = (_load(installed) or {}).get("plugins") or {}
    enabled = ((_load(settings) or {}).get("enabledPlugins") or {}).get(plugin.ID) is True
    market = markets.get(plugin.NAME) if isinstance(markets, dict) else None
    return isinstance(market, dict), bool(isinstance(plugins, dict) and plugins.get(plugin.ID) and enabled)


def claude_market_folder() -> str | None:
    _, _, known = claude_files()
    market = (_load(known) or {}).get(plugin.NAME)
    return market.get("installLocation") if isinstance(market, dict) else None


def claude_install(program: str, folder: Path) -> Step:
    step = Step()
    known, installed = claude_state()
    same = claude_market_folder() == str(folder)
    if known and installed and same:
        return step
    plugins = claude_dir() / "plugins"
    folders = [plugins, plugins / "cache", plugins / "marketplaces"]
    remember("claude", list(claude_files()), folders)
    if known and not same:
        run_host([program, "plugin", "marketplace", "remove", plugin.NAME, "--json"],
                 "replace the marketplace")
        step.lines.append(f"removed the marketplace {plugin.NAME} (it named {claude_market_folder()})")
        known = installed = False
    if not known:
        run_host([program, "plugin", "marketplace", "add", str(folder), "--json"], "add the marketplace")
        step.lines.append(f"added the marketplace {plugin.NAME} ({folder})")
    if not installed:
        run_host([program, "plugin", "install", plugin.ID, "--json"], "install the plugin")
        step.lines.append(f"installed and enabled the plugin {plugin.ID}")
    return step


def claude_uninstall(program: str) -> Step:
    step = Step()
    known, _ = claude_state()
    plugins = (_load(claude_files()[1]) or {}).get("plugins") or {}
    if isinstance(plugins, dict) and plugin.ID in plugins:
        run_host([program, "plugin", "uninstall", plugin.ID, "--json"], "uninstall the plugin")
        step.lines.append(f"uninstalled the plugin {plugin.ID}")
    if known:
        run_host([program, "plugin", "marketplace", "remove", plugin.NAME, "--json"],
                 "remove the marketplace")
        step.lines.append(f"removed the marketplace {plugin.NAME}")
    _remove_tree(claude_dir() / "plugins" / "cache" / plugin.NAME, step)
    _remove_tree(claude_dir() / "plugins" / "data" / f"{plugin.NAME}-{plugin.NAME}", step)
    restore("claude", _json_or_empty, step)
    return step


# --- Codex -------------------------------------------------------------------------------


def codex_config() -> Path:
    return codex_home() / "config.toml"


def codex_tables() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """([marketplaces.NAME], [plugins."ID"], the [hooks.state] entries of the plugin's hooks)."""
    data = _toml_or_empty(_text(codex_config())) or {}
    market = (data.get("marketplaces") or {}).get(plugin.NAME) or {}
    entry = (data.get("plugins") or {}).get(plugin.ID) or {}
    state = (data.get("hooks") or {}).get("state") or {}
    ours = {k: v for k, v in state.items() if isinstance(k, str) and k.startswith(f"{plugin.ID}:")}
    return market, entry, ours


def plugin_hooks(program: str, cwd: Path) -> list[dict[str, Any]]:
    """The plugin's hooks as the installed Codex lists them (plugins on), with their hashes."""
    from agent_bridge.hosts.codex_doctor import ProbeError, codex_app_server

    try:
        _, hooks = codex_app_server(program, cwd, plugins=True)
    except ProbeError as exc:
        raise InstallError(f"cannot ask Codex for the plugin's hooks: {exc}") from None
    return [h for h in hooks if isinstance(h, dict) and h.get("pluginId") == plugin.ID]


def wanted_trust(hooks: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """KEY -> {trusted_hash, trusted_content_hash}, split from each hook's `currentHash`
    ("sha256:A/sha256:B", seen with 0.171.0)."""
    found = {}
    for hook in hooks:
        key, current = hook.get("key"), hook.get("currentHash")
        if isinstance(key, str) and isinstance(current, str) and "/" in current:
            command, content = current.split("/", 1)
            found[key] = {"trusted_hash": command, "trusted_content_hash": content}
    return found


def write_trust(trust: dict[str, dict[str, str]], drop: bool = False) -> bool:
    """Set (or with `drop`, remove) the plugin's [hooks.state."KEY"] tables in config.toml; True
    when the file changed."""
    import tomlkit

    path = codex_config()
    before = _text(path) or ""
    doc = tomlkit.parse(before)
    hooks = doc.get("hooks")
    if hooks is None:
        if drop:
            return False
        hooks = tomlkit.table(is_super_table=True)
        doc["hooks"] = hooks
    state = hooks.get("state")
    if state is None:
        if drop:
            return False
        state = tomlkit.table(is_super_table=True)
        hooks["state"] = state
    for key in [k for k in state if k.startswith(f"{plugin.ID}:") and (drop or k not in trust)]:
        del state[key]
    for key, values in ({} if drop else trust).items():
        if dict(state.get(key) or {}) != values:
            table = tomlkit.table()
            table.update(values)
            state[key] = table
    if not len(state):
        del hooks["state"]
    if not len(hooks):
        del doc["hooks"]
    after = tomlkit.dumps(doc)
    if after == before:
        return False
    path.write_text(after, encoding="utf-8")
    return True


def codex_install(program: str, folder: Path, cwd: Path) -> Step:
    step = Step()
    market, entry, _ = codex_tables()
    # Codex runs its copy of this version (another version's copy: an upgrade of agent-bridge)
    cache = codex_home() / "plugins" / "cache" / plugin.NAME / plugin.NAME / __version__
    if ((_toml_or_empty(_text(codex_config())) or {}).get("features") or {}).get("plugins") is False:
        raise InstallError(f"{codex_config()} has [features] plugins = false: Codex loads no plugin. Remove "
                           "that line, or use `agent-bridge install --codex` (the config edits) instead")
    home = codex_home()
    remember("codex", [codex_config()], [home / "plugins", home / "plugins" / "cache",
                                         home / "plugins" / "data", home / ".tmp",
                                         home / ".tmp" / "marketplaces"])
    if market.get("source") != str(folder):
        if market:
            run_host([program, "plugin", "marketplace", "remove", plugin.NAME], "replace the marketplace")
        run_host([program, "plugin", "marketplace", "add", str(folder), "--json"], "add the marketplace")
        step.lines.append(f"added the marketplace {plugin.NAME} ({folder})")
    if entry.get("enabled") is not True or not cache.is_dir():
        run_host([program, "plugin", "add", plugin.ID, "--json"], "add the plugin")
        step.lines.append(f"added and enabled the plugin {plugin.ID}")
    trust = wanted_trust(plugin_hooks(program, cwd))
    if not trust:
        raise InstallError(f"Codex lists no hook of {plugin.ID} after adding it; run `codex`, check /hooks")
    if write_trust(trust):
        step.lines.append(f"{codex_config()}: trusted the plugin's {len(trust)} hooks "
                          '([hooks.state."agent-bridge@agent-bridge:…"], as /hooks would)')
    return step


def codex_uninstall(program: str) -> Step:
    step = Step()
    market, entry, _ = codex_tables()
    if entry:
        run_host([program, "plugin", "remove", plugin.ID, "--json"], "remove the plugin")
        step.lines.append(f"removed the plugin {plugin.ID}")
    if market:
        run_host([program, "plugin", "marketplace", "remove", plugin.NAME], "remove the marketplace")
        step.lines.append(f"removed the marketplace {plugin.NAME}")
    if write_trust({}, drop=True):
        step.lines.append(f"{codex_config()}: removed the plugin's trust entries "
                          f'([hooks.state."{plugin.ID}:…"])')
    _remove_tree(codex_home() / "plugins" / "cache" / plugin.NAME, step)
    for data in sorted((codex_home() / "plugins" / "data").glob(f"{plugin.NAME}*")):
        _remove_tree(data, step)
    restore("codex", _toml_or_empty, step)
    return step


# --- doctor --------------------------------------------------------------------------------


def untrusted_hooks(program: str, cwd: Path) -> list[str]:
    """The plugin's hooks the installed Codex does not trust (`codex exec` skips them): their keys."""
    return [str(h.get("key")) for h in plugin_hooks(program, cwd) if h.get("trustStatus") != "trusted"]


def installed(host: str) -> str | None:
    """Where the plugin is installed and enabled for `host` (its marketplace folder), or None."""
    if host == "claude":
        known, enabled = claude_state()
        return (claude_market_folder() or "?") if known and enabled else None
    if host == "codex":
        market, entry, _ = codex_tables()
        return str(market.get("source") or "?") if market and entry.get("enabled") is True else None
    return None
