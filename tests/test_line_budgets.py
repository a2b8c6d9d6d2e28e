"""The rendered projects' size in lines (bench/line_counts.py): printed, and held to the
ceilings there, so that a change that adds lines to what every user owns is noticed."""

from __future__ import annotations

import importlib.util

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("line_counts", ROOT / "bench/line_counts.py")
line_counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(line_counts)


def test_line_counts_stay_within_their_ceilings(template, capsys):
    counts = line_counts.measure(template)
    with capsys.disabled():
        print("\n" + line_counts.table(counts))
    for name, lines in counts.items():
        total, train = line_counts.CEILINGS[name]
        assert sum(lines.values()) <= total, (name, lines)
        assert train is None or lines["train.py"] <= train, (name, lines)
        budget = line_counts.BUDGETS[name][0]
        assert sum(lines.values()) > budget or total == budget, (
            f"{name} is within its budget of {budget} lines now: lower its ceiling to it"
        )
