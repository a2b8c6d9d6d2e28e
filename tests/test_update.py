"""`copier update` with real git and real copier keeps users' edits.

A template repository with two releases is built from the working tree in a temporary
folder (so the test needs no tags in CI's clone); a project is rendered from the first,
committed, edited the way users edit, and updated to the second."""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from copier.errors import TaskError

from tests.helpers import (
    GIT_ENV,
    assert_no_conflicts,
    commit_all,
    git,
    inside,
    render_release,
    run,
    snapshot_template,
    tag_release,
    update,
)

# Later than v0.2.0, whose migrations (copier.yml) do not concern these tests.
OLD, NEW = "v0.3.0", "v0.4.0"


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory):
    """OLD is the working tree; NEW changes a default and adds a line to a docstring."""
    repo = snapshot_template(tmp_path_factory.mktemp("repo"))
    tag_release(repo, OLD)
    train = repo / "template/train.py.jinja"
    text = train.read_text()
    assert 'default=50, help="steps between host syncs"' in text
    text = text.replace(
        'default=50, help="steps between host syncs"',
        'default=20, help="steps between host syncs"',
    )
    train.write_text(text)
    models = repo / "template/{{package_name}}/models.py.jinja"
    models.write_text(
        models.read_text().replace(
            '"""Flatten, one hidden layer:',
            '"""A multilayer perceptron. Flatten, one hidden layer:',
        )
    )
    tag_release(repo, NEW)
    return repo


def render_old(template_repo, dest, **answers):
    return render_release(template_repo, dest, OLD, **answers)


def users_edits(project):
    """The kinds of edits users make, committed."""
    models = project / "proj/models.py"
    models.write_text(
        models.read_text().replace(
            '    "mlp": lambda info:',
            '    "my_net": lambda info: MLP(math.prod(info.input_shape), 10, 64),  # our own\n'
            '    "mlp": lambda info:',
        )
    )
    train = project / "train.py"
    text = train.read_text()
    assert 'default=10, help="epochs to train"' in text
    train.write_text(
        text.replace('default=10, help="epochs to train"', 'default=42, help="epochs to train"')
    )
    (project / "notes.md").write_text("# Our notes\n")
    (project / "tests/test_models.py").unlink()
    commit_all(project, "our edits")


def test_update_keeps_edits_and_brings_the_change(template_repo, tmp_path):
    project = render_old(template_repo, tmp_path / "p")
    assert f"_commit: {OLD}" in (project / ".copier-answers.yml").read_text()
    assert "_src_path:" in (project / ".copier-answers.yml").read_text()
    users_edits(project)
    update(project)
    assert_no_conflicts(project)
    train = (project / "train.py").read_text()
    assert "default=20," in train and "default=50," not in train  # the template's change
    assert "default=42," in train  # the user's default
    models = (project / "proj/models.py").read_text()
    assert '"my_net": lambda info:' in models  # the user's model
    assert '"""A multilayer perceptron.' in models  # the template's change, same file
    assert (project / "notes.md").read_text() == "# Our notes\n"
    assert not (project / "tests/test_models.py").exists()  # deleted stays deleted
    assert f"_commit: {NEW}" in (project / ".copier-answers.yml").read_text()


def test_changing_an_answer_rerenders_and_keeps_edits(template_repo, tmp_path):
    project = render_old(template_repo, tmp_path / "p")
    users_edits(project)
    update(project, optimizer="lamb")
    assert_no_conflicts(project)
    assert (project / "proj/lamb.py").is_file()
    assert "Lamb(" in (project / "proj/optim.py").read_text()
    assert '"my_net": lambda info:' in (project / "proj/models.py").read_text()
    assert "default=42," in (project / "train.py").read_text()
    assert "optimizer: lamb" in (project / ".copier-answers.yml").read_text()


def test_an_update_refuses_a_new_answer_that_earlier_ones_contradict(template_repo, tmp_path):
    """Copier drops an earlier answer that a new one makes invalid and, with --defaults, puts
    the question's default in its place: moving to FSDP would silently lose fp16 and the ema
    extra. The update is refused instead, naming the answers to give with it, and the
    project stays as it was; given with them, it goes through."""
    extras = ["preemption", "device_data", "ema"]
    project = render_old(template_repo, tmp_path / "p", amp="fp16", extras=extras)
    answers = (project / ".copier-answers.yml").read_text()
    refusals = {
        "distributed": (
            {"distributed": "fsdp"},
            "distributed fsdp does not take the project's amp fp16, extras device_data, ema "
            "yet; answer anew in the same command: -d amp=bf16 -d 'extras=[\"preemption\"]'",
        ),
        "data": (
            {"data": "tensors"},
            "data tensors: the project's extra device_data needs data images; answer extras "
            'anew in the same command: -d \'extras=["preemption", "ema"]\'',
        ),
    }
    for question, (new, message) in refusals.items():
        with pytest.raises(ValueError) as refused:
            update(project, **new)
        assert str(refused.value) == f"Validation error for question '{question}': {message}"
        assert (project / ".copier-answers.yml").read_text() == answers
        assert git(project, "status", "--porcelain") == ""
    update(project, distributed="fsdp", amp="bf16", extras=["preemption"])
    recorded = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert (recorded["distributed"], recorded["amp"], recorded["extras"]) == (
        "fsdp",
        "bf16",
        ["preemption"],
    )


