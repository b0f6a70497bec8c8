"""tiny-base and init: deterministic folders that follow docs/model-format.md."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from a2d_convert.config import load_config
from a2d_convert.tiny import IM_END, TinySpec, make_tiny_base


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "a2d_convert", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_tiny_base_is_deterministic_and_seeded(tmp_path):
    a = make_tiny_base(tmp_path / "a", TinySpec(seed=3))
    b = make_tiny_base(tmp_path / "b", TinySpec(seed=3))
    c = make_tiny_base(tmp_path / "c", TinySpec(seed=4))
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()


def test_tiny_base_cli_writes_a_loadable_base(tmp_path):
    out = tmp_path / "q3"
    result = run_cli("tiny-base", "--out", out, "--arch", "qwen3", "--layers", "3", "--hidden", "32", "--heads", "4", "--kv-heads", "1", "--head-dim", "16")
    assert result.returncode == 0, result.stderr
    cfg, a2d, raw = load_config(out)
    assert (cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim, cfg.qk_norm) == ("qwen3", 3, 32, 1, 16, True)
    assert a2d is None and cfg.vocab_size % 64 == 0
    tensors = load_file(out / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (16,)


def test_tiny_tokenizer_has_chatml_specials_and_template(tmp_path):
    from transformers import AutoTokenizer

    base = make_tiny_base(tmp_path / "b")
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(base)
    messages = [{"role": "user", "content": "What is two plus two?"}]
    text = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert text == "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert ids[0] == tok.token_to_id("<|im_start|>") and tok.token_to_id(IM_END) in ids
    assert tok.token_to_id("<think>") in ids
    # <think> is an added token that survives skip_special_tokens, ChatML markers do not.
    assert tok.decode(ids, skip_special_tokens=True) == "user\nWhat is two plus two?\nassistant\n<think>\n\n</think>\n\n"
    assert tok.decode(tok.encode("The cat sat on the mat.").ids) == "The cat sat on the mat."
    gen = json.loads((base / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.token_to_id("<|endoftext|>"), tok.token_to_id(IM_END)]


def test_init_puts_the_mask_in_the_first_padding_row(tiny_models):
    base, model = tiny_models("llama")
    base_cfg, _, _ = load_config(base)
    cfg, a2d, raw = load_config(model)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    emitted = max(Tokenizer.from_file(str(base / "tokenizer.json")).get_vocab().values()) + 1
    assert cfg.vocab_size == base_cfg.vocab_size > emitted
    assert a2d.mask_token_id == emitted and a2d.mask_token == "<|mask|>"
    assert tok.encode("a<|mask|>b", add_special_tokens=False).ids[1] == a2d.mask_token_id
    assert tok.decode([5, a2d.mask_token_id], skip_special_tokens=True) == tok.decode([5])
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    assert tok_config["mask_token"] == "<|mask|>" and tok_config["added_tokens_decoder"][str(emitted)]["special"]
    assert a2d.eos_token_ids == (tok.token_to_id("<|endoftext|>"), tok.token_to_id(IM_END))
    assert (a2d.block_size, a2d.shift_logits, a2d.trained, raw["a2d"]["format_version"]) == (4, True, False, 1)

    before, after = load_file(base / "model.safetensors"), load_file(model / "model.safetensors")
    assert set(before) == set(after)
    mean = before["model.embed_tokens.weight"][:emitted].float().mean(0).to(torch.bfloat16)
    assert torch.equal(after["model.embed_tokens.weight"][a2d.mask_token_id], mean)
    for name in before:
        if name != "model.embed_tokens.weight":
            assert torch.equal(before[name], after[name]), name
    rows = torch.ones(cfg.vocab_size, dtype=torch.bool)
    rows[a2d.mask_token_id] = False
    assert torch.equal(before["model.embed_tokens.weight"][rows], after["model.embed_tokens.weight"][rows])
    assert (model / "generation_config.json").read_bytes() == (base / "generation_config.json").read_bytes()


@pytest.mark.parametrize("tied", [False, True])
def test_init_appends_a_mask_row_when_the_vocab_is_full(tiny_models, tied):
    base, model = tiny_models(f"full_vocab_{tied}", TinySpec(vocab_multiple=1, tie_embeddings=tied), block_size=8, shift_logits=False)
    base_cfg, _, _ = load_config(base)
    cfg, a2d, _ = load_config(model)
    assert cfg.vocab_size == base_cfg.vocab_size + 1 and a2d.mask_token_id == base_cfg.vocab_size
    assert (a2d.block_size, a2d.shift_logits) == (8, False)
    after = load_file(model / "model.safetensors")
    assert after["model.embed_tokens.weight"].shape[0] == cfg.vocab_size
    if tied:
        assert "lm_head.weight" not in after
    else:
        assert after["lm_head.weight"].shape[0] == cfg.vocab_size
        assert not after["lm_head.weight"][-1].any()


def test_init_cli_refuses_to_overwrite(tiny_models, tmp_path):
    base, _ = tiny_models("llama")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    refused = run_cli("init", "--base", base, "--out", out)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert str(out) in refused.stderr and "--force" in refused.stderr
    assert (out / "keep.txt").exists()
    forced = run_cli("init", "--base", base, "--out", out, "--force", "--block-size", "2")
    assert forced.returncode == 0, forced.stderr
    assert not (out / "keep.txt").exists() and load_config(out)[1].block_size == 2
    again = run_cli("init", "--base", out, "--out", tmp_path / "again")
    assert again.returncode == 2 and "already an a2d model" in again.stderr
    onto_base = run_cli("init", "--base", base, "--out", base, "--force")
    assert onto_base.returncode == 2 and (base / "config.json").exists()
