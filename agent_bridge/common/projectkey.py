"""A folder's project key (SPEC §10 "Decisions"): the normalized URL of its git `origin` remote,
the same on every machine that cloned the same repository, whatever the URL's spelling.

    git@github.com:Org/Repo.git            ─┐
    https://github.com/Org/Repo            ─┤
    ssh://git@GitHub.com:22/Org/Repo.git/  ─┼─▶  github.com/Org/Repo
    git+ssh://github.com/Org/Repo          ─┘

`normalize_remote` is pure: the host lowercased, user and password dropped, a default port
(22, 80, 443, 9418) dropped, `.git` and trailing slashes dropped; the path keeps its case (most
hosts' paths are case-sensitive). `origin_url` reads `.git/config` without running git: a
folder's `.git` may be a file (`gitdir: …`, a worktree or a submodule), whose `commondir` leads
to the repository's shared config. A folder without a repository or without `origin` has no key
(None) and shares no project decisions. Standard library only (the hooks may read it).
"""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_PORTS = {"22", "80", "443", "9418"}
_SCP_LIKE = re.compile(r"^(?:(?P<user>[^@/]+)@)?(?P<host>[^:/]+):(?P<path>(?!//).+)$")
_URL = re.compile(
    r"^(?P<scheme>[a-z][a-z0-9+.-]*)://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]]+\]|[^:/]+)"
    r"(?::(?P<port>[0-9]*))?(?P<path>/.*)?$",
    re.IGNORECASE,
)
MAX_CONFIG = 1024 * 1024  # bytes of a git config read (a real one is a few KB)


def normalize_remote(url: str) -> str | None:
    """`host[:port]/path` for a remote URL, or None for something that is not one (a local
    path, `file://`, an empty string)."""
    url = url.strip()
    if not url:
        return None
    m = _URL.match(url)
    if m:
        if m["scheme"].lower() == "file":
            return None
        host, port, path = m["host"], m["port"], m["path"] or ""
        if port == "" or port in DEFAULT_PORTS:
            port = None
        if port is None and path.startswith("/:"):  # ssh://host:/path (an empty port)
            path = path[2:]
    elif "://" not in url and not url.startswith(("/", ".", "~")) and (m := _SCP_LIKE.match(url)):
        host, port, path = m["host"], None, m["path"]
        if len(host) == 1 and path.startswith(("\\", "/")):
            return None  # C:/repo or C:\repo: a Windows path, not a host
    else:
        return None
    path = path.replace("\\", "/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if parts and parts[0] == "~":
        parts = parts[1:]
    while parts and parts[-1].lower().endswith(".git"):
        parts[-1] = parts[-1][:-4]
        if parts[-1]:
            break
        parts.pop()
    if not parts or not host:
        return None
    key = host.lower() + (f":{port}" if port else "")
    return key + "/" + "/".join(parts)


def git_dir(folder: Path) -> Path | None:
    """The repository folder of `folder` (`.git`, or where a `.git` file points), or None."""
    dot = folder / ".git"
    try:
        if dot.is_dir():
            return dot
        if dot.is_file():
            text = dot.read_text("utf-8", errors="replace")[:4096]
            for line in text.splitlines():
                if line.startswith("gitdir:"):
                    target = Path(line[len("gitdir:"):].strip())
                    return target if target.is_absolute() else (folder / target)
    except OSError:
        return None
    return None


def config_file(repo: Path) -> Path:
    """The config a repository folder reads: its own, or a worktree's common one."""
    try:
        common = (repo / "commondir").read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return repo / "config"
    base = Path(common)
    return (base if base.is_absolute() else repo / base) / "config"


def origin_url(folder: Path) -> str | None:
    """The `url` of the `origin` remote in the folder's git config, read without git."""
    repo = git_dir(folder)
    if repo is None:
        return None
    try:
        with open(config_file(repo), "rb") as f:
            raw = f.read(MAX_CONFIG)
        text = raw.decode("utf-8", errors="replace")
    except OSError:
        return None
    return origin_in_config(text)


_SECTION = re.compile(r'^\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\]\s*(.*)$')


def origin_in_config(text: str) -> str | None:
    """`remote.origin.url` in a git config's text (the last one wins, as git reads it)."""
    section: tuple[str, str | None] | None = None
    found = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _SECTION.match(line)
        if m:
            name, sub = m[1].lower(), m[2]
            if sub is None and "." in name:  # the old [remote.origin] spelling
                name, _, sub = name.partition(".")
            section = (name, sub)
            line = m[3].strip()  # a key may follow the header on its line
            if not line:
                continue
        if section != ("remote", "origin"):
            continue
        key, eq, value = line.partition("=")
        if eq and key.strip().lower() == "url":
            found = _config_value(value)
    return found


def _config_value(value: str) -> str:
    """A git config value: quotes removed, a comment (`#`, `;` outside quotes) cut off."""
    out, quoted, i = [], False, 0
    value = value.strip()
    while i < len(value):
        ch = value[i]
        if ch == '"':
            quoted = not quoted
        elif ch == "\\" and i + 1 < len(value):
            i += 1
            out.append({"n": "\n", "t": "\t"}.get(value[i], value[i]))
        elif ch in "#;" and not quoted:
            break
        else:
            out.append(ch)
        i += 1
    return "".join(out).strip()


def project_key(folder: str | Path) -> str | None:
    """The folder's project key: its origin remote, normalized; None without one."""
    url = origin_url(Path(folder))
    return None if url is None else normalize_remote(url)
