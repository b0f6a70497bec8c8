"""The whole conversion on a tiny base: GGUF -> import -> data -> train (LoRA) -> export + delta ->
generate by denoising (reference decoder and, when built, the C++ engine) -> verify -> rebuild."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from a2d_convert.config import load_config
from a2d_convert.data import DataConfig, Source, build_data
from a2d_convert.decode import decode
from a2d_convert.decoding import DecodeParams
from a2d_convert.errors import A2DError
from a2d_convert.export import export, rebuild
from a2d_convert.import_base import import_base
from a2d_convert.lineage import read_lineage, sha256_file
from a2d_convert.model import BlockForward, load_transformer
from a2d_convert.probes import Probe, evaluate_probes, generated_probes, is_correct
from a2d_convert.prompts import load_prompt_codec
from a2d_convert.tiny import TinySpec, make_tiny_base
from a2d_convert.train_config import TrainConfig
from a2d_convert.trainer import train
from a2d_convert.verify import verify_folder

from test_import import write_gguf
from test_train import arithmetic_rows

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "build" / "engine" / "a2d_cpu.node"
CLI = REPO / "dist" / "cli" / "main.js"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    hf = make_tiny_base(root / "hf", TinySpec(layers=2, hidden=64, heads=4, kv_heads=2))
    gguf_file = root / "tiny-base.gguf"
    write_gguf(gguf_file, hf)
    base = import_base(gguf_file, root / "base")
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(64)))
    data = build_data([Source(path=rows, name="arith")], base, root / "data", DataConfig(block_size=4, seq_len=96, holdout_fraction=0.1))
    config = TrainConfig(
        base=str(base), data=str(data), out=str(root / "run"), block_size=4, max_steps=12, batch_rows=4, micro_batch_rows=2,
        lr=1e-2, warmup_steps=2, log_every=4, threads=1, activation_checkpointing=False, lora_rank=4,
    )
    train(config)
    model = export(root / "run", root / "model", {"threshold": 0.5}, delta_dir=root / "delta")
    return root, gguf_file, model


def test_export_is_a_trained_a2d_model_with_evidence(converted):
    root, gguf_file, model = converted
    _, a2d, raw = load_config(model)
    assert a2d.trained and a2d.decoding.threshold == 0.5
    lineage = read_lineage(model)
    assert [s["stage"] for s in lineage["stages"]] == ["import", "init", "train", "export"]
    assert lineage["stages"][0]["inputs"]["tiny-base.gguf"]["sha256"] == sha256_file(gguf_file)
    assert lineage["shipped"]["weights_sha256"] == sha256_file(model / "model.safetensors")
    decoder = json.loads((model / "decoder_config.json").read_text())
    assert decoder["decoding"]["threshold"] == 0.5 and decoder["chosen_by"]["method"] == "flags"
    assert json.loads((model / "data_manifest.json").read_text())["sources"][0]["name"] == "arith"


def test_verify_passes_and_names_a_flipped_byte(converted, tmp_path):
    _, _, model = converted
    report = verify_folder(model)
    assert report.ok, report.failures
    assert any("chain import -> init -> train -> export" in line for line in report.lines)
    for name in ("model.safetensors", "tokenizer.json", "data_manifest.json"):
        copy = tmp_path / name.replace(".", "_")
        shutil.copytree(model, copy)
        blob = bytearray((copy / name).read_bytes())
        blob[len(blob) // 2] ^= 0x01
        (copy / name).write_bytes(bytes(blob))
        report = verify_folder(copy)
        assert not report.ok and any(f.startswith(name) for f in report.failures), report.failures
    extra = tmp_path / "extra"
    shutil.copytree(model, extra)
    (extra / "notes.txt").write_text("hello")
    assert any("notes.txt" in f for f in verify_folder(extra).failures)


def test_delta_rebuilds_the_weights_bit_for_bit_from_the_gguf(converted, tmp_path):
    root, gguf_file, model = converted
    delta = root / "delta"
    ops = {op["op"] for op in json.loads((delta / "delta.json").read_text())["tensors"].values()}
    assert "lora" in ops and "rows" in ops  # adapters, and the trained mask embedding row
    assert (delta / "delta.safetensors").stat().st_size < (model / "model.safetensors").stat().st_size
    assert verify_folder(delta).ok
    out = rebuild(gguf_file, delta, tmp_path / "rebuilt")
    assert sha256_file(out / "model.safetensors") == sha256_file(model / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "lineage.json", "decoder_config.json"):
        assert (out / name).read_bytes() == (model / name).read_bytes()
    assert verify_folder(out).ok
    again = rebuild(root / "base", delta, tmp_path / "from-imported")  # the imported folder works as well
    assert sha256_file(again / "model.safetensors") == sha256_file(model / "model.safetensors")
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(gguf_file.read_bytes()[:-1] + b"\x00")
    with pytest.raises(A2DError, match="not the pinned base"):
        rebuild(wrong, delta, tmp_path / "nope")


def test_rebuild_matches_the_base_gguf_by_sha256_not_by_name(converted, tmp_path):
    root, gguf_file, model = converted
    renamed = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copyfile(gguf_file, renamed)
    out = rebuild(renamed, root / "delta", tmp_path / "rebuilt")
    assert sha256_file(out / "model.safetensors") == sha256_file(model / "model.safetensors")
    same_name = tmp_path / "other" / gguf_file.name
    same_name.parent.mkdir()
    same_name.write_bytes(gguf_file.read_bytes()[:-1] + b"\x00")
    refusal = r"not the pinned base \(its sha256 is [0-9a-f]{16}…\); the delta needs sha256 [0-9a-f]{16}… \(recorded as tiny-base.gguf\)"
    with pytest.raises(A2DError, match=refusal):
        rebuild(same_name, root / "delta", tmp_path / "nope")


def reference_generate(model: Path, prompt: str, max_tokens: int, temperature: float, seed: int) -> list[int]:
    net, _, a2d = load_transformer(model)
    ids = load_prompt_codec(model).encode_chat([{"role": "user", "content": prompt}])
    params = DecodeParams.from_defaults(
        a2d.decoding, block_size=a2d.block_size, max_tokens=max_tokens, eos_token_ids=a2d.eos_token_ids, temperature=temperature, seed=seed
    )
    result = decode(BlockForward(net), ids, params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits)
    assert result.forward_passes >= 1
    return result.token_ids


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (1.0, 7)])
def test_export_generates_by_denoising_in_the_reference_and_the_engine(converted, temperature, seed):
    _, _, model = converted
    want = reference_generate(model, "What is 3 plus 4?", 12, temperature, seed)
    if temperature > 0:
        assert want, "sampling from the converted model produced nothing"
    if not (ENGINE.is_file() and CLI.is_file()):
        pytest.skip(f"C++ engine not built ({ENGINE} / {CLI} missing): run `npm run build` to include it")
    cmd = ["node", str(CLI), "generate", "--model", str(model), "--prompt", "What is 3 plus 4?", "--chat", "--max-tokens", "12"]
    cmd += ["--temperature", str(temperature), "--seed", str(seed), "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["token_ids"] == want
    assert got["forward_passes"] >= 1


def test_probe_grading():
    assert is_correct(Probe("add", "", "42", "number"), "The answer is 42.")
    assert not is_correct(Probe("add", "", "42", "number"), "41 or 43")
    assert is_correct(Probe("add", "", "1200", "number"), "<think>maybe 7</think> 1,200")
    assert is_correct(Probe("choice", "", "B", "choice"), "B) banana")
    assert not is_correct(Probe("choice", "", "B", "choice"), "A")
    assert is_correct(Probe("copy", "", "red fox", "contains"), "Sure: Red fox")
    assert is_correct(Probe("math", "", "$\\frac{1}{2}$", "math"), "so it is $0.5$")
    families = {p.family for p in generated_probes(2, seed=0)}
    assert families == {"add", "multiply", "compare", "sequence", "copy", "letters", "choice"}
    assert generated_probes(2, seed=0) == generated_probes(2, seed=0)


def test_probes_compare_base_and_model_and_choose_the_default_threshold(converted, tmp_path):
    root, _, model = converted
    probes = generated_probes(1, seed=3)
    report = evaluate_probes(model, root / "base", probes, [0.9, 0.3], max_tokens=6, tolerance=1.0, details=tmp_path / "d.jsonl")
    assert set(report["model"]) == {"0.9", "0.3"}
    for result in (report["base"], *report["model"].values()):
        assert 0.0 <= result["accuracy"] <= 1.0 and set(result["families"]) == {p.family for p in probes}
    assert 0.0 <= report["model"]["0.3"]["agreement"] <= 1.0
    fastest = max(report["model"], key=lambda t: report["model"][t]["tokens_per_forward"])
    assert report["recommended"] == {"threshold": float(fastest)}  # tolerance 1.0: every threshold qualifies
    assert len((tmp_path / "d.jsonl").read_text().splitlines()) == 3 * len(probes)
    probes_file = tmp_path / "probes.json"
    probes_file.write_text(json.dumps({**report, "model_dir": str(model)}))  # as `evaluate-probes` writes it
    chosen = export(root / "run", tmp_path / "model", probes_file=probes_file)
    decoder = json.loads((chosen / "decoder_config.json").read_text())
    assert decoder["decoding"]["threshold"] == float(fastest)
    assert decoder["chosen_by"]["method"] == "probes" and decoder["chosen_by"]["probes_file"]["sha256"] == sha256_file(probes_file)
    assert verify_folder(chosen).ok


def test_export_ships_exactly_the_decoding_the_probes_measured_or_refuses(converted, tmp_path):
    root, _, _ = converted
    # The probed candidate decodes with leftmost remasking; the probes recommend one of its thresholds.
    candidate = export(root / "run", tmp_path / "candidate", {"remasking": "leftmost", "min_per_step": 2})
    report = evaluate_probes(candidate, None, generated_probes(1, seed=4), [0.8, 0.2], max_tokens=6, tolerance=1.0)
    probes_file = tmp_path / "probes.json"
    probes_file.write_text(json.dumps({**report, "model_dir": str(candidate)}))
    recommended = report["recommended"]["threshold"]

    shipped = export(root / "run", tmp_path / "model", probes_file=probes_file)  # no flags: the measured rule, whole
    decoder = json.loads((shipped / "decoder_config.json").read_text())
    measured = {**json.loads((candidate / "config.json").read_text())["a2d"]["decoding"], "threshold": recommended, "temperature": 0.0}
    assert decoder["decoding"] == measured == json.loads((shipped / "config.json").read_text())["a2d"]["decoding"]
    assert decoder["decoding"]["remasking"] == "leftmost" and decoder["decoding"]["min_per_step"] == 2
    assert decoder["chosen_by"]["measured"] == {"from": "report"}  # evaluate-probes records the decoding it ran
    del report["decoding"]  # a report of an earlier a2d: the probed folder's config says what it ran
    probes_file.write_text(json.dumps({**report, "model_dir": str(candidate)}))
    older = json.loads((export(root / "run", tmp_path / "older", probes_file=probes_file) / "decoder_config.json").read_text())
    assert older["decoding"] == measured and older["chosen_by"]["measured"]["config"]["sha256"] == sha256_file(candidate / "config.json")
    # A flag that restates the measured decoding is fine; one that changes it is refused before anything is written.
    export(root / "run", tmp_path / "same", {"remasking": "leftmost"}, probes_file=probes_file)
    for flags in ({"remasking": "random"}, {"threshold": 0.55}, {"min_per_step": 1}):
        with pytest.raises(A2DError, match=r"differs from the decoding the probes .* measured"):
            export(root / "run", tmp_path / "other", flags, probes_file=probes_file)
        assert not (tmp_path / "other").exists()
    # A report that records neither its decoding nor the folder it probed is refused.
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(report))
    with pytest.raises(A2DError, match="does not say which decoding it measured"):
        export(root / "run", tmp_path / "other", probes_file=bare)
    # A report that records its decoding is taken as it says.
    stated = tmp_path / "stated.json"
    stated.write_text(json.dumps({**report, "decoding": {**measured, "remasking": "random"}}))
    got = export(root / "run", tmp_path / "stated", probes_file=stated)
    assert json.loads((got / "decoder_config.json").read_text())["decoding"]["remasking"] == "random"


def test_training_a_plain_checkpoint_exports_a_model_that_verifies(tmp_path):
    """`train --base` on an HF folder that was never imported imports it into OUT/base first, so the export's
    chain starts at an import of the checkpoint's own files and `verify` passes it."""
    hf = make_tiny_base(tmp_path / "hf", TinySpec(layers=1, hidden=32, heads=2, kv_heads=1))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(16)))
    data = build_data([Source(path=rows, name="arith")], hf, tmp_path / "data", DataConfig(block_size=4, seq_len=96))
    config = TrainConfig(base=str(hf), data=str(data), out=str(tmp_path / "run"), block_size=4, max_steps=2, batch_rows=2,
                         micro_batch_rows=2, warmup_steps=1, log_every=1, threads=1, activation_checkpointing=False)
    train(config)
    model = export(tmp_path / "run", tmp_path / "model", {})
    lineage = read_lineage(model)
    assert [s["stage"] for s in lineage["stages"]] == ["import", "init", "train", "export"]
    assert lineage["stages"][0]["inputs"]["model.safetensors"]["sha256"] == sha256_file(hf / "model.safetensors")
    report = verify_folder(model)
    assert report.ok, report.failures
    # Training again into the same run folder (a resume) reuses the import made from the same checkpoint.
    train(config, resume=True)


def test_training_refuses_a_base_whose_chain_does_not_start_at_an_import(tmp_path):
    """A folder made by `init` from a plain checkpoint (chain: init) would train into an export that `verify`
    fails: refused before the first step, naming the import command."""
    from a2d_convert.init_model import init_model

    hf = make_tiny_base(tmp_path / "hf", TinySpec(layers=1, hidden=32, heads=2, kv_heads=1))
    init_dir = init_model(hf, tmp_path / "init")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(8)))
    data = build_data([Source(path=rows, name="arith")], hf, tmp_path / "data", DataConfig(block_size=4, seq_len=96))
    config = TrainConfig(base=str(init_dir), data=str(data), out=str(tmp_path / "run"), block_size=4, max_steps=1, batch_rows=2,
                         micro_batch_rows=2, threads=1, activation_checkpointing=False)
    with pytest.raises(A2DError, match=r"a2d_convert import --source"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()
