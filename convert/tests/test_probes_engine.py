"""evaluate-probes --engine cpu (the C++ engine through `a2d generate-batch`) against --engine reference.

Needs the built CLI and CPU addon (`npm run build`; `npm test` builds them first)."""

from __future__ import annotations

import json

import pytest

from a2d_convert.errors import A2DError
from a2d_convert.probes import engine_answers, evaluate_probes, generated_probes


def test_cpu_engine_answers_every_probe_as_the_reference_does(tiny_models, tmp_path):
    base, model = tiny_models("llama")
    probes = generated_probes(1, seed=5)
    reports, details = {}, {}
    for engine in ("reference", "cpu"):
        details[engine] = tmp_path / f"{engine}.jsonl"
        reports[engine] = evaluate_probes(model, base, probes, [0.9, 0.4], max_tokens=12, tolerance=0.0, details=details[engine], engine=engine)
    rows = {engine: [json.loads(line) for line in path.read_text().splitlines()] for engine, path in details.items()}
    assert len(rows["cpu"]) == 3 * len(probes)
    # Same text, extracted answer, token count and forward passes for every probe at every threshold.
    assert rows["cpu"] == rows["reference"]
    assert reports["cpu"] == reports["reference"]
    # Both thresholds decoded (not one answer set reused): the lower one reveals more per forward.
    assert reports["cpu"]["model"]["0.4"]["tokens_per_forward"] > reports["cpu"]["model"]["0.9"]["tokens_per_forward"]


def test_cpu_engine_names_the_build_when_the_cli_is_missing(llama_model, tmp_path):
    with pytest.raises(A2DError, match=r"main\.js is missing.*`npm run build`"):
        engine_answers(llama_model, 1, [[1, 2]], [], cli=tmp_path / "dist" / "cli" / "main.js")


def test_cpu_engine_names_the_build_when_the_addon_is_missing(llama_model, tmp_path, monkeypatch):
    from a2d_convert.decoding import DecodeParams

    monkeypatch.setenv("A2D_ADDON_DIR", str(tmp_path))  # where the engine looks for a2d_cpu.node: nothing there
    with pytest.raises(A2DError, match=r"addon for device 'cpu' is missing.*`npm run build`"):
        engine_answers(llama_model, 1, [[1, 2]], [DecodeParams(max_tokens=4)])
