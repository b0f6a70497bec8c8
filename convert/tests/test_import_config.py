"""`import` refuses what the engine refuses (engine/supported-config.json, the one list both read), with
the fix named; MiniCPM's muP scales are folded into the weights instead, and the folded model computes
what MiniCPM's own forward computes."""

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from a2d_convert.config import SUPPORTED_CONFIG_FILE, load_config
from a2d_convert.errors import A2DError
from a2d_convert.import_base import import_base
from a2d_convert.init_model import init_model
from a2d_convert.lineage import read_lineage
from a2d_convert.model import causal_mask, load_transformer
from a2d_convert.tiny import TinySpec, make_tiny_base

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "build" / "engine" / "a2d_cpu.node"
CLI = REPO / "dist" / "cli" / "main.js"
SUPPORTED = json.loads((REPO / "engine" / "supported-config.json").read_text())


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("base") / "base", TinySpec(heads=4, kv_heads=2))


def with_config(base: Path, folder: Path, **changes) -> Path:
    shutil.copytree(base, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_package_reads_the_engines_list():
    # The converter's copy is a link to the file the engine compiles in, not a second list.
    assert SUPPORTED_CONFIG_FILE.resolve() == (REPO / "engine" / "supported-config.json").resolve()


@pytest.mark.parametrize(
    "field,value",
    [
        ("scale_emb", 12),
        ("dim_model_base", 256),
        ("scale_depth", 1.4),
        ("logits_scaling", 8.0),
        ("quantization_config", {"quant_method": "awq", "bits": 4}),
        ("auto_map", {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}),
        ("some_new_scale", 2.0),
    ],
)
def test_import_refuses_a_field_the_engine_refuses_and_names_the_fix(tiny_base, tmp_path, field, value):
    source = with_config(tiny_base, tmp_path / "src", **{field: value})
    fix = SUPPORTED["refused"].get(field, "remove it if it is metadata")
    with pytest.raises(A2DError) as raised:
        import_base(source, tmp_path / "out")
    assert f"field '{field}' is not supported by the a2d engine; {fix}" in str(raised.value)
    assert str(source / "config.json") in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_metadata_fields_of_the_list_are_accepted(tiny_base, tmp_path):
    source = with_config(tiny_base, tmp_path / "src", transformers_version="5.17.0", initializer_range=0.02, torch_dtype="bfloat16")
    import_base(source, tmp_path / "out")


@pytest.mark.parametrize(
    "change,message",
    [
        ({"pretraining_tp": 2}, "pretraining_tp"),
        ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "factor": 2.0}}, "rope_parameters"),
        ({"rope_theta": 5e5}, "disagrees with the top-level rope_theta"),
    ],
)
def test_import_refuses_values_the_engine_refuses(tiny_base, tmp_path, change, message):
    with pytest.raises(A2DError, match=message):
        import_base(with_config(tiny_base, tmp_path / "src", **change), tmp_path / "out")


# --------------------------------------------------------------------------------------------- MiniCPM

MUP = {"scale_emb": 12, "dim_model_base": 32, "scale_depth": 1.4}  # hidden 96 / 32: the final hidden state / 3


