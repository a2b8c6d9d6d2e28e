"""Copier refuses bad answers with the validator's message and renders nothing; it derives
a valid package name from the project name; and it accepts good answers.

Everything goes through the real `copier.run_copy`, as `copier copy --defaults --data ...`
would. An unknown value for a choice question is refused by Copier itself before our
validator runs ("Invalid choice for 'amp': 'fp8' is not in ['off', 'bf16', 'fp16']"), so for
those the test checks that the message lists the allowed values.
"""

from __future__ import annotations

import ast
import keyword
import re
import subprocess
import sys
from pathlib import Path

import copier
import pytest
import yaml

from tests.helpers import AMPS, OPTIMIZERS, SCHEDULERS

IDENTIFIER = "must be a lowercase Python identifier"
RESERVED = "would shadow a Python keyword, a standard-library module or a dependency"

# (answers, the validator's message, or a part of it that names the problem)
BAD_ANSWERS = {
    "package name with a space": (
        {"package_name": "my net"},
        f"package_name {IDENTIFIER}: letters a-z, digits and underscores, starting with a "
        "letter (got 'my net')",
    ),
    "package name with a quote": ({"package_name": "my'net"}, f"{IDENTIFIER}"),
    "package name with a double quote": ({"package_name": 'my"net'}, f"{IDENTIFIER}"),
    "package name with a hyphen": ({"package_name": "my-net"}, f"{IDENTIFIER}"),
    "package name a keyword": ({"package_name": "class"}, f"package_name 'class' {RESERVED}"),
    "package name a soft keyword": ({"package_name": "match"}, f"package_name 'match' {RESERVED}"),
    "package name a stdlib module": ({"package_name": "json"}, f"package_name 'json' {RESERVED}"),
    "package name torch": ({"package_name": "torch"}, f"package_name 'torch' {RESERVED}"),
    "package name torchvision": (
        {"package_name": "torchvision"},
        f"package_name 'torchvision' {RESERVED}",
    ),
    "package name train (the script)": ({"package_name": "train"}, RESERVED),
    "package name starting with a digit": ({"package_name": "2net"}, "(got '2net')"),
    "package name uppercase": ({"package_name": "MyNet"}, "(got 'MyNet')"),
    "package name empty": ({"package_name": ""}, IDENTIFIER),
    "project name blank": ({"project_name": "   "}, "project_name must not be empty"),
    "project name padded": (
        {"project_name": " Padded"},
        "project_name must not begin or end with spaces (got ' Padded')",
    ),
    "project name on two lines": (
        {"project_name": "two\nlines"},
        "project_name must be one line, without tabs or other control characters",
    ),
    "project name with a tab": ({"project_name": "a\tb"}, "project_name must be one line"),
    "project name too long": (
        {"project_name": "n" * 81},
        "project_name must be at most 80 characters, wide ones (CJK, emoji) counting 2 (got 81)",
    ),
    "project name too wide": (
        {"project_name": "名" * 41},
        "project_name must be at most 80 characters, wide ones (CJK, emoji) counting 2 (got 82)",
    ),
    "description on two lines": (
        {"description": "one\r\ntwo"},
        "description must be one line, without tabs or other control characters",
    ),
    "description too long": (
        {"description": "d " * 151},
        "description must be at most 300 characters (got 302)",
    ),
    "device_data without images": (
        {"extras": ["device_data"], "data": "tensors"},
        "the extra device_data keeps image sets on the GPU and needs data: images",
    ),
    "package name too long": (
        {"package_name": "p" * 41},
        "package_name must be at most 40 characters (got 41)",
    ),
    "package name __future__": ({"package_name": "__future__"}, "starting with a letter"),
    "package name _private": ({"package_name": "_ssl"}, "starting with a letter"),
    "package name of a torch dependency": ({"package_name": "typing_extensions"}, RESERVED),
    "package name of a test tool": ({"package_name": "pytest"}, RESERVED),
    "package name pil (PIL on a case-blind file system)": ({"package_name": "pil"}, RESERVED),
    "package name pip (python -m pip)": (
        {"package_name": "pip"},
        f"package_name 'pip' {RESERVED}; choose another name",
    ),
    "package name of the lr plot's package": ({"package_name": "matplotlib"}, RESERVED),
    "workers negative": (
        {"workers": -1},
        "workers must be an integer >= 0 (got -1)",
    ),
    "batch_size 0": ({"batch_size": 0}, "batch_size must be an integer >= 1 (got 0)"),
    "epochs 0": ({"epochs": 0}, "epochs must be an integer >= 1 (got 0)"),
    "lr 0": ({"lr": 0.0}, "lr must be a number > 0 and <= 100 (got 0.0)"),
    "lr negative": ({"lr": -0.1}, "lr must be a number > 0 and <= 100 (got -0.1)"),
    "lr too large": ({"lr": 101.0}, "lr must be a number > 0 and <= 100 (got 101.0)"),
    "lr nan": ({"lr": float("nan")}, "lr must be a number > 0 and <= 100 (got nan)"),
    "lr infinite": ({"lr": float("inf")}, "lr must be a number > 0 and <= 100 (got inf)"),
    "lr 0 as a float32": (
        {"lr": 1e-50},
        "lr must be at least 1e-45: a float32 holds a smaller one as 0 (got 1e-50)",
    ),
    "label_smoothing nan": (
        {"label_smoothing": float("nan")},
        "label_smoothing must be a number >= 0 and < 1 (got nan)",
    ),
    "label_smoothing 1": (
        {"label_smoothing": 1.0},
        "label_smoothing must be a number >= 0 and < 1 (got 1.0)",
    ),
    "label_smoothing negative": (
        {"label_smoothing": -0.1},
        "label_smoothing must be a number >= 0 and < 1 (got -0.1)",
    ),
}
# What FSDP does not make right (yet): refused in one line that says why. The question
# named first is the one refused (the later of the two asked).
FSDP_REFUSED = {
    "fp16": (
        {"amp": "fp16"},
        "amp fp16 with distributed fsdp is not supported: its loss scaling would need a "
        "GradScaler over sharded gradients; choose bf16, which needs none",
    ),
    "compile": (
        {"compile": True},
        "compile with distributed fsdp is not supported yet: compiling a sharded model is "
        "not tested here; answer false",
    ),
    "channels_last": (
        {"channels_last": True},
        "channels_last with distributed fsdp is not supported: FSDP shards only contiguous "
        "weights; answer false",
    ),
    "ema and guard": (
        {"extras": ["preemption", "ema", "guard"]},
        "extras guard, ema with distributed fsdp: not supported yet, not made and tested "
        "under sharding; leave them out (preemption and tensorboard work with fsdp)",
    ),
    "finders": ({"extras": ["finders"]}, "extras finders with distributed fsdp: not supported"),
    "device_data": (
        {"extras": ["device_data"]},
        "extras device_data with distributed fsdp: not supported",
    ),
    "speed_report": (
        {"extras": ["speed_report"]},
        "extras speed_report with distributed fsdp: not supported",
    ),
}
for case, (answers, message) in FSDP_REFUSED.items():
    BAD_ANSWERS[f"fsdp with {case}"] = ({**answers, "distributed": "fsdp"}, message)
