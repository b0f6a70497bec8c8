"""`import`: HF folders are carried verbatim, GGUF files round-trip to the same tensors and tokenizer."""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from a2d_convert.errors import A2DError
from a2d_convert.import_base import LAYER_TENSORS, GLOBAL_TENSORS, import_base
from a2d_convert.lineage import read_lineage, sha256_file
from a2d_convert.tiny import TinySpec, make_tiny_base

HF_TO_GGUF = {v: k for k, v in GLOBAL_TENSORS.items()}


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, layer, suffix = hf_name.split(".", 3)
    inverse = {v: k for k, v in LAYER_TENSORS.items()}
    return f"blk.{layer}.{inverse[suffix]}"


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows of llama models (halves -> interleaved pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, base: Path, quantize: set[str] = frozenset()) -> dict[str, np.ndarray]:
    """A GGUF of the tiny base as llama.cpp would write it; returns the HF tensors it encodes (fp32)."""
    config = json.loads((base / "config.json").read_text())
    tensors = {k: v.float().numpy() for k, v in load_file(base / "model.safetensors").items()}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    tok = json.loads((base / "tokenizer.json").read_text())
    vocab = {**tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok["added_tokens"]}}
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = {a["content"]: a["special"] for a in tok["added_tokens"]}
    types = [(3 if special[t] else 4) if t in special else 1 for t in tokens]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_chat_template(json.loads((base / "tokenizer_config.json").read_text())["chat_template"])
    expected = {}
    for name, value in tensors.items():
        stored = value
        if name.endswith("q_proj.weight"):
            stored = llama_cpp_permute(value, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            stored = llama_cpp_permute(value, config["num_key_value_heads"])
        if name in quantize:
            qtype = gguf.GGMLQuantizationType.Q8_0
            packed = gguf.quants.quantize(stored, qtype)
            writer.add_tensor(gguf_name(name), packed, raw_dtype=qtype)
            restored = gguf.quants.dequantize(packed, qtype).reshape(stored.shape)
            value = restored if name == "model.embed_tokens.weight" else value
            expected[name] = restored  # in GGUF layout; checked through attention below when permuted
        else:
            writer.add_tensor(gguf_name(name), stored)
            expected[name] = value
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("base") / "base", TinySpec(heads=4, kv_heads=2))


def test_hf_folder_is_copied_verbatim_and_hashed(tiny_base, tmp_path):
    out = import_base(tiny_base, tmp_path / "imported")
    assert sha256_file(out / "model.safetensors") == sha256_file(tiny_base / "model.safetensors")
    stage = read_lineage(out)["stages"][0]
    assert stage["stage"] == "import"
    assert stage["inputs"]["model.safetensors"]["sha256"] == sha256_file(tiny_base / "model.safetensors")
    assert stage["outputs"]["tokenizer.json"]["sha256"] == sha256_file(out / "tokenizer.json")


def test_sharded_fp32_folder_is_merged_into_one_bf16_file(tiny_base, tmp_path):
    from safetensors.torch import save_file

    source = tmp_path / "sharded"
    source.mkdir()
    tensors = load_file(tiny_base / "model.safetensors")
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    for shard, members in shards.items():
        save_file({n: tensors[n].float() for n in members}, str(source / shard))
    weight_map = {n: shard for shard, members in shards.items() for n in members}
    (source / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (source / "stray.safetensors").write_bytes(b"not weights")  # not in the index: never read
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (source / name).write_bytes((tiny_base / name).read_bytes())
    out = import_base(source, tmp_path / "imported")
    got = load_file(out / "model.safetensors")
    assert set(got) == set(tensors) and all(torch.equal(got[n], tensors[n]) for n in tensors)
    assert not (out / "model.safetensors.index.json").exists()
    assert read_lineage(out)["stages"][0]["config"]["weights_copied_verbatim"] is False


def test_gguf_round_trip_gives_the_same_tensors_and_tokenizer(tiny_base, tmp_path):
    expected = write_gguf(tmp_path / "tiny.gguf", tiny_base)
    out = import_base(tmp_path / "tiny.gguf", tmp_path / "imported")
    got = load_file(out / "model.safetensors")
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name].float(), torch.from_numpy(value)), name
    config = json.loads((out / "config.json").read_text())
    base_config = json.loads((tiny_base / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert config[key] == base_config[key], key
    text = "What is two plus two? <|im_start|>user\nHello!<|im_end|> 3 + 4 = 7"
    want = Tokenizer.from_file(str(tiny_base / "tokenizer.json")).encode(text).ids
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids == want
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and "im_start" in tok_config["chat_template"]
    assert read_lineage(out)["stages"][0]["inputs"]["tiny.gguf"]["sha256"] == sha256_file(tmp_path / "tiny.gguf")


def rope_interleaved(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's RoPE: rotates adjacent pairs (2i, 2i+1)."""
    d = x.shape[-1]
    angle = pos[:, None] * (1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))[None]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = even * angle.cos() - odd * angle.sin()
    out[..., 1::2] = even * angle.sin() + odd * angle.cos()
    return out


def rope_half(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """HF's RoPE: rotates halves (i, i + d/2)."""
    d = x.shape[-1]
    angle = pos[:, None] * (1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))[None]
    angle = torch.cat([angle, angle], dim=-1)
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * angle.cos() + rotated * angle.sin()


def test_quantized_gguf_attention_matches_llama_cpp_semantics(tiny_base, tmp_path):
    """Dequantized, un-permuted q/k under HF RoPE give the attention scores llama.cpp computes."""
    names = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight", "model.embed_tokens.weight"}
    expected = write_gguf(tmp_path / "q8.gguf", tiny_base, quantize=names)
    out = import_base(tmp_path / "q8.gguf", tmp_path / "imported")
    got = load_file(out / "model.safetensors")
    embed = torch.from_numpy(expected["model.embed_tokens.weight"])
    assert torch.equal(got["model.embed_tokens.weight"].float(), embed.to(torch.bfloat16).float())
    x = torch.randn(6, embed.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(6, dtype=torch.float64)
    head_dim = 16
    q_gguf = torch.from_numpy(expected["model.layers.0.self_attn.q_proj.weight"]).double().to(torch.bfloat16).double()
    k_gguf = torch.from_numpy(expected["model.layers.0.self_attn.k_proj.weight"]).double().to(torch.bfloat16).double()
    q_hf = got["model.layers.0.self_attn.q_proj.weight"].double()
    k_hf = got["model.layers.0.self_attn.k_proj.weight"].double()
    for head in range(4):
        kv = head // 2
        rows_q, rows_k = slice(head * head_dim, (head + 1) * head_dim), slice(kv * head_dim, (kv + 1) * head_dim)
        ref = rope_interleaved(x @ q_gguf[rows_q].T, pos, 1e4) @ rope_interleaved(x @ k_gguf[rows_k].T, pos, 1e4).T
        ours = rope_half(x @ q_hf[rows_q].T, pos, 1e4) @ rope_half(x @ k_hf[rows_k].T, pos, 1e4).T
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-9)


def test_bad_sources_name_the_file(tiny_base, tmp_path):
    with pytest.raises(A2DError, match="does not exist"):
        import_base(tmp_path / "nope", tmp_path / "out")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(A2DError, match="junk.gguf"):
        import_base(junk, tmp_path / "out2")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text((tiny_base / "config.json").read_text())
    with pytest.raises(A2DError, match="model.safetensors"):
        import_base(empty, tmp_path / "out3")
    assert not (tmp_path / "out3").exists()