def minicpm_checkpoint(folder: Path, tied: bool) -> Path:
    """A tiny random MiniCPM-style checkpoint as MiniCPM's hub repos ship it: Llama tensors, remote code."""
    make_tiny_base(folder, TinySpec(layers=3, hidden=96, intermediate=160, heads=4, kv_heads=2, tie_embeddings=tied, seed=11))
    config = json.loads((folder / "config.json").read_text())
    config.update(
        architectures=["MiniCPMForCausalLM"],
        model_type="minicpm",
        auto_map={"AutoConfig": "configuration_minicpm.MiniCPMConfig", "AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM"},
        **MUP,
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def minicpm_reference_logits(checkpoint: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' own Llama forward with MiniCPM's three scalars applied where modeling_minicpm.py applies
    them: `inputs_embeds = embed_tokens(input_ids) * scale_emb`; `hidden_states = residual + hidden_states *
    (scale_depth / math.sqrt(num_hidden_layers))` after self_attn and after mlp; `logits =
    lm_head(hidden_states / (hidden_size / dim_model_base))` (the final norm's output). fp32 throughout."""
    from transformers import LlamaConfig, LlamaForCausalLM

    raw = json.loads((checkpoint / "config.json").read_text())
    llama_fields = {k: v for k, v in raw.items() if k not in (*MUP, "auto_map", "architectures", "model_type")}
    config = LlamaConfig(**llama_fields)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    state = {k: v.float() for k, v in load_file(checkpoint / "model.safetensors").items()}
    if raw["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    residual = raw["scale_depth"] / math.sqrt(raw["num_hidden_layers"])
    width = raw["hidden_size"] / raw["dim_model_base"]
    scale = lambda factor: (lambda module, args, output: output * factor)  # noqa: E731
    model.model.embed_tokens.register_forward_hook(scale(raw["scale_emb"]))
    for layer in model.model.layers:
        layer.self_attn.o_proj.register_forward_hook(scale(residual))  # the attention branch's output
        layer.mlp.down_proj.register_forward_hook(scale(residual))  # the MLP branch's output
    model.model.norm.register_forward_hook(scale(1.0 / width))
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


def folded_logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    net, _, _ = load_transformer(model_dir)
    with torch.no_grad():
        hidden, _ = net(ids, torch.arange(ids.shape[1])[None], causal_mask(ids.shape[1])[None])
        return net.logits(hidden)[0]


@pytest.mark.parametrize("tied", [False, True])
def test_minicpm_mup_scales_are_folded_and_the_logits_match_minicpms_forward(tmp_path, tied):
    checkpoint = minicpm_checkpoint(tmp_path / "minicpm", tied)
    imported = import_base(checkpoint, tmp_path / "imported")
    config = json.loads((imported / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert not {"auto_map", *MUP} & set(config) and config["tie_word_embeddings"] is tied
    folded = read_lineage(imported)["stages"][0]["config"]["folded_mup"]
    assert folded["from"] == "MiniCPMForCausalLM" and folded["o_proj_down_proj"] == pytest.approx(1.4 / math.sqrt(3))

    ids = torch.tensor([[1, 17, 42, 99, 7, 300, 5, 64, 250, 3, 18, 77]])
    want = minicpm_reference_logits(checkpoint, ids)
    got = folded_logits(imported, ids)
    # Each folded weight is the bf16 rounding of (bf16 weight x scale): one relative error of at most 2^-9
    # per weight. Tolerance: 0.5 % of the largest logit. Measured: max |difference| 0.026 with logits up to
    # 10.1 (untied, 0.26 %), 0.030 up to 30.3 (tied, 0.10 %); mean 0.005 and 0.006.
    spread = want.abs().max().item()
    assert spread > 1.0, "the reference logits are too small to test anything"
    assert (got - want).abs().max().item() <= 0.005 * spread
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # Without the fold (the same tensors read as plain Llama) the logits are far off: the test can fail.
    plain = tmp_path / "plain"
    shutil.copytree(checkpoint, plain)
    raw = json.loads((plain / "config.json").read_text())
    for key in (*MUP, "auto_map"):
        raw.pop(key)
    raw.update(architectures=["LlamaForCausalLM"], model_type="llama")
    (plain / "config.json").write_text(json.dumps(raw))
    assert (folded_logits(plain, ids) - want).abs().max().item() > 0.1 * spread


def test_minicpm_without_explicit_scales_is_refused(tmp_path):
    checkpoint = minicpm_checkpoint(tmp_path / "minicpm", tied=False)
    raw = json.loads((checkpoint / "config.json").read_text())
    raw.pop("scale_depth")
    (checkpoint / "config.json").write_text(json.dumps(raw))
    with pytest.raises(A2DError, match=r"MiniCPMForCausalLM without \['scale_depth'\].*write the values"):
        import_base(checkpoint, tmp_path / "out")


def test_the_engine_loads_a_folded_minicpm_and_decodes_as_the_reference(tmp_path):
    from a2d_convert.decode import decode
    from a2d_convert.decoding import DecodeParams
    from a2d_convert.model import BlockForward
    from a2d_convert.prompts import load_prompt_codec

    imported = import_base(minicpm_checkpoint(tmp_path / "minicpm", tied=True), tmp_path / "imported")
    model = init_model(imported, tmp_path / "a2d")
    net, _, a2d = load_transformer(model)
    ids = load_prompt_codec(model).encode_chat([{"role": "user", "content": "Count to five."}])
    params = DecodeParams.from_defaults(a2d.decoding, block_size=a2d.block_size, max_tokens=12, eos_token_ids=a2d.eos_token_ids)
    want = decode(BlockForward(net), ids, params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits).token_ids
    assert load_config(model)[0].architecture == "LlamaForCausalLM"
    if not (ENGINE.is_file() and CLI.is_file()):
        pytest.skip(f"C++ engine not built ({ENGINE} / {CLI} missing): run `npm run build` to include it")
    cmd = ["node", str(CLI), "generate", "--model", str(model), "--prompt", "Count to five.", "--chat", "--max-tokens", "12", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["token_ids"] == want
