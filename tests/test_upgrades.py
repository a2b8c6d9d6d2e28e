"""The upgrade matrix: every release in the README's changes list, updated to this template.

For each release whose commit the list records (README.md, "Changes by release"), a project
rendered at that release, with the defaults and with a DDP answer set, gets the edits users
make (a model of their own in MODELS, a data set of their own, a changed loss, a flag of
their own, a README paragraph) and a checkpoint written by that release's train.py; it is
committed, then updated with the real `copier update` to this working tree. Then the edits
are all there, or the update lists its conflicts and fails; the project's own tests pass;
and the old checkpoint resumes, or is refused in one line (never for its format: the releases
listed write the format this one reads).

The template's history comes from this repository (CI runs a full clone; clones carry no
tags, so each release is tagged here from its recorded commit) or from the repository that
TEMPLATE_HISTORY names (tests/mutants.py runs the tests in a copy without history). This
working tree, uncommitted changes included, is committed on top as the newest release.

`make upgrades` runs every release (UPGRADES=all); `make test` runs the oldest release
with the defaults and the newest with the DDP answer set.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import copier
import pytest
import yaml

from tests.helpers import (
    GIT_ENV,
    ROOT,
    TINY_RUN,
    assert_no_conflicts,
    commit_all,
    git,
    read_metrics,
    run,
    snapshot_template,
    train,
)

# Above every release and every migration's version: this working tree as the next release.
HEAD_VERSION = "v999.0.0"
ANSWER_SETS = {
    "defaults": {},
    "ddp": {"distributed": "ddp", "optimizer": "adamw", "extras": ["preemption", "ema"]},
}


def releases() -> list[tuple[str, str]]:
    """(version, commit) of each release in the README's changes list that records its
    commit, oldest first."""
    changes = (ROOT / "README.md").read_text().split("Changes by release:", 1)[1]
    found = re.findall(r"^- (v\d+\.\d+\.\d+) \(commit ([0-9a-f]{7,40})\)", changes, re.MULTILINE)
    return sorted(found, key=lambda item: tuple(map(int, item[0][1:].split("."))))


def cases() -> list:
    every = releases()
    assert len(every) >= 2, "the README's changes list records fewer than two release commits"
    if os.environ.get("UPGRADES") == "all":
        chosen = [(release, name) for release in every for name in ANSWER_SETS]
    else:
        chosen = [(every[0], "defaults"), (every[-1], "ddp")]
    return [pytest.param(*case, id=f"{case[0][0]}-{case[1]}") for case in chosen]


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A clone of the template's repository with every release tagged, and this working
    tree committed on top as HEAD_VERSION."""
    source = Path(os.environ.get("TEMPLATE_HISTORY", ROOT))
    repo = tmp_path_factory.mktemp("history") / "repo"
    cloned = run("git", "clone", "-q", source, repo, check=False, env=GIT_ENV)
    assert cloned.returncode == 0, (
        f"the upgrade matrix needs the template's git history: {source} is not a git "
        f"repository (set TEMPLATE_HISTORY to one): {cloned.stderr.strip()}"
    )
    for version, commit in releases():
        found = run(
            "git", "rev-parse", "--verify", "-q", f"{commit}^{{commit}}", cwd=repo, check=False
        )
        assert found.returncode == 0, (
            f"{version}'s commit {commit} is not in {source} (a shallow clone? git fetch "
            "--unshallow)"
        )
        git(repo, "tag", "-f", version, commit)
    for folder in ("template", "hooks"):
        shutil.rmtree(repo / folder, ignore_errors=True)
    snapshot_template(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "this working tree")  # as it is, or HEAD
    git(repo, "tag", "-f", HEAD_VERSION)
    return repo


def render_release(repo: Path, dest: Path, version: str, answers: dict) -> Path:
    """Render `version` with `answers`, those of its questions that it has."""
    questions = yaml.safe_load(git(repo, "show", f"{version}:copier.yml"))
    data = {key: value for key, value in answers.items() if key in questions}
    copier.run_copy(
        str(repo), dest, data=data, defaults=True, unsafe=True, quiet=True, vcs_ref=version
    )
    git(dest, "init", "-q", "-b", "main")
    commit_all(dest, "rendered")
    return dest


def insert(path: Path, anchor: str, lines: str, after: bool = True) -> None:
    """Put `lines` after (or before) the first line that matches the regex `anchor`."""
    text = path.read_text()
    found = re.search(anchor, text, re.MULTILINE)
    assert found, f"{path.name} has no line matching {anchor!r}"
    at = text.index("\n", found.end()) + 1 if after else found.start()
    path.write_text(text[:at] + lines + text[at:])


OWN_DATA = """\
    elif args.data == "noise":  # our own data set
        seeded = torch.Generator().manual_seed(0)
        inputs = torch.rand(64, 3, 32, 32, generator=seeded)
        targets = torch.randint(0, 10, (64,), generator=seeded)
        train_set = torch.utils.data.TensorDataset(inputs, targets)
        val_set, info = train_set, DataInfo(10, (3, 32, 32))
"""
OWN_MODEL = '''

def our_linear(info) -> nn.Module:
    """Our own model: a linear classifier."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), info.num_classes))
'''
OUR_README = "\n## Our notes\n\nOur own paragraph about this project.\n"


