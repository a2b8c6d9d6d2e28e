"""`copier update` across the migrations of v0.2.0 (copier.yml's _migrations, hooks/migrate.py).

v0.1.0 is rebuilt from the working tree as it was before those changes: the question
`workers` was called `num_workers`, and the rendered conflict check lived in
tests/test_project_files.py, without its docstring paragraph and its command-line use."""

from __future__ import annotations

import shutil
import sys

import pytest
import yaml
from copier.errors import TaskError

from tests.helpers import (
    GIT_ENV,
    ROOT,
    assert_no_conflicts,
    commit_all,
    git,
    render_release,
    run,
    snapshot_template,
    tag_release,
    update,
)

OLD_CHECK, NEW_CHECK = "tests/test_project_files.py", "tests/test_no_conflicts.py"


def as_v0_1_0(repo):
    """Undo, in a copy of the working tree, what v0.2.0 renamed and moved."""
    config = repo / "copier.yml"
    text = config.read_text()
    for new, old in (
        ("\nworkers:\n", "\nnum_workers:\n"),
        ("{% if workers < 0 %}workers must", "{% if num_workers < 0 %}num_workers must"),
        ("(got {{ workers }})", "(got {{ num_workers }})"),
    ):
        assert text.count(new) == 1, new
        text = text.replace(new, old)
    config.write_text(text)
    for path in (repo / "template").rglob("*.jinja"):
        path.write_text(path.read_text().replace("{{ workers }}", "{{ num_workers }}"))
    check = (repo / "template" / NEW_CHECK).read_text()
    first_line, _, rest = check.partition("\n\nRun by pytest")
    body = rest[rest.index('"""') + 3 :]
    body = body[: body.index('\n\nif __name__ == "__main__":')] + "\n"
    (repo / "template" / NEW_CHECK).unlink()
    (repo / "template" / OLD_CHECK).write_text(first_line + '"""' + body)


def two_releases(tmp_path_factory, as_old, old: str, new: str):
    """A template repository whose release `old` is the working tree as `as_old` leaves it,
    and `new` the working tree itself."""
    repo = snapshot_template(tmp_path_factory.mktemp("repo"))
    as_old(repo)
    tag_release(repo, old)
    shutil.rmtree(repo / "template")
    shutil.rmtree(repo / "hooks")
    snapshot_template(repo)  # the working tree again
    tag_release(repo, new)
    return repo


@pytest.fixture(scope="module")
def template_repo(tmp_path_factory):
    return two_releases(tmp_path_factory, as_v0_1_0, "v0.1.0", "v0.2.0")


def old_project(template_repo, tmp_path):
    project = render_release(template_repo, tmp_path / "p", "v0.1.0", num_workers=2)
    assert "num_workers: 2" in (project / ".copier-answers.yml").read_text()
    assert (project / OLD_CHECK).is_file() and not (project / NEW_CHECK).exists()
    return project


def test_renamed_answer_and_moved_file_keep_the_users_edits(template_repo, tmp_path):
    project = old_project(template_repo, tmp_path)
    check = project / OLD_CHECK
    check.write_text(check.read_text().replace('{"runs", "data",', '{"runs", "data", "outputs",'))
    train = project / "train.py"
    train.write_text(train.read_text().replace('default="runs/default"', 'default="runs/ours"'))
    commit_all(project, "our edits")

    update(project)

    assert_no_conflicts(project)
    answers = (project / ".copier-answers.yml").read_text()
    assert "workers: 2" in answers and "num_workers" not in answers
    assert "_commit: v0.2.0" in answers
    train_text = train.read_text()
    assert 'default="runs/ours"' in train_text  # the user's edit
    assert "type=int_at_least(0), default=2," in train_text  # the answer, under its new name
    assert not check.exists()
    moved = (project / NEW_CHECK).read_text()
    assert '"outputs"' in moved  # the user's edit, moved with the file
    assert 'if __name__ == "__main__":' in moved  # and the template's change to it
    run(sys.executable, NEW_CHECK, cwd=project)  # the check itself, clean


def test_a_deleted_file_stays_deleted_under_its_new_name(template_repo, tmp_path):
    project = old_project(template_repo, tmp_path)
    (project / OLD_CHECK).unlink()
    commit_all(project, "we do not want this test")
    update(project)
    assert not (project / OLD_CHECK).exists() and not (project / NEW_CHECK).exists()


def test_an_unedited_file_is_simply_moved(template_repo, template, tmp_path):
    project = old_project(template_repo, tmp_path)
    update(project)
    assert not (project / OLD_CHECK).exists()
    expected = (template / "template" / NEW_CHECK).read_text()
    assert (project / NEW_CHECK).read_text() == expected


