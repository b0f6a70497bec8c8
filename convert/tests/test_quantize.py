"""`quantize` (FP8 e4m3 weights with per-row scales): the format, the reference's exact dequantization, the
folder it writes, and the inputs it refuses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from a2d_convert.errors import A2DError
from a2d_convert.lineage import chain_gaps, sha256_file
from a2d_convert.model import BlockForward, Transformer, load_transformer
from a2d_convert.quantize import quantize_folder, quantize_rows
from a2d_convert.tiny import TinySpec
from a2d_convert.weights import dequantize, quantized_names, read_tensors


@pytest.fixture(scope="module")
def quantized(tiny_models, tmp_path_factory):
    """(bf16 a2d folder, its FP8 copy) of the default tiny llama (untied)."""
    _, model = tiny_models("llama")
    return model, quantize_folder(model, tmp_path_factory.mktemp("fp8") / "model")


def test_rows_take_the_least_error_scale_and_keep_three_mantissa_bits():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different sizes
    w[5] = 0.0
    q, scale = quantize_rows(w.to(torch.bfloat16))
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and scale.shape == (64,)
    assert scale[5] == 1.0 and (q[5].float() == 0).all()  # a zero row: scale 1, zeros
    back = dequantize(q, scale)
    w = w.to(torch.bfloat16).float()
    rows = [r for r in range(64) if r != 5]
    # The scale lies in [max / 448, 2 max / 448): the largest weight is never clipped and lands in (224, 448].
    amax = w[rows].abs().amax(dim=1)
    assert (scale[rows] >= amax / 448 * (1 - 2**-23)).all() and (scale[rows] < 2 * amax / 448).all()
    assert (q[rows].float().abs().amax(dim=1) > 224).all()
    # No row has more squared error than with max / 448 alone, and the search helps on the whole.
    plain = amax / 448
    plain_back = (w[rows] / plain[:, None]).to(torch.float8_e4m3fn).float() * plain[:, None]
    err, plain_err = (back[rows] - w[rows]).pow(2).sum(1), (plain_back - w[rows]).pow(2).sum(1)
    assert (err <= plain_err).all() and err.sum() < 0.95 * plain_err.sum()
    # Round to nearest with 3 mantissa bits: at most 2^-4 of the value in e4m3's normal range (|q| >= 2^-6).
    normal = q.float().abs() >= 2**-6
    assert ((back - w).abs() <= 2**-4 * w.abs() + 1e-12)[normal].all()
    assert normal[rows].float().mean() > 0.999


def test_folder_holds_e4m3_projections_and_fp32_scales(quantized):
    model, fp8 = quantized
    _, cfg, a2d = load_transformer(fp8)
    assert a2d.precision == "fp8-e4m3"
    assert json.loads((fp8 / "config.json").read_text())["a2d"]["precision"] == "fp8-e4m3"
    before, after = read_tensors(model), read_tensors(fp8)
    names = quantized_names(cfg)
    assert len(names) == 7 * cfg.num_layers + 1 and "lm_head.weight" in names
    for name in names:
        assert after[name].dtype == torch.float8_e4m3fn and after[name + "_scale"].dtype == torch.float32
        q, scale = quantize_rows(before[name])
        assert torch.equal(after[name].view(torch.uint8), q.view(torch.uint8)) and torch.equal(after[name + "_scale"], scale)
    for name in set(before) - set(names):  # embedding, norms: as they were
        assert torch.equal(after[name], before[name])
    assert set(after) == set(before) | {n + "_scale" for n in names}
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (fp8 / name).read_bytes() == (model / name).read_bytes()
    # Half the bytes of the projections: the file is well under the bf16 one.
    assert (fp8 / "model.safetensors").stat().st_size < 0.7 * (model / "model.safetensors").stat().st_size


def test_reference_multiplies_exactly_the_dequantized_matrices(quantized):
    model, fp8 = quantized
    ref, cfg, _ = load_transformer(fp8)
    tensors = load_file(fp8 / "model.safetensors")
    for name in quantized_names(cfg):
        got = dict(ref.named_parameters())[name]
        assert got.dtype == torch.float32
        assert torch.equal(got, tensors[name].float() * tensors[name + "_scale"][:, None])
    # And the model still computes nearly what the bf16 one does: each matrix is off by about 2.5 % (3-bit
    # mantissas), the logits rows of this random model by 3-4 % (median) and up to about 15 %.
    bf16, _, a2d = load_transformer(model)
    ids, window = list(range(3, 40)), [a2d.mask_token_id] * a2d.block_size
    rows = list(range(len(ids) + len(window)))
    want = BlockForward(bf16)(ids, window, rows)
    got = BlockForward(ref)(ids, window, rows)
    rel = (got - want).norm(dim=-1) / want.norm(dim=-1)
    assert 0.01 < rel.median().item() < 0.06 and rel.max().item() < 0.3


def test_lineage_records_the_stage_and_the_chain_has_no_gap(quantized):
    model, fp8 = quantized
    lineage = json.loads((fp8 / "lineage.json").read_text())
    stage = lineage["stages"][-1]
    assert stage["stage"] == "quantize" and stage["config"]["format"] == "fp8-e4m3"
    assert stage["config"]["untied_lm_head"] is False
    assert stage["inputs"]["model.safetensors"]["sha256"] == sha256_file(model / "model.safetensors")
    assert chain_gaps(lineage) == []
    assert set(lineage["shipped"]["files"]) == {p.name for p in fp8.iterdir() if p.name != "lineage.json"}


def test_chain_gaps_check_inputs_named_from_an_earlier_stage():
    record = {"sha256": "a" * 64, "bytes": 1}
    stages = [
        {"stage": "export", "outputs": {"model.safetensors": record, "config.json": {"sha256": "b" * 64, "bytes": 1}}},
        {"stage": "redecode", "inputs": {}, "outputs": {"config.json": {"sha256": "c" * 64, "bytes": 1}}},
        {"stage": "quantize", "inputs": {"model.safetensors": {**record, "from_stage": 0}}, "outputs": {}},
    ]
    assert chain_gaps({"stages": stages}) == []
    stages[2]["inputs"]["model.safetensors"]["sha256"] = "d" * 64  # not what export wrote
    assert len(chain_gaps({"stages": stages})) == 1
    stages[2]["inputs"] = {"config.json": {"sha256": "b" * 64, "bytes": 1, "from_stage": 0}}  # redecode replaced it
    assert "a later stage replaced" in chain_gaps({"stages": stages})[0]


def test_tied_embeddings_are_untied_so_the_lm_head_is_fp8_too(tiny_models, tmp_path):
    _, model = tiny_models("tied", TinySpec(tie_embeddings=True))
    fp8 = quantize_folder(model, tmp_path / "fp8")
    config = json.loads((fp8 / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    tensors = read_tensors(fp8)
    q, scale = quantize_rows(tensors["model.embed_tokens.weight"])
    assert torch.equal(tensors["lm_head.weight"].view(torch.uint8), q.view(torch.uint8))
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert json.loads((fp8 / "lineage.json").read_text())["stages"][-1]["config"]["untied_lm_head"] is True
    ref, cfg, _ = load_transformer(fp8)
    assert isinstance(ref, Transformer) and not cfg.tie_word_embeddings


def test_refuses_what_it_cannot_quantize(quantized, tiny_models, tmp_path):
    model, fp8 = quantized
    with pytest.raises(A2DError, match="already fp8-e4m3"):
        quantize_folder(fp8, tmp_path / "again")
    with pytest.raises(A2DError, match="inside it"):
        quantize_folder(model, model / "fp8")
    base, _ = tiny_models("llama")
    with pytest.raises(A2DError, match="no a2d section"):
        quantize_folder(base, tmp_path / "base")
    with pytest.raises(A2DError, match="writes fp8-e4m3"):
        quantize_folder(model, tmp_path / "int4", "int4")
    # A folder whose files are not the ones its lineage ships: named, and nothing is written.
    changed = tmp_path / "changed"
    shutil.copytree(fp8, changed)
    lineage = json.loads((changed / "lineage.json").read_text())
    lineage["stages"][-1]["config"]["format"] = "bf16"  # make it look like a bf16 folder with a lineage
    config = json.loads((changed / "config.json").read_text())
    del config["a2d"]["precision"]
    (changed / "config.json").write_text(json.dumps(config))
    (changed / "lineage.json").write_text(json.dumps(lineage))
    with pytest.raises(A2DError, match="config.json: not the file"):
        quantize_folder(changed, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()


def test_bf16_folders_refuse_fp8_tensors_and_fp8_folders_need_every_scale(quantized, tmp_path):
    _, fp8 = quantized
    unannounced = tmp_path / "unannounced"
    shutil.copytree(fp8, unannounced)
    config = json.loads((unannounced / "config.json").read_text())
    del config["a2d"]["precision"]
    (unannounced / "config.json").write_text(json.dumps(config))
    with pytest.raises(A2DError, match="is F8_E4M3, which a2d reads only for the projections"):
        load_transformer(unannounced)
    config["a2d"]["precision"] = "fp8-e5m2"
    (unannounced / "config.json").write_text(json.dumps(config))
    with pytest.raises(A2DError, match="precision must be one of"):
        load_transformer(unannounced)
    tensors = read_tensors(fp8)
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    missing = tmp_path / "missing"
    shutil.copytree(fp8, missing)
    from safetensors.torch import save_file

    save_file(tensors, str(missing / "model.safetensors"))
    with pytest.raises(A2DError, match="down_proj.weight_scale' is missing"):
        load_transformer(missing)
    tensors = read_tensors(fp8)
    tensors["model.layers.0.self_attn.q_proj.weight_scale"][3] = float("nan")
    save_file(tensors, str(missing / "model.safetensors"))
    with pytest.raises(A2DError, match="q_proj.weight_scale' holds a negative or non-finite scale"):
        load_transformer(missing)


def test_cli_writes_the_folder_and_names_bad_input(quantized, tmp_path):
    model, _ = quantized
    cli = [sys.executable, "-m", "a2d_convert", "quantize", "--model", str(model)]
    done = subprocess.run(cli + ["--out", str(tmp_path / "fp8")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["format"] == "fp8-e4m3" and (tmp_path / "fp8" / "lineage.json").is_file()
    done = subprocess.run(cli + ["--out", str(tmp_path / "fp8")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "folder is not empty" in done.stderr and "Traceback" not in done.stderr
