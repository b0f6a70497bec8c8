"""convert/recipes/make_prompts.py: many distinct self-written prompts, stratified, deterministic by seed,
and none of them shaped like an evaluate-probes question."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from a2d_convert.probes import generated_probes

SCRIPT = Path(__file__).resolve().parents[1] / "recipes" / "make_prompts.py"
spec = importlib.util.spec_from_file_location("make_prompts", SCRIPT)
make_prompts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_prompts)


def test_twenty_thousand_distinct_prompts_from_every_category():
    rows = make_prompts.make_prompts(20000, seed=0)
    prompts = [r["prompt"] for r in rows]
    assert len(prompts) == len(set(prompts)) == 20000
    counts = Counter(r["category"] for r in rows)
    assert set(counts) == set(make_prompts.CATEGORIES)
    assert max(counts.values()) < 0.25 * len(rows)  # no category dominates
    assert len(make_prompts.all_prompts()) >= 50000


def test_the_same_seed_gives_the_same_file_and_another_seed_another(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out, seed in ((a, 3), (b, 3)):
        subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--count", "5000", "--seed", str(seed)], check=True, capture_output=True)
    assert a.read_bytes() == b.read_bytes()
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(rows) == 5000 and set(rows[0]) == {"prompt", "category"}
    other = make_prompts.make_prompts(5000, seed=4)
    assert [r["prompt"] for r in other] != [r["prompt"] for r in rows]
    # A smaller count is a different stratified draw, not a prefix; but each category's picks are nested.
    small = {r["prompt"] for r in make_prompts.make_prompts(1000, seed=3)}
    assert small <= {r["prompt"] for r in make_prompts.make_prompts(20000, seed=3)}


def test_no_prompt_looks_like_a_probe():
    for probe in generated_probes(20, seed=0):
        assert make_prompts.probe_like(probe.prompt), probe.prompt  # the patterns do catch every probe family
    offenders = [p for p in make_prompts.all_prompts() if make_prompts.probe_like(p)]
    assert offenders == []


def test_asking_for_more_than_exists_is_refused():
    import pytest

    with pytest.raises(SystemExit, match="distinct prompts"):
        make_prompts.make_prompts(10**6, seed=0)


def test_the_code_category_is_opt_in_distinct_and_asks_nothing_the_evaluations_ask():
    plain = make_prompts.make_prompts(20000, seed=1)
    assert plain == make_prompts.make_prompts(20000, seed=1, extra={"code": 0})  # existing prompt files keep their bytes
    assert "code" not in {r["category"] for r in plain}
    rows = make_prompts.make_prompts(20000, seed=1, extra={"code": 10})
    code = [r["prompt"] for r in rows if r["category"] == "code"]
    assert 1000 < len(code) < 0.25 * len(rows) and len(set(code)) == len(code)
    assert any("Python" in p for p in code) and any("Rust" in p for p in code)
    pool = make_prompts.all_prompts({"code": 10})
    assert [p for p in pool if make_prompts.probe_like(p)] == []
    recipes = SCRIPT.parent
    asked = {json.loads(line)["prompt"].strip().lower() for name in ("open-prompts.jsonl", "heldout-prompts.jsonl")
             for line in (recipes / name).read_text().splitlines() if line.strip()}
    assert asked and not asked & {p.strip().lower() for p in pool}
    assert not any("factorial" in p or "reverses a string" in p for p in pool)


def test_an_unknown_or_negative_opt_in_category_is_refused(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="no opt-in prompt category 'poetry'"):
        make_prompts.make_prompts(100, seed=0, extra={"poetry": 3})
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "p.jsonl"), "--count", "100",
                           "--code-weight", "-1"], capture_output=True, text=True)
    assert done.returncode != 0 and "0 or more" in done.stderr and not (tmp_path / "p.jsonl").exists()
