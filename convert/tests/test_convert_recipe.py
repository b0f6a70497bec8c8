"""convert/recipes/convert.sh on the CPU: a tiny MiniCPM-shaped checkpoint (muP scalars, remote-code config) to a
packed CPU folder that `a2d simulate-startup` passes, in one command; run again, it resumes (nothing retrained)
and gives the same folder."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_import_config import minicpm_checkpoint
from test_recipe import python_env

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "convert" / "recipes" / "convert.sh"
NODE = shutil.which("node")


FIXTURES = REPO / "eval" / "fixtures"  # the layout `a2d eval --data` reads, standing in for the benchmarks' files


def run_convert(tmp: Path, checkpoint: Path, out: Path, **env) -> tuple[int, str]:
    full_env = {
        **python_env(tmp), "BENCHMARKS": str(FIXTURES),
        "DEVICE": "cpu", "DISTILL_N": "12", "DISTILL_TOKENS": "8", "DISTILL_BATCH": "12", "SEQ_LEN": "64",
        "BATCH_ROWS": "2", "MICRO_ROWS": "1", "RANK": "4", "LR": "3e-3", "WARMUP": "1", "AC": "0", "STEPS": "4",
        "LOG_EVERY": "2", "SAVE_EVERY": "2", "MIN_TRAIN_S": "1", "PROBES_PER_FAMILY": "1", "PROBE_TOKENS": "6",
        "THRESHOLDS": "0.9,0.5", "PROBE_BATCH": "16", "PROBES_HELDOUT": "0", "PROBES_OPEN": "0", "OMP_NUM_THREADS": "1",
        **env,
    }
    full_env = {k: v for k, v in full_env.items() if v is not None}  # None: the variable unset
    done = subprocess.run(["bash", str(RECIPE), str(checkpoint), str(out)], env=full_env, capture_output=True, text=True, timeout=900)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(NODE is None or not (REPO / "dist" / "cli" / "main.js").is_file() or not (REPO / "build" / "engine" / "a2d_cpu.node").is_file(),
                    reason="needs node, the built CLI (npm run build:ts) and the CPU addon (npm run build:engine)")
def test_one_command_takes_a_minicpm_checkpoint_to_a_folder_that_starts(tmp_path):
    checkpoint = minicpm_checkpoint(tmp_path / "minicpm", tied=False)
    out = tmp_path / "packed"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"Line {i} of a small declared corpus about rivers and hills."}) + "\n" for i in range(6)))
    corpora = f"{corpus},name=tiny-corpus,license=CC0-1.0,url=https://example.org/tiny-corpus"
    rc, log = run_convert(tmp_path, checkpoint, out, CORPORA=corpora)
    assert rc == 0, log
    for stage in ("[1/4] conversion", "[2/4] verify", "[3/4] pack", "[4/4] simulate-startup"):
        assert stage in log, log
    assert "PASS" in log
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["format"] == "a2d-folder" and (out / "serve.sh").is_file()
    # The data's manifest names the blocklists (on by default) and the declared corpus with its licence and sha256.
    data_manifest = json.loads((out.with_name("packed.work") / "data" / "data_manifest.json").read_text())
    text = json.dumps(data_manifest)
    assert "gpqa_diamond.csv" in text and "math_500.jsonl" in text, text[:2000]
    corpus_record = [s for s in data_manifest["sources"] if s.get("name") == "tiny-corpus"]
    assert corpus_record and corpus_record[0]["license"] == "CC0-1.0", data_manifest["sources"]
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() in json.dumps(corpus_record), corpus_record
    base_config = json.loads((out.with_name("packed.work") / "base" / "config.json").read_text())
    assert base_config["architectures"] == ["LlamaForCausalLM"]  # the muP scalars folded at import
    # The same command again resumes: the conversion's stages find their work done, and the folder is the same.
    rc, log2 = run_convert(tmp_path, checkpoint, out, CORPORA=corpora)
    assert rc == 0, log2
    assert "the last run took" in log2, log2
    again = json.loads((out / "MANIFEST.json").read_text())
    changed = sorted({f["path"] for f in again["files"]} ^ {f["path"] for f in manifest["files"]}
                     | {f["path"] for f in again["files"] if f not in manifest["files"]})
    assert again == manifest, changed
    # A checkpoint that is not there is refused at once, naming what to give.
    rc, log3 = run_convert(tmp_path, tmp_path / "no-such-checkpoint", tmp_path / "other")
    assert rc == 2 and "does not exist" in log3, log3
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.work").exists()
    # Without a benchmark blocklist it refuses before anything is made, naming BENCHMARKS and BENCHMARKS=none.
    rc, log4 = run_convert(tmp_path, checkpoint, tmp_path / "other", BENCHMARKS=None)
    assert rc == 2 and "BENCHMARKS=none" in log4, log4
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.work").exists()