# Answers to yes/no questions: a spelling that Copier reads as a boolean, or refused.
for question, text in [
    ("compile", "maybe"),
    ("compile", ""),
    ("compile", "2"),
    ("compile", "none"),
    ("channels_last", "maybe"),
    ("git_init", "perhaps"),
]:
    BAD_ANSWERS[f"{question} {text!r}"] = (
        {question: text},
        f"{question} must be true or false (got '{text}')",
    )
# Not questions: the template derives them, and an answer given for one is refused.
DERIVED = {
    "images": "the answer to data",
    "ddp": "the answer to distributed",
    "fsdp": "the answer to distributed",
    "torchrun": "the answer to distributed",
    "finders": "the answer to extras",
    "ema": "the answer to extras",
    "tensorboard": "the answer to extras",
    "preemption": "the answer to extras",
    "device_data": "the answers to extras and data",
    "guard": "the answer to extras",
    "speed_report": "the answer to extras",
}
for question, source in DERIVED.items():
    BAD_ANSWERS[f"{question} given"] = (
        {question: True},
        f"{question} is not a question: it follows from {source}",
    )
for question in ("reserved_package_names", "project_folders"):
    BAD_ANSWERS[f"{question} given"] = (
        {question: ""},
        f"{question} is the template's own list, not an answer",
    )

