"""The project key (SPEC §10): one key per repository whatever the origin URL's spelling, read
from the folder's git config without running git (worktrees included); no origin, no key."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent_bridge.common.projectkey import normalize_remote, origin_in_config, project_key

SAME = [
    "git@github.com:Org/Repo.git",
    "git@github.com:Org/Repo",
    "https://github.com/Org/Repo",
    "https://github.com/Org/Repo.git",
    "https://GitHub.com/Org/Repo.git/",
    "https://user:token@github.com/Org/Repo.git",
    "http://github.com:80/Org/Repo",
    "ssh://git@github.com/Org/Repo.git",
    "ssh://git@GitHub.com:22/Org/Repo.git/",
    "git+ssh://github.com/Org/Repo",
    "git://github.com/Org/Repo.git",
    "  git@github.com:Org/Repo.git\n",
]


@pytest.mark.parametrize("url", SAME)
def test_spellings_of_one_repository_are_one_key(url: str) -> None:
    assert normalize_remote(url) == "github.com/Org/Repo"


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("ssh://git@host.example:2222/team/app.git", "host.example:2222/team/app"),
        ("https://gitlab.example.com/group/sub/proj.git", "gitlab.example.com/group/sub/proj"),
        ("git@github.com:Org/Other.git", "github.com/Org/Other"),
        ("git@github.com:org/repo.git", "github.com/org/repo"),  # the path keeps its case
    ],
)
def test_other_repositories_have_other_keys(url: str, key: str) -> None:
    assert normalize_remote(url) == key
    assert key != "github.com/Org/Repo"


@pytest.mark.parametrize("url", ["", "   ", "/srv/git/repo.git", "./repo", "~/repo", "file:///srv/repo.git",
                                 "C:/repos/app", "C:\\repos\\app", "https://github.com/", "https://github.com/.git"])
def test_what_is_not_a_remote_has_no_key(url: str) -> None:
    assert normalize_remote(url) is None


def test_the_config_is_read_as_git_writes_it() -> None:
    text = (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        '[remote "upstream"]\n\turl = git@github.com:Up/Stream.git\n'
        '[remote "origin"]\n\turl = "git@github.com:Org/Repo.git" ; a comment\n'
        "\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
        '[branch "main"]\n\tremote = origin\n\turl = nope\n'
    )
    assert origin_in_config(text) == "git@github.com:Org/Repo.git"
    assert origin_in_config("[remote.origin]\nurl = https://h/o/r\n") == "https://h/o/r"
    assert origin_in_config('[remote "upstream"]\nurl = https://h/o/r\n') is None
    assert origin_in_config("not a config [[[ \x00") is None


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_folders_clones_and_worktrees(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert project_key(plain) is None  # no repository
    assert project_key(tmp_path / "missing") is None

    a = tmp_path / "a"
    a.mkdir()
    git("init", "-q", cwd=a)
    assert project_key(a) is None  # a repository without origin shares nothing
    git("remote", "add", "origin", "git@github.com:Org/Repo.git", cwd=a)
    assert project_key(a) == "github.com/Org/Repo"
    assert project_key(str(a)) == "github.com/Org/Repo"

    b = tmp_path / "b"
    b.mkdir()
    git("init", "-q", cwd=b)
    git("remote", "add", "origin", "https://github.com/Org/Repo", cwd=b)
    assert project_key(b) == project_key(a)  # another clone, another spelling: one key

    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x", cwd=a)
    wt = tmp_path / "wt"
    git("worktree", "add", "-q", str(wt), cwd=a)
    assert (wt / ".git").is_file()  # `gitdir: …/.git/worktrees/wt`, with a commondir
    assert project_key(wt) == "github.com/Org/Repo"

    other = tmp_path / "other"
    other.mkdir()
    git("init", "-q", cwd=other)
    git("remote", "add", "origin", "git@github.com:Org/Other.git", cwd=other)
    assert project_key(other) != project_key(a)


def test_a_broken_git_file_has_no_key(tmp_path: Path) -> None:
    (tmp_path / ".git").write_text("gitdir: /nowhere/at/all\n")
    assert project_key(tmp_path) is None
    (tmp_path / ".git").write_bytes(b"\xff\xfe garbage")
    assert project_key(tmp_path) is None
