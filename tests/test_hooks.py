"""The optional git_init task (hooks/git_init.py), the need for --trust, and the rendered
project's pre-commit hook, run with real copier, git and pre-commit."""

from __future__ import annotations

import os
import pty
import select
import shutil
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import GIT_ENV, PACKAGE, git, render, run, tag_release, update

COPIER = Path(sys.executable).with_name("copier")


@pytest.fixture(scope="module")
def template_repo(template, tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo") / "tpl"
    shutil.copytree(template, repo)
    tag_release(repo, "v0.2.0")
    return repo


@pytest.fixture
def git_identity(tmp_path):
    """A git configuration of the test's own (empty: no user identity), for `copy_cli`."""
    config = tmp_path / "gitconfig"
    config.write_text("")
    return config


def copy_cli(template_repo, dest, git_config, *data):
    """`copier copy --trust` as a user types it, with `git_config` as git's only settings."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(git_config.parent),
        "GIT_CONFIG_GLOBAL": str(git_config),
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    flags = [f"--data={item}" for item in (f"package_name={PACKAGE}", *data)]
    return run(COPIER, "copy", "--trust", "--defaults", *flags, template_repo, dest, env=env)


def test_git_init_commits_the_project_and_update_works_at_once(
    template_repo, tmp_path, git_identity
):
    git_identity.write_text("[user]\n\tname = Someone\n\temail = someone@example.com\n")
    project = tmp_path / "p"
    result = copy_cli(template_repo, project, git_identity, "git_init=true")
    assert "created the repository with a first commit" in result.stderr
    log = run("git", "log", "--format=%s", cwd=project).stdout.splitlines()
    assert log == ["Project rendered from copier-torch-train"]
    assert run("git", "status", "--porcelain", cwd=project).stdout == ""
    assert "git_init" not in (project / ".copier-answers.yml").read_text()  # asked once
    update(project)  # needs a clean git work tree: there is one from day one
    assert run("git", "status", "--porcelain", cwd=project).stdout == ""


def test_git_init_is_asked_in_a_terminal(template_repo, tmp_path, git_identity):
    """Typed at the prompt, as a user answers it: `copier copy` in a terminal (a pseudo-terminal
    here) asks git_init, and a "y" commits the project."""
    git_identity.write_text("[user]\n\tname = Someone\n\temail = someone@example.com\n")
    project = tmp_path / "p"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TERM": "xterm"}
    env.update(GIT_CONFIG_GLOBAL=str(git_identity), GIT_CONFIG_NOSYSTEM="1")
    cmd = [COPIER, "copy", "--trust", "--defaults", "--ask", "git_init", template_repo, project]
    pid, terminal = pty.fork()
    if pid == 0:  # the child: copier, with the terminal as its stdin, stdout and stderr
        os.execve(str(COPIER), [str(c) for c in cmd], env)
    shown, answered, deadline = b"", False, time.monotonic() + 300
    while time.monotonic() < deadline:
        if not select.select([terminal], [], [], 1)[0]:
            continue
        try:
            shown += os.read(terminal, 4096)
        except OSError:  # the child has exited: its terminal is closed
            break
        if not answered and b"git init" in shown:
            os.write(terminal, b"y")
            answered = True
    _, status = os.waitpid(pid, 0)
    assert answered, shown.decode(errors="replace")[-2000:]
    assert os.waitstatus_to_exitcode(status) == 0
    log = run("git", "log", "--format=%s", cwd=project).stdout.splitlines()
    assert log == ["Project rendered from copier-torch-train"]
    assert "git_init" not in (project / ".copier-answers.yml").read_text()  # asked once


def test_git_init_without_an_identity_stages_and_says_so(template_repo, tmp_path, git_identity):
    git_identity.write_text("[user]\n\tuseConfigOnly = true\n")  # no guessed identity
    project = tmp_path / "p"
    result = copy_cli(template_repo, project, git_identity, "git_init=true")
    assert "git could not commit" in result.stderr
    assert (project / ".git").is_dir()
    assert run("git", "log", cwd=project, check=False).returncode != 0  # no commit
    staged = run("git", "diff", "--cached", "--name-only", cwd=project).stdout.split()
    assert "train.py" in staged and f"{PACKAGE}/models.py" in staged


def test_nothing_runs_unless_asked(template_repo, tmp_path, git_identity):
    project = tmp_path / "p"
    result = copy_cli(template_repo, project, git_identity)
    assert not (project / ".git").exists() and "Running task" not in result.stderr


def test_git_init_leaves_an_enclosing_repository_alone(template_repo, tmp_path, git_identity):
    git(tmp_path, "init", "-q")
    project = tmp_path / "sub"
    result = copy_cli(template_repo, project, git_identity, "git_init=true")
    assert "already inside a git work tree" in result.stderr
    assert not (project / ".git").exists()


def test_copy_without_trust_is_refused_with_the_reason(template_repo, tmp_path):
    result = run(COPIER, "copy", "--defaults", template_repo, tmp_path / "p", check=False)
    assert result.returncode != 0
    assert "--trust" in result.stderr and "tasks" in result.stderr
    assert not (tmp_path / "p" / "train.py").exists()


def test_pre_commit_hook_refuses_conflict_markers(template_repo, tmp_path):
    project = render(template_repo, tmp_path / "p")
    env = {
        **GIT_ENV,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-cache"),
        # As in an activated virtual environment: `python` is the project's interpreter.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{GIT_ENV['PATH']}",
    }
    git(project, "init", "-q", "-b", "main")
    run(sys.executable, "-m", "pre_commit", "install", cwd=project, env=env)
    git(project, "add", "-A")
    run("git", "commit", "-q", "-m", "rendered", cwd=project, env=env)  # the hook passes

    train = project / "train.py"
    lines = train.read_text().splitlines(keepends=True)
    lines[40:41] = ["<" * 7 + " before updating\n", lines[40], "=" * 7 + "\n", ">" * 7 + " x\n"]
    train.write_text("".join(lines))
    git(project, "add", "-A")
    result = run("git", "commit", "-q", "-m", "conflicted", cwd=project, env=env, check=False)
    assert result.returncode != 0
    assert "train.py: unresolved merge conflict" in result.stdout + result.stderr
    assert run("git", "log", "--format=%s", cwd=project).stdout.splitlines() == ["rendered"]