def test_update_refuses_a_dirty_project_and_touches_nothing(template_repo, tmp_path):
    project = render_old(template_repo, tmp_path / "p")
    (project / "train.py").write_text((project / "train.py").read_text() + "# wip\n")
    before = {
        p: p.read_bytes() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts
    }
    with pytest.raises(Exception, match="(?i)dirty"):
        update(project)
    after = {p: p.read_bytes() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert after == before
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=project, capture_output=True, text=True
    ).stdout
    assert status.strip() == "M train.py"


def test_a_conflicting_update_fails_naming_the_files_and_so_do_the_projects_tests(
    template_repo, tmp_path
):
    """The user changed the very line the template changes (--log-interval's default): the
    file gets conflict markers, `copier update` (the real command) lists it and fails, and
    the project's own tests stop at once naming it, though train.py no longer imports."""
    project = render_old(template_repo, tmp_path / "p")
    train = project / "train.py"
    old_line = 'default=50, help="steps between host syncs"'
    assert old_line in train.read_text()
    train.write_text(train.read_text().replace(old_line, old_line.replace("50", "100")))
    commit_all(project, "our log interval")
    copier_cli = Path(sys.executable).with_name("copier")
    env = {**GIT_ENV, "HOME": str(tmp_path)}
    result = run(copier_cli, "update", "--trust", "--defaults", cwd=project, env=env, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "train.py: unresolved merge conflict" in output
    assert "copier update left the conflicts listed above" in output
    assert "<" * 7 in train.read_text()
    tests = run(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=project, check=False
    )
    assert tests.returncode == 1
    assert "unresolved conflicts of copier update in: train.py" in tests.stdout + tests.stderr


def own_module(project, package="proj"):
    """A module of the user's own in the package, and a test of theirs that imports it."""
    (project / package / "layers.py").write_text("WIDTH = 64\n")
    (project / "tests/test_layers.py").write_text(
        f"import {package}.layers\nfrom {package}.models import MODELS\n\n\n"
        f"def test_ours():\n    assert {package}.layers.WIDTH == 64 and 'my_net' in MODELS\n"
    )


def test_a_renamed_package_takes_the_users_files_along(template_repo, tmp_path, capfd):
    """`--data package_name=newpkg` used to delete proj/models.py with the user's edit in it
    (exit 0). The edits are merged into newpkg/, the user's own module moves there, and
    imports of proj follow."""
    project = render_old(template_repo, tmp_path / "p")
    users_edits(project)
    own_module(project)
    commit_all(project, "our module")
    capfd.readouterr()

    update(project, package_name="newpkg")

    assert_no_conflicts(project)
    assert not (project / "proj").exists()
    models = (project / "newpkg/models.py").read_text()
    assert '"my_net": lambda info:' in models  # the user's model
    assert '"""A multilayer perceptron.' in models  # the template's change, same file
    assert (project / "newpkg/layers.py").read_text() == "WIDTH = 64\n"
    assert (
        (project / "tests/test_layers.py")
        .read_text()
        .startswith("import newpkg.layers\nfrom newpkg.models import MODELS\n")
    )
    assert "newpkg.layers.WIDTH == 64" in (project / "tests/test_layers.py").read_text()
    assert "default=42," in (project / "train.py").read_text()
    assert not (project / "tests/test_models.py").exists()  # deleted stays deleted
    assert "package_name: newpkg" in (project / ".copier-answers.yml").read_text()
    assert capfd.readouterr().err.splitlines()[-3:] == [
        "migrate: moved your edits of proj/models.py into newpkg/models.py",
        "migrate: moved your proj/layers.py to newpkg/layers.py",
        "migrate: imports of proj now import newpkg in tests/test_layers.py",
    ]
    with inside(project):  # the user's test, importing the moved module
        runpy.run_path("tests/test_layers.py")["test_ours"]()


def test_a_renamed_package_marks_edits_that_conflict(template_repo, tmp_path):
    """The user rewrote the docstring that the new release rewrites too: both are kept,
    marked in the new package's file, and the update fails naming it."""
    project = render_old(template_repo, tmp_path / "p")
    models = project / "proj/models.py"
    text = models.read_text()
    assert text.count('"""Flatten, one hidden layer:') == 1
    models.write_text(text.replace('"""Flatten, one hidden layer:', '"""Our MLP. Flatten, one:'))
    commit_all(project, "our docstring")
    with pytest.raises(TaskError):  # the update's last step lists the conflict and fails
        update(project, package_name="newpkg")
    merged = (project / "newpkg/models.py").read_text()
    assert "<<<<<<< after updating" in merged and ">>>>>>> your edits of proj/models.py" in merged
    assert '"""Our MLP. Flatten, one:' in merged and '"""A multilayer perceptron.' in merged
    assert not (project / "proj").exists()


def test_an_edited_file_that_the_update_drops_is_kept(template_repo, tmp_path, capfd):
    """Turning an extra off drops its module: an unedited one goes, an edited one stays, with
    a line that says so."""
    project = render_old(template_repo, tmp_path / "p", extras=["preemption", "guard", "finders"])
    guard = project / "proj/guard.py"
    guard.write_text(guard.read_text() + "\n# our note on the guard\n")
    commit_all(project, "our note")
    capfd.readouterr()
    update(project, extras=["preemption"])
    assert_no_conflicts(project)
    assert not (project / "proj/finders.py").exists()
    assert guard.read_text().endswith("\n# our note on the guard\n")
    assert "guard" not in (project / "train.py").read_text()
    assert (
        "migrate: kept proj/guard.py, which holds your edits, though the template no longer "
        "renders it: delete it if you do not need it"
    ) in capfd.readouterr().err.splitlines()


def test_a_kept_script_stays_executable(template_repo, tmp_path):
    """An edited launch script that an update drops (DDP answered single) is kept as the user
    had it: its text and its executable bit."""
    project = render_old(template_repo, tmp_path / "p", distributed="ddp")
    launch = project / "scripts/launch.sh"
    assert launch.stat().st_mode & 0o111
    launch.write_text(launch.read_text() + "# our cluster's module loads\n")
    commit_all(project, "our launch")
    update(project, distributed="single")
    assert launch.read_text().endswith("# our cluster's module loads\n")
    assert launch.stat().st_mode & 0o777 == 0o755


def test_an_interrupted_update_leaves_the_project_as_it_was(template_repo, tmp_path):
    """Ctrl-C while `copier update` (the real command) merges: the new release is already
    written over the files, the user's committed edits are not back yet. A `git` that
    waits at `git apply`, the step that merges them, holds the update at that point; the
    terminal's SIGINT then goes to the command's whole process group. The project ends
    exactly at its last commit, and says so, and the update then runs as if never begun."""
    project = render_old(template_repo, tmp_path / "p")
    users_edits(project)
    head = git(project, "rev-parse", "HEAD").strip()
    waiting = tmp_path / "at-git-apply"
    shims = tmp_path / "bin"
    shims.mkdir()
    real_git = shutil.which("git")
    (shims / "git").write_text(
        f'#!/bin/sh\nif [ "$1" = apply ]; then touch {waiting}; sleep 300; fi\n'
        f'exec {real_git} "$@"\n'
    )
    (shims / "git").chmod(0o755)
    copier_cli = Path(sys.executable).with_name("copier")
    env = {**GIT_ENV, "HOME": str(tmp_path), "PATH": f"{shims}:{GIT_ENV['PATH']}"}
    update_run = subprocess.Popen(
        [copier_cli, "update", "--trust", "--defaults"],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # A suite started in the background (`make test &`) inherits SIGINT ignored, and
        # ignored signals survive exec: the update must take Ctrl-C as a terminal gives it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not waiting.exists():
            assert update_run.poll() is None, update_run.communicate()
            assert time.monotonic() < deadline, "the update never reached git apply"
            time.sleep(0.1)
        # Half-way: the template's change is in, the user's edit is not.
        train = (project / "train.py").read_text()
        assert "default=20," in train and "default=42," not in train
        os.killpg(update_run.pid, signal.SIGINT)
        _, stderr = update_run.communicate(timeout=120)
    finally:
        if update_run.poll() is None:
            os.killpg(update_run.pid, signal.SIGKILL)
    assert update_run.returncode == 1
    assert stderr.strip().splitlines()[-2:] == [
        "Execution stopped by user",
        "copier update stopped before it was done: the project is back as it was at its "
        f"last commit, {head[:12]}; run the update again",
    ]
    assert git(project, "status", "--porcelain", "--untracked-files=all") == ""
    assert git(project, "rev-parse", "HEAD").strip() == head
    assert "default=42," in (project / "train.py").read_text()
    assert not list((project / ".git").glob("copier-*"))  # no note of an update left
    update(project)
    assert_no_conflicts(project)
    assert "default=42," in (project / "train.py").read_text()
    assert f"_commit: {NEW}" in (project / ".copier-answers.yml").read_text()