CHOICES = {
    "data": ("images", "tensors"),
    "amp": AMPS,
    "optimizer": OPTIMIZERS,
    "scheduler": SCHEDULERS,
    "distributed": ("single", "ddp", "fsdp"),
}
EXTRAS = ("finders", "ema", "tensorboard")


def copy(template: Path, dest: Path, **answers) -> Path:
    copier.run_copy(str(template), dest, data=answers, defaults=True, unsafe=True, quiet=True)
    return dest


def assert_nothing_rendered(dest: Path) -> None:
    assert not dest.exists() or not any(dest.iterdir()), (
        f"a refused answer left files behind: {sorted(p.name for p in dest.iterdir())}"
    )


def recorded_answers(dest: Path) -> dict:
    return yaml.safe_load((dest / ".copier-answers.yml").read_text())


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
def test_bad_answer_is_refused_with_its_message(template, tmp_path, case):
    answers, message = BAD_ANSWERS[case]
    dest = tmp_path / "project"
    with pytest.raises(ValueError) as refused:
        copy(template, dest, **answers)
    question = next(iter(answers))
    assert f"Validation error for question '{question}'" in str(refused.value)
    assert message in str(refused.value)
    assert_nothing_rendered(dest)


def test_refusal_leaves_an_existing_destination_as_it_was(template, tmp_path):
    dest = tmp_path / "project"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match="Validation error for question 'epochs'"):
        copy(template, dest, epochs=0)
    assert sorted(p.name for p in dest.iterdir()) == ["notes.txt"]
    assert (dest / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("question", list(CHOICES))
def test_unknown_choice_is_refused_naming_the_allowed_values(template, tmp_path, question):
    dest = tmp_path / "project"
    with pytest.raises(ValueError) as refused:
        copy(template, dest, **{question: "bogus"})
    message = str(refused.value)
    assert question in message and "'bogus'" in message
    for allowed in CHOICES[question]:
        assert repr(allowed) in message, f"{allowed!r} missing from {message!r}"
    assert_nothing_rendered(dest)


def test_choice_lists_match_the_validators():
    """Each choice question's validator names the same values as its choices (the validator
    is what a non-Copier front end, or a changed choice list, would fall back on)."""
    questions = yaml.safe_load((Path(__file__).resolve().parents[1] / "copier.yml").read_text())
    for question, allowed in CHOICES.items():
        spec = questions[question]
        assert tuple(spec["choices"].values()) == allowed, question
        assert f"{question} must be one of: {', '.join(allowed)}" in spec["validator"], question


@pytest.mark.parametrize(
    ("project_name", "package_name"),
    [
        ("My Cool Net!", "my_cool_net"),
        ("Image--Classifier  2", "image_classifier_2"),
        ("3D Segmenter", "p_3d_segmenter"),
        ("!!!", "trainer"),
    ],
)
def test_default_package_name_comes_from_the_project_name(
    template, tmp_path, project_name, package_name
):
    dest = copy(template, tmp_path / "project", project_name=project_name)
    assert recorded_answers(dest)["package_name"] == package_name
    assert package_name.isidentifier() and not keyword.iskeyword(package_name)
    assert re.fullmatch("[a-z_][a-z0-9_]*", package_name)
    assert (dest / package_name / "__init__.py").is_file()
    assert f"from {package_name}.models import" in (dest / "train.py").read_text()


@pytest.mark.parametrize(
    ("data", "name", "description"),
    [
        ("images", "Image Classifier", "Image classification trained with PyTorch"),
        ("tensors", "Classifier", "Classification of your own tensors, trained with PyTorch"),
    ],
)
def test_the_default_name_and_description_follow_the_data(
    template, tmp_path, data, name, description
):
    """A project of your own tensors is not called an image classifier by default."""
    dest = copy(template, tmp_path / "project", data=data, extras=[])
    answers = recorded_answers(dest)
    assert (answers["project_name"], answers["description"]) == (name, description)
    assert (dest / "train.py").read_text().startswith(f'"""Train {name}.\n\n{description}\n')


def test_good_answers_are_accepted(template, tmp_path):
    answers = {
        "project_name": "Edge Cases",
        "package_name": "edge_2_",
        "description": 'A "quoted" description',
        "amp": "fp16",
        "optimizer": "lamb",
        "scheduler": "cyclic",
        "distributed": "single",
        "workers": 0,
        "batch_size": 1,
        "epochs": 1,
        "lr": 100.0,
        "label_smoothing": 0.0,
        "compile": True,
        "channels_last": True,
        "extras": ["ema", "tensorboard"],
    }
    dest = copy(template, tmp_path / "project", **answers)
    recorded = recorded_answers(dest)
    for question, answer in answers.items():
        assert recorded[question] == answer, question
    assert (dest / "edge_2_" / "lamb.py").is_file()
    assert (dest / "edge_2_" / "ema.py").is_file()
    assert not (dest / "edge_2_" / "finders.py").exists()
    train_py = (dest / "train.py").read_text()
    for flag_default in ("default=0,", "default=1,", "default=100.0,", "default=True,"):
        assert flag_default in train_py, flag_default


def test_help_gives_each_flags_default_the_answers(template, tmp_path):
    """train.py --help shows every flag's default, and those of the questions are the
    answers given."""
    answers = {"workers": 3, "epochs": 7, "lr": 0.03, "label_smoothing": 0.1, "batch_size": 48}
    dest = copy(template, tmp_path / "project", extras=[], **answers)
    out = subprocess.run(
        [sys.executable, "train.py", "--help"], cwd=dest, capture_output=True, text=True, check=True
    ).stdout
    flat = " ".join(out.split())
    for flag, value in answers.items():
        name = flag.replace("_", "-")
        assert re.search(rf"--{name} {flag.upper()} [^-]*\(default: {value}\)", flat), flag
    assert "--seed SEED random seed (default: 0)" in flat


@pytest.mark.parametrize(("given", "value"), [("yes", True), ("False", False), (1, True)])
def test_yes_no_answers_take_the_spellings_of_a_boolean(template, tmp_path, given, value):
    dest = copy(template, tmp_path / "project", compile=given)
    assert recorded_answers(dest)["compile"] is value
    train_py = (dest / "train.py").read_text()
    assert f'"--compile", action=argparse.BooleanOptionalAction, default={value},' in train_py


def test_just_inside_the_bounds_is_accepted(template, tmp_path):
    dest = copy(template, tmp_path / "project", lr=1e-6, label_smoothing=0.999, workers=0)
    recorded = recorded_answers(dest)
    assert recorded["lr"] == 1e-6
    assert recorded["label_smoothing"] == 0.999
    assert recorded["workers"] == 0


def test_an_unknown_extra_is_refused_naming_the_allowed_ones(template, tmp_path):
    dest = tmp_path / "project"
    with pytest.raises(ValueError) as refused:
        copy(template, dest, extras=["ema", "wandb"])
    message = str(refused.value)
    assert "Invalid choice for 'extras'" in message and "'wandb'" in message
    for allowed in EXTRAS:
        assert repr(allowed) in message
    assert_nothing_rendered(dest)


@pytest.mark.parametrize("extras", [[], ["finders"], list(EXTRAS)])
def test_extras_are_recorded_and_rendered(template, tmp_path, extras):
    dest = copy(template, tmp_path / "project", package_name="proj", extras=extras)
    assert recorded_answers(dest)["extras"] == extras
    for extra, path in (("finders", "proj/finders.py"), ("ema", "proj/ema.py")):
        assert (dest / path).is_file() == (extra in extras), path
    pyproject = (dest / "pyproject.toml").read_text()
    assert ("tensorboard" in pyproject) == ("tensorboard" in extras)


@pytest.mark.parametrize(("data", "extras"), [("images", []), ("tensors", ["tensorboard"])])
def test_the_readme_installs_what_pyproject_requires(template, tmp_path, data, extras):
    """The README's `pip install` of "just the dependencies" names each of pyproject.toml's,
    and nothing else."""
    dest = copy(template, tmp_path / "project", data=data, extras=extras)
    block = (dest / "pyproject.toml").read_text().split("dependencies = [", 1)[1].split("]")[0]
    required = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, flags=re.M)
    installed = re.findall(r"^pip install (torch .*)$", (dest / "README.md").read_text(), re.M)
    assert len(installed) == 1 and sorted(installed[0].split()) == sorted(required)


