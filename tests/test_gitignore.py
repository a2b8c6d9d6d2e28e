"""No answer renders a project whose own code git ignores (the package would then be missing
from the first commit, and `copier update` could overwrite a user's edit with no way back),
and the ignore rules name train.py's outputs where they really go."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import git, render, run

# The folders the project uses for itself: refused as package names.
PROJECT_FOLDERS = ("data", "runs", "build", "dist", "scripts", "tests")
# Names near those, which are fine and must be committed whole.
NEAR_NAMES = ("dataset", "my_data", "runs_v2", "distill", "data_", "datasets_")


@pytest.mark.parametrize("name", PROJECT_FOLDERS)
def test_a_package_named_after_a_project_folder_is_refused(template, tmp_path, name):
    dest = tmp_path / "project"
    with pytest.raises(ValueError) as refused:
        render(template, dest, package_name=name)
    message = str(refused.value)
    assert "Validation error for question 'package_name'" in message
    assert f"package_name '{name}' is a folder the project uses" in message
    assert "data, runs, build, dist, scripts, tests" in message
    assert not dest.exists() or not any(dest.iterdir())


def ignored_files(project) -> list[str]:
    git(project, "init", "-q")
    listed = git(project, "ls-files", "--others", "--ignored", "--exclude-standard")
    return listed.splitlines()


@pytest.mark.parametrize("name", NEAR_NAMES)
def test_git_ignores_no_rendered_file(template, tmp_path, name):
    distributed = "ddp" if name == "my_data" else "single"  # ddp renders scripts/ too
    project = render(template, tmp_path / "p", package_name=name, distributed=distributed)
    assert ignored_files(project) == []
    package_files = {p.name for p in (project / name).glob("*.py")}
    assert {"__init__.py", "models.py", "data.py"} <= package_files


def test_outputs_are_ignored_where_train_py_writes_them_and_nowhere_else(template, tmp_path):
    project = render(template, tmp_path / "p")
    outputs = ["runs/default/last.pt", "data/cifar-10-batches-py/data_batch_1", ".venv/pyvenv.cfg"]
    code = ["proj/data/loader.py", "proj/runs/report.py", "tests/data/sample.txt"]
    for path in outputs + code:
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text("x\n")
    ignored = ignored_files(project)
    for path in outputs:
        assert any(path.startswith(entry.rstrip("/")) for entry in ignored), (path, ignored)
    for path in code:
        assert not any(path.startswith(entry.rstrip("/")) for entry in ignored), (path, ignored)


def test_the_conflict_check_looks_inside_nested_folders_named_like_outputs(template, tmp_path):
    project = render(template, tmp_path / "p")
    marker = "<" * 7 + " HEAD\n"
    (project / "proj" / "data").mkdir()
    (project / "proj" / "data" / "loader.py").write_text(marker)
    (project / "runs").mkdir()
    (project / "runs" / "notes.txt").write_text(marker)  # an output: not checked
    result = run(sys.executable, "tests/test_no_conflicts.py", cwd=project, check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == "proj/data/loader.py: unresolved merge conflict"