def users_edits(project: Path) -> dict[str, list[str]]:
    """The edits, committed; for each file, texts that show them."""
    package = yaml.safe_load((project / ".copier-answers.yml").read_text())["package_name"]
    models, data = project / package / "models.py", project / package / "data.py"
    insert(
        models,
        r"^MODELS\b.*\{$",
        '    "our_linear": lambda info: our_linear(info),  # our own model\n',
    )
    models.write_text(models.read_text() + OWN_MODEL)
    assert "\nDATASETS = (" in data.read_text(), "data.py has no DATASETS"
    data.write_text(data.read_text().replace("\nDATASETS = (", '\nDATASETS = ("noise", ', 1))
    insert(data, r"^    elif args\.data == ", OWN_DATA, after=False)
    train_py = project / "train.py"
    text = train_py.read_text()
    loss = re.search(r"^def compute_loss\(.*?^    return (.*)$", text, re.MULTILINE | re.DOTALL)
    assert loss, "train.py has no compute_loss returning its loss"
    text = f"{text[: loss.start(1)]}0.5 * {loss.group(1)}  # our loss{text[loss.end(1) :]}"
    train_py.write_text(text)
    flag = re.search(r'^([ \t]+)([\w.]+)\("--epochs"', text, re.MULTILINE)
    assert flag, "train.py has no --epochs flag"
    own_flag = f'{flag.group(1)}{flag.group(2)}("--our-note", default="", help="our own flag")\n'
    insert(train_py, r'^[ \t]+[\w.]+\("--epochs"', own_flag)
    (project / "README.md").write_text((project / "README.md").read_text() + OUR_README)
    commit_all(project, "our edits")
    return {
        f"{package}/models.py": [
            '"our_linear": lambda info: our_linear(info),',
            "def our_linear(info)",
        ],
        f"{package}/data.py": ['DATASETS = ("noise", ', 'elif args.data == "noise":'],
        "train.py": ["# our loss", '"--our-note", default=""'],
        "README.md": ["Our own paragraph about this project."],
    }


RUN = [*TINY_RUN[: TINY_RUN.index("--epochs")], "--workers", "0", "--data", "noise"]
RUN += ["--model", "our_linear"]


@pytest.mark.slow
@pytest.mark.parametrize(("release", "answer_set"), cases())
def test_a_project_of_an_old_release_updates_to_this_one(
    history, tmp_path, capfd, release, answer_set
):
    version, _ = release
    project = render_release(history, tmp_path / "project", version, ANSWER_SETS[answer_set])
    edits = users_edits(project)
    # A run of the old release, on the user's data and model; its outputs are not in git.
    rows = train(project, *RUN, "--epochs", "1")
    assert [row["epoch"] for row in rows] == [1]
    assert git(project, "status", "--porcelain") == ""

    copier_cli = Path(sys.executable).with_name("copier")
    env = {**GIT_ENV, "HOME": str(tmp_path)}
    updated = run(copier_cli, "update", "--trust", "--defaults", cwd=project, env=env, check=False)
    output = updated.stdout + updated.stderr
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    assert answers["_commit"] == HEAD_VERSION, output
    if updated.returncode != 0:
        # Allowed: the edits met the template's changes. Each edit is whole, or its file
        # has conflict markers and the update named it.
        assert "copier update left the conflicts listed above" in output, output
        for path, texts in edits.items():
            text = (project / path).read_text()
            marked = "<" * 7 + " " in text and path in output
            assert all(t in text for t in texts) or marked, f"{path} lost an edit: {output}"
        named = " / ".join(output.strip().splitlines()[-3:])
        pytest.skip(f"{version} {answer_set}: the update named conflicts, as allowed: {named}")
    assert_no_conflicts(project)
    for path, texts in edits.items():
        text = (project / path).read_text()
        for t in texts:
            assert t in text, f"{path} lost {t!r}"

    tests = run(sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", cwd=project)
    assert " passed" in tests.stdout and "failed" not in tests.stdout

    # The old release's checkpoint: resumed to the second epoch, or refused in one line.
    capfd.readouterr()
    try:
        rows = train(project, *RUN, "--epochs", "2", "--our-note", "x")
    except SystemExit as refused:
        assert refused.code not in (0, None)
        said = refused.code if isinstance(refused.code, str) else capfd.readouterr().err
        assert len(said.strip().splitlines()) == 1, said  # not argparse's usage, no traceback
        assert "v0.6.0 or earlier" not in said, said  # these releases write this format
        rows = train(project, *RUN, "--epochs", "2", "--our-note", "x", "--fresh")
        assert [row["epoch"] for row in rows][-1] == 2
    else:
        assert [row["epoch"] for row in rows] == [1, 2]
    assert read_metrics(project / "runs" / "test")[-1]["epoch"] == 2