def test_the_default_extras_are_preemption_alone(template, tmp_path):
    dest = copy(template, tmp_path / "project")
    assert recorded_answers(dest)["extras"] == ["preemption"]


# Text answers that Python or TOML would read as something else if pasted as they are.
HOSTILE_TEXT = {
    "windows path": r"C:\Users\xavier\new\bin",
    "triple quotes": 'say """hello""" twice',
    "closes the docstring": '"""; import os; os.system("echo pwned"); x = """',
    "ends in a backslash": "ends in a backslash \\",
    "both quotes": 'it\'s "quoted"',
    "unicode": "Ünïcødé 中文 🚀",
    "longest name": "n" * 80,
    "longest description": "word " * 59 + "word",
    # Wide characters take 2 columns, as ruff counts a line: wrapped by width, not length.
    "widest name": "中" * 40,
    "chinese description": "使用 PyTorch 训练的图像分类项目，支持多种数据集和模型，包括卷积神经网络"
    * 4,
    "words joined by no-break spaces": "\u00a0".join(["word"] * 59),
}


@pytest.mark.parametrize("text", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
def test_text_answers_render_as_typed_into_valid_python_and_toml(template, tmp_path, text):
    tomllib = pytest.importorskip("tomllib", reason="reading TOML needs Python 3.11")
    name = (text[:80] if text.isascii() else text[:40]).strip()  # 80 columns, no end spaces
    dest = copy(template, tmp_path / "p", package_name="proj", project_name=name, description=text)
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", dest], text=True)
    assert lint.returncode == 0
    docstring = ast.get_docstring(ast.parse((dest / "train.py").read_text()))
    title, _, rest = docstring.partition("\n\n")
    assert title == f"Train {name}."
    paragraph = rest.split("\n\n")[0]  # lines are broken at spaces, or in a word too long
    assert "".join(paragraph.split()) == "".join(text.split())
    package = ast.get_docstring(ast.parse((dest / "proj/__init__.py").read_text()))
    assert package.startswith(f"{name}.\n")
    project = tomllib.loads((dest / "pyproject.toml").read_text())["project"]
    assert project["description"] == text


def top_level_modules(distribution: str, seen: set[str]) -> set[str]:
    """The top-level modules of a distribution and of everything it requires (markers and
    extras left out), as installed here."""
    from importlib import metadata

    key = distribution.lower().replace("_", "-")
    if key in seen:
        return set()
    seen.add(key)
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        return set()
    names = set()
    for path in dist.files or []:
        top = path.parts[0]
        if top.endswith((".dist-info", ".data")) or top in ("..", "bin"):
            continue
        names.add(top.removesuffix(".py").split(".")[0])
    for requirement in dist.requires or []:
        if "extra ==" not in requirement:
            name = re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0]
            names |= top_level_modules(name, seen)
    return names


def test_reserved_names_cover_what_a_project_imports():
    """Every name a package could take (a lowercase identifier) that the standard library or
    the project's dependencies, with theirs, install as a top-level module here is refused:
    the hand-kept list in copier.yml is checked against the real environment."""
    questions = yaml.safe_load((Path(__file__).resolve().parents[1] / "copier.yml").read_text())
    reserved = set(questions["reserved_package_names"]["default"].split())
    seen: set[str] = set()
    installed = set(sys.stdlib_module_names)
    # What the project installs, and the tools it runs with `python -m` (pip, pre-commit).
    tools = ("pytest", "ruff", "pre-commit", "pip")
    for distribution in ("torch", "torchvision", "tqdm", "tensorboard", *tools):
        installed |= top_level_modules(distribution, seen)
    # Lowercased: on a file system blind to case, a package `pil` shadows `PIL`. Names that
    # start with an underscore are refused as a class.
    possible = {name.lower() for name in installed if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name)}
    missing = sorted(possible - reserved)
    assert not missing, f"add to reserved_package_names in copier.yml: {' '.join(missing)}"