def test_conflicting_edits_are_marked_and_fail_the_projects_check(template_repo, tmp_path):
    project = old_project(template_repo, tmp_path)
    check = project / OLD_CHECK
    text = check.read_text()
    first_line = text.splitlines()[0]
    check.write_text(text.replace(first_line, '"""Our own words for this check."""', 1))
    commit_all(project, "our docstring")
    with pytest.raises(TaskError):  # the update's last step lists the conflict and fails
        update(project)
    moved = (project / NEW_CHECK).read_text()
    assert "<<<<<<< after updating" in moved and ">>>>>>> your edits of" in moved
    assert "Our own words" in moved and "Run by pytest" in moved  # both sides kept
    # The check cannot even be imported with markers in it: it fails, showing them.
    result = run(sys.executable, NEW_CHECK, cwd=project, check=False)
    assert result.returncode == 1 and "<<<<<<< after updating" in result.stderr


def test_a_move_git_cannot_merge_is_reported_as_such_not_as_a_conflict(tmp_path):
    """git merge-file refuses binary files: an error, which leaves the template's new file
    and says where the user's old one still is."""
    template_repo = tmp_path / "template-repo"
    (template_repo / "template").mkdir(parents=True)
    (template_repo / "hooks").mkdir()
    shutil.copy2(ROOT / "hooks" / "migrate.py", template_repo / "hooks")
    (template_repo / "template" / "old.txt").write_text("one\ntwo\n")
    tag_release(template_repo, "v1")
    project = tmp_path / "project"
    project.mkdir()
    git(project, "init", "-q", "-b", "main")
    (project / "old.txt").write_text("one\0\ntwo\nmine\n")
    commit_all(project, "edited")
    (project / "new.txt").write_text("one\ntwo\nthree\n")  # as the update left it
    result = run(
        sys.executable,
        template_repo / "hooks" / "migrate.py",
        *["move-file", "old.txt", "new.txt"],
        cwd=project,
        env={**GIT_ENV, "VERSION_FROM": "v1"},
    )
    assert "could not be merged" in result.stderr, result.stderr
    assert "git show HEAD:old.txt" in result.stderr and "conflict" not in result.stderr
    assert (project / "new.txt").read_text() == "one\ntwo\nthree\n"
    assert not (project / "old.txt").exists()


V060_QUESTIONS = """ema:
  type: bool
  help: Keep an exponential moving average of the weights by default (runtime flag --ema)
  default: false

logger:
  type: str
  help: Where metrics go besides the console (metrics.csv is always written)
  choices:
    "CSV only": csv
    "CSV and TensorBoard": tensorboard
  default: csv

"""


def as_v0_6_0(repo):
    """Undo, in a copy of the working tree, what v0.7.0 changed in the questions: ema and
    logger were questions of their own, and every project had preemption, the on-device data
    path, the guard and the finders."""
    config = repo / "copier.yml"
    text = config.read_text()
    extras = text.index("extras:\n  type: str")
    short_names = text.index("# Not asked: short names")
    text = text[:extras] + V060_QUESTIONS + text[short_names:]
    computed_ema = "ema:\n  type: bool\n  when: false\n  default: \"{{ 'ema' in extras }}\"\n"
    for new, old in (
        (computed_ema, ""),
        ("\"{{ 'finders' in extras }}\"", '"{{ true }}"'),
        ("\"{{ 'preemption' in extras }}\"", '"{{ true }}"'),
        ("\"{{ 'device_data' in extras and data == 'images' }}\"", '"{{ true }}"'),
        ("\"{{ 'guard' in extras }}\"", '"{{ true }}"'),
        ("\"{{ 'tensorboard' in extras }}\"", "\"{{ logger == 'tensorboard' }}\""),
    ):
        assert text.count(new) == 1, new
        text = text.replace(new, old)
    text = text[: text.index("  # v0.7.0 gathered")]  # the migrations v0.7.0 added
    config.write_text(text)


EVERY_PROJECT_HAD = ["preemption", "device_data", "guard", "finders"]  # up to v0.6.0


@pytest.fixture(scope="module")
def extras_repo(tmp_path_factory):
    return two_releases(tmp_path_factory, as_v0_6_0, "v0.6.0", "v0.7.0")


@pytest.mark.parametrize(
    ("old_answers", "extras"),
    [
        ({"ema": True, "logger": "tensorboard"}, [*EVERY_PROJECT_HAD, "ema", "tensorboard"]),
        ({}, EVERY_PROJECT_HAD),
    ],
)
def test_ema_and_logger_become_extras_and_the_project_keeps_its_parts(
    extras_repo, tmp_path, old_answers, extras
):
    project = render_release(extras_repo, tmp_path / "p", "v0.6.0", **old_answers)
    assert "extras" not in (project / ".copier-answers.yml").read_text()
    assert (project / "proj/finders.py").is_file()
    train = project / "train.py"
    train.write_text(train.read_text().replace('default="runs/default"', 'default="runs/ours"'))
    commit_all(project, "our edit")

    update(project)

    assert_no_conflicts(project)
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["extras"] == extras and answers["_commit"] == "v0.7.0"
    assert "ema" not in answers and "logger" not in answers
    assert 'default="runs/ours"' in train.read_text()  # the user's edit
    assert (project / "proj/finders.py").is_file()
    assert (project / "proj/ema.py").is_file() == ("ema" in extras)
    assert ("tensorboard" in (project / "pyproject.toml").read_text()) == ("tensorboard" in extras)
