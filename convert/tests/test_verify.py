"""`verify` on the command line, the full fine-tune's delta, and the deterministic LoRA merge."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from a2d_convert.data import DataConfig, Source, build_data
from a2d_convert.export import export, rebuild
from a2d_convert.import_base import import_base
from a2d_convert.lineage import sha256_file
from a2d_convert.lora import merge_lora, quantize_factor, round_to_bf16
from a2d_convert.tiny import TinySpec, make_tiny_base
from a2d_convert.train_config import TrainConfig
from a2d_convert.trainer import train

from test_train import arithmetic_rows


@pytest.fixture(scope="module")
def full_finetune(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    hf = make_tiny_base(root / "hf", TinySpec(layers=1, hidden=64, heads=4, kv_heads=2, vocab_multiple=1))
    base = import_base(hf, root / "base")
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(16)))
    data = build_data([Source(path=rows, name="arith")], base, root / "data", DataConfig(block_size=4, seq_len=64))
    config = TrainConfig(
        base=str(base), data=str(data), out=str(root / "run"), block_size=4, max_steps=3, batch_rows=2,
        lr=1e-3, warmup_steps=1, log_every=1, threads=1, activation_checkpointing=False,
    )
    train(config)
    model = export(root / "run", root / "model", delta_dir=root / "delta")
    return root, hf, model


def run_verify(folder):
    return subprocess.run([sys.executable, "-m", "a2d_convert", "verify", str(folder)], capture_output=True, text=True, timeout=120)


def test_verify_cli_transcript_and_exit_status(full_finetune, tmp_path):
    _, _, model = full_finetune
    done = run_verify(model)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].startswith(f"verify {model}: PASS")
    assert "ok    model.safetensors: sha256" in done.stdout
    tampered = tmp_path / "tampered"
    shutil.copytree(model, tampered)
    config = json.loads((tampered / "config.json").read_text())
    config["a2d"]["decoding"]["threshold"] = 0.1  # served decoding no longer what the evidence says
    (tampered / "config.json").write_text(json.dumps(config))
    done = run_verify(tampered)
    assert done.returncode == 1
    assert "FAIL  config.json: sha256" in done.stdout
    assert "FAIL  decoder_config.json: decoding equals config.json a2d.decoding" in done.stdout
    (tmp_path / "empty").mkdir()
    missing = run_verify(tmp_path / "empty")
    assert missing.returncode == 1 and "lineage.json" in missing.stdout


def test_full_finetune_delta_rebuilds_bit_for_bit(full_finetune, tmp_path):
    root, hf, _ = full_finetune
    delta = root / "delta"
    manifest = json.loads((delta / "delta.json").read_text())
    ops = {name: op["op"] for name, op in manifest["tensors"].items()}
    assert ops["model.embed_tokens.weight"] == "rows"  # the appended mask row (vocab not padded)
    assert "xor" in ops.values()
    out = rebuild(hf, delta, tmp_path / "rebuilt")  # from the HF source folder: import runs again
    assert sha256_file(out / "model.safetensors") == manifest["weights_sha256"]
    assert sha256_file(out / "model.safetensors") == sha256_file(root / "model" / "model.safetensors")


def test_redecode_records_the_new_decoding_and_the_delta_still_rebuilds(full_finetune, tmp_path):
    root, hf, model = full_finetune
    delta = tmp_path / "delta"
    shutil.copytree(root / "delta", delta)
    cli = [sys.executable, "-m", "a2d_convert", "redecode", "--model", str(delta)]
    done = subprocess.run(cli + ["--advance", "slide", "--threshold", "0.5"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    config = json.loads((delta / "config.json").read_text())
    decoder = json.loads((delta / "decoder_config.json").read_text())
    assert config["a2d"]["decoding"]["advance"] == "slide" and config["a2d"]["decoding"]["threshold"] == 0.5
    assert decoder["decoding"] == config["a2d"]["decoding"]
    assert decoder["chosen_by"]["flags"] == {"advance": "slide", "threshold": 0.5}
    lineage = json.loads((delta / "lineage.json").read_text())
    assert [s["stage"] for s in lineage["stages"]][-2:] == ["export", "redecode"]
    # The choice replaced is named by its file's hash, and stays in the lineage as the export stage recorded it.
    replaced = lineage["stages"][-1]["inputs"]["decoder_config.json"]["sha256"]
    assert decoder["chosen_by"]["previous"] == {"sha256": replaced}
    assert lineage["stages"][-2]["outputs"]["decoder_config.json"]["sha256"] == replaced
    assert run_verify(delta).returncode == 0
    rebuilt = rebuild(hf, delta, tmp_path / "rebuilt")
    done = run_verify(rebuilt)
    assert done.returncode == 0, done.stdout
    assert sha256_file(rebuilt / "model.safetensors") == sha256_file(model / "model.safetensors")
    # reveal_order is written only where it is not the default, as export writes it.
    for order, written in (("prefix", True), ("any", False)):
        done = subprocess.run(cli + ["--reveal-order", order], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        decoding = json.loads((delta / "config.json").read_text())["a2d"]["decoding"]
        assert ("reveal_order" in decoding) == written and decoding.get("reveal_order", "any") == order
        assert json.loads((delta / "decoder_config.json").read_text())["decoding"] == decoding
    # Nothing to change, a bad value, or a file that is not the recorded one: refused, nothing written.
    before = {p.name: p.read_bytes() for p in delta.iterdir()}
    for args, message in (([], "give the decoding parameters"), (["--min-per-step", "99"], "min_per_step"),
                          (["--remasking", "leftmost", "--threshold", "1"], "left_to_right")):
        done = subprocess.run(cli + args, capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and message in done.stderr
    (delta / "decoder_config.json").write_text("{}")
    done = subprocess.run(cli + ["--threshold", "0.7"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "not the file the lineage records" in done.stderr
    assert {p.name: p.read_bytes() for p in delta.iterdir() if p.name != "decoder_config.json"} == {
        k: v for k, v in before.items() if k != "decoder_config.json"}


def test_a_quantized_export_verifies_its_chain_through_a_redecode(full_finetune, tmp_path):
    from a2d_convert.export import redecode
    from a2d_convert.quantize import quantize_folder

    _, _, model = full_finetune
    redecoded = tmp_path / "redecoded"
    shutil.copytree(model, redecoded)
    redecode(redecoded, {"threshold": 0.7})
    fp8 = quantize_folder(redecoded, tmp_path / "fp8")
    done = run_verify(fp8)
    assert done.returncode == 0, done.stdout
    assert "chain import -> init -> train -> export -> redecode -> quantize: every stage read" in done.stdout
    inputs = json.loads((fp8 / "lineage.json").read_text())["stages"][-1]["inputs"]
    assert inputs["config.json"]["from_previous"] and inputs["model.safetensors"]["from_stage"] == 3  # export's weights
    # The weights the quantize stage says it read are export's: a different record is a gap.
    lineage = json.loads((fp8 / "lineage.json").read_text())
    lineage["stages"][-1]["inputs"]["model.safetensors"]["sha256"] = "0" * 64
    (fp8 / "lineage.json").write_text(json.dumps(lineage))
    done = run_verify(fp8)
    assert done.returncode == 1 and "as stage 3's output" in done.stdout


def test_lora_merge_is_exact_whatever_the_summation_order():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 40, generator=g).to(torch.bfloat16)
    qa, a_exp = quantize_factor(torch.randn(8, 40, generator=g) * 0.05)
    qb, b_exp = quantize_factor(torch.randn(48, 8, generator=g) * 0.01)
    assert qa.dtype == torch.int16 and qa.abs().max() > 16384  # the peak uses the 15 bits
    merged = merge_lora(weight, qa, a_exp, qb, b_exp, 0.5)
    # The product in reversed rank order, summed one outer product at a time: the same exact integers.
    product = torch.zeros(48, 40, dtype=torch.float64)
    for k in reversed(range(8)):
        product += qb[:, k, None].double() * qa[None, k, :].double()
    manual = round_to_bf16(weight.double() + product * (0.5 * 2.0 ** -(a_exp + b_exp)))
    assert torch.equal(merged.view(torch.int16), manual.view(torch.int16))
    assert torch.equal(merged.view(torch.int16), (weight.double() + product * (0.5 * 2.0 ** -(a_exp + b_exp))).float().to(torch.bfloat16).view(torch.int16))
    with pytest.raises(ValueError):
        merge_lora(weight, qa.float(), a_exp, qb, b_exp, 0.5)
