"""The tests keep compiled templates between renders (tests/conftest.py): a render from that
cache is the same, byte for byte and mode for mode, as one that compiles everything."""

from __future__ import annotations

from pathlib import Path
from types import CodeType

import jinja2

from tests import helpers
from tests.helpers import EXTRAS, render

ANSWER_SETS = [
    {},
    {"distributed": "ddp", "extras": list(EXTRAS), "optimizer": "lamb", "amp": "bf16"},
    {"data": "tensors", "extras": [], "scheduler": "onecycle", "package_name": "other_pkg"},
]


def tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {
        path.relative_to(root).as_posix(): (path.stat().st_mode, path.read_bytes())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_cached_renders_are_identical(template, tmp_path):
    # Every template of this snapshot compiled once (all extras, so every file is rendered).
    render(template, tmp_path / "warm", distributed="ddp", extras=list(EXTRAS))
    cached = {}
    for index, answers in enumerate(ANSWER_SETS):
        misses = helpers.COMPILE_STATS["misses"]
        hits = helpers.COMPILE_STATS["hits"]
        cached[index] = tree(render(template, tmp_path / f"cached{index}", **answers))
        assert helpers.COMPILE_STATS["misses"] == misses, "a template was compiled again"
        assert helpers.COMPILE_STATS["hits"] > hits + 100
    helpers.cache_compiled_templates(False)
    try:
        for index, answers in enumerate(ANSWER_SETS):
            hits = helpers.COMPILE_STATS["hits"]
            plain = tree(render(template, tmp_path / f"plain{index}", **answers))
            assert helpers.COMPILE_STATS["hits"] == hits, "the cache was still used"
            assert list(plain) == list(cached[index])
            for name, (mode, data) in plain.items():
                assert cached[index][name] == (mode, data), name
    finally:
        helpers.cache_compiled_templates(True)


def files(code: CodeType) -> set[str]:
    """The files that `code` and the functions it defines name (== leaves them out)."""
    nested = [files(const) for const in code.co_consts if isinstance(const, CodeType)]
    return {code.co_filename}.union(*nested)


def test_code_for_another_copy_is_what_compiling_gives(template, tmp_path):
    """A copy of the template elsewhere (a clone, a release) reuses the code, which then names
    the copy's own file (in tracebacks) exactly as compiling it would."""
    source = (template / "template/train.py.jinja").read_text()
    name = "template/train.py.jinja"
    env = jinja2.Environment(keep_trailing_newline=True)
    cached = []
    for root in (template, tmp_path / "copy"):
        misses = helpers.COMPILE_STATS["misses"]
        cached.append(env.compile(source, name, str(root / name)))
        assert helpers.COMPILE_STATS["misses"] == misses + (root == template)
    helpers.cache_compiled_templates(False)
    try:
        for root, code in zip((template, tmp_path / "copy"), cached, strict=True):
            plain = env.compile(source, name, str(root / name))
            assert code == plain  # the same code, constants, names and lines, all nested
            assert files(code) == files(plain) == {str(root / name)}
    finally:
        helpers.cache_compiled_templates(True)
