"""The probe report's noise figures: a Wilson interval per accuracy and an exact sign test against the base."""

from __future__ import annotations

import json
import math

import pytest

from a2d_convert.probes import evaluate_probes, generated_probes, sign_test, wilson_interval


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10) == pytest.approx([0.0, 0.27754], abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx([0.23659, 0.76341], abs=1e-5)
    assert wilson_interval(18, 56) == pytest.approx([0.21401, 0.45178], abs=1e-5)  # the base on the 56 built-in probes
    assert wilson_interval(0, 0) == [0.0, 1.0]


def test_sign_test_known_values():
    assert sign_test(0, 6) == pytest.approx(2 / 64)  # all six discordant probes on one side
    assert sign_test(6, 0) == sign_test(0, 6)
    assert sign_test(3, 3) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(2, 10) == pytest.approx(2 * (1 + 12 + 66) / 4096)


def test_report_counts_match_the_accuracies(tiny_models, tmp_path):
    base, model = tiny_models("llama")
    probes = generated_probes(2, seed=4)
    details = tmp_path / "details.jsonl"
    report = evaluate_probes(model, base, probes, [0.9, 0.3], max_tokens=10, tolerance=0.0, batch_size=9, details=details)
    rows = [json.loads(line) for line in details.read_text().splitlines()]
    for kind, summary in [("base", report["base"]), *((f"model@{t}", r) for t, r in report["model"].items())]:
        answers = [r for r in rows if r["kind"] == kind]
        assert len(answers) == len(probes)
        assert summary["tokens_per_answer"] == pytest.approx(sum(r["tokens"] for r in answers) / len(answers))
        assert summary["tokens_per_forward"] == pytest.approx(sum(r["tokens"] for r in answers) / sum(r["forward_passes"] for r in answers))
    n = len(probes)
    base_acc = report["base"]["accuracy"]
    assert report["base"]["accuracy_ci95"] == wilson_interval(round(base_acc * n), n)
    for row in report["model"].values():
        lo, hi = row["accuracy_ci95"]
        assert lo <= row["accuracy"] <= hi
        vs = row["vs_base"]
        assert vs["only_model_right"] - vs["only_base_right"] == round((row["accuracy"] - base_acc) * n)
        assert vs["sign_test_p"] == sign_test(vs["only_model_right"], vs["only_base_right"])


def test_accuracy_under_parallelism_rewards_speed_only_where_accuracy_holds():
    from a2d_convert.probes import accuracy_under_parallelism

    # At the reference's accuracy everywhere: the area is the most parallel point's tokens/forward.
    assert accuracy_under_parallelism([(1.0, 0.4), (2.0, 0.4), (3.0, 0.4)], 0.4) == pytest.approx(3.0)
    # Accuracy halving at 3 tokens/forward: that last step adds its width times (1 + 0.5 e^-1.5) / 2.
    half = accuracy_under_parallelism([(1.0, 0.4), (2.0, 0.4), (3.0, 0.2)], 0.4)
    assert half == pytest.approx(2.0 + (1 + 0.5 * math.exp(-1.5)) / 2)
    # Above the reference counts as the reference; order of the points does not matter.
    assert accuracy_under_parallelism([(2.0, 0.5), (1.0, 0.5)], 0.4) == pytest.approx(2.0)
    assert accuracy_under_parallelism([], 0.4) == 0.0 and accuracy_under_parallelism([(1.0, 0.3)], 0.0) == 0.0
