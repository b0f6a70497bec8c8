"""rank-probes: the order of candidate models by their probe reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from a2d_convert.__main__ import main
from a2d_convert.errors import A2DError
from a2d_convert.probes import rank_reports


def report(folder: Path, accuracy: float, vs_base: float, tpf: float, threshold: float = 0.7, aup: float | None = None) -> Path:
    folder.mkdir(parents=True)
    rows = {str(threshold): {"accuracy": accuracy, "accuracy_vs_base": vs_base, "tokens_per_forward": tpf},
            "0.9": {"accuracy": 0.99, "accuracy_vs_base": 1.0, "tokens_per_forward": 9.0}}  # not the recommended row
    extra = {} if aup is None else {"aup": {"value": aup}}
    (folder / "probes.json").write_text(json.dumps({"model": rows, "recommended": {"threshold": threshold}, **extra}))
    return folder / "probes.json"


def test_the_goal_first_then_accuracy_then_tokens_per_forward(tmp_path):
    accurate = report(tmp_path / "accurate", 0.30, 0.85, 1.1)
    fast = report(tmp_path / "fast", 0.20, 0.9, 2.5)  # meets >= 90 % of the base at >= 2 tokens/forward
    tie_slow = report(tmp_path / "tie_slow", 0.30, 0.85, 1.0, aup=1.4)
    ranked = rank_reports([accurate, tie_slow, fast])
    assert [Path(r["path"]).parent.name for r in ranked] == ["fast", "accurate", "tie_slow"]
    assert ranked[0]["meets_goal"] and not ranked[1]["meets_goal"]
    assert ranked[2]["aup"] == 1.4 and ranked[0]["aup"] is None


def test_the_command_prints_the_best_path_and_refuses_a_diagnostic(tmp_path, capsys):
    a = report(tmp_path / "a", 0.1, 0.3, 1.0)
    b = report(tmp_path / "b", 0.2, 0.6, 1.0)
    assert main(["rank-probes", str(a), str(b), "--out", str(tmp_path / "ranking.json")]) == 0
    assert capsys.readouterr().out.strip() == str(b)
    assert [r["path"] for r in json.loads((tmp_path / "ranking.json").read_text())] == [str(b), str(a)]
    diagnostic = tmp_path / "d" / "probes.json"
    diagnostic.parent.mkdir()
    diagnostic.write_text(json.dumps({"model": {"1.0": {"accuracy": 0.5, "tokens_per_forward": 1.0}}, "diagnostic": "block size 1"}))
    with pytest.raises(A2DError, match="cannot be ranked"):
        rank_reports([diagnostic])
    assert main(["rank-probes", str(diagnostic)]) == 2
