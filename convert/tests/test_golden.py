"""Golden files (docs/golden-format.md): layout, logits recomputed without the cache, runs replayed."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from a2d_convert.decode import decode
from a2d_convert.decoding import DecodeParams
from a2d_convert.errors import A2DError
from a2d_convert.golden import CASES, write_golden
from a2d_convert.model import BlockForward, block_causal_mask, load_transformer
from a2d_convert.prompts import load_prompt_codec

# One case with shift_logits false and QK-norm, one whose mask row was appended (block size 2), the mask
# adapter, the window adapter, the window rule (its attention without factors), and FP8 weights.
SOME = ["qwen3_qknorm", "llama_appended_mask", "llama_mask_adapter", "llama_window_adapter", "llama_window_rule", "llama_fp8"]
PARAM_KEYS = {"max_tokens", "block_size", "threshold", "min_per_step", "steps", "temperature", "top_p", "remasking", "advance", "commit", "reveal_order", "seed", "eos_token_ids"}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden")
    write_golden(out, seed=0, cases=SOME)
    return out


def load_case(golden, name):
    return json.loads((golden / name / "golden.json").read_text()), load_file(golden / name / "golden.safetensors")


def test_layout_and_rng_vectors(golden):
    assert json.loads((golden / "index.json").read_text()) == {"format_version": 1, "seed": 0, "cases": SOME}
    vectors = json.loads((golden / "rng.json").read_text())["splitmix64"]
    assert [v["seed"] for v in vectors] == ["0", "1234", str(2**64 - 1)]
    assert vectors[0]["u64"][:3] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4", "0x06c45d188009454f"]
    assert vectors[0]["uniform"][0] == (0xE220A8397B1DCDAF >> 11) * 2.0**-53 == 0.8833108082136426
    for name in SOME:
        data, _ = load_case(golden, name)
        assert data["case"] == name and data["format_version"] == 1 and data["model"] == "model"
        _, cfg, a2d = load_transformer(golden / name / "model")
        assert a2d.block_size == CASES[name].block_size and a2d.shift_logits == CASES[name].shift_logits
        assert a2d.trained is False and cfg.model_type == CASES[name].arch
    _, cfg, a2d = load_transformer(golden / "llama_appended_mask" / "model")
    assert a2d.mask_token_id == cfg.vocab_size - 1  # no padding rows, so init appended the mask
    fp8 = load_file(golden / "llama_fp8" / "model" / "model.safetensors")  # quantized: e4m3 projections and head
    assert load_transformer(golden / "llama_fp8" / "model")[2].precision == "fp8-e4m3"
    assert fp8["lm_head.weight"].dtype == torch.float8_e4m3fn and fp8["lm_head.weight_scale"].dtype == torch.float32


def cache_free_logits(model, cached, commit, window):
    """All commit ++ window rows from one forward over the whole sequence, no KV cache involved."""
    n = len(cached)
    ids = torch.tensor([cached + commit + window])
    positions = torch.arange(ids.shape[1])
    rule = model.attention_rule  # a row adapter's model: its rule for the revealed window rows
    start = n + len(commit)
    revealed = None if rule is None else [t != model.mask_token_id for t in window]
    mask = block_causal_mask(0, start, len(window), revealed=revealed, rule=rule or "mask")
    with torch.no_grad():
        hidden, _ = model(ids, positions[None], mask[None], window_rows=positions[None] >= start)
        return model.logits(hidden[0, n:])


@pytest.mark.parametrize("name", SOME)
def test_logits_match_a_cache_free_forward(golden, name):
    data, tensors = load_case(golden, name)
    model, cfg, a2d = load_transformer(golden / name / "model")
    B = a2d.block_size
    prefill, cached = data["forwards"][:2]
    lead = prefill["window_ids"][: a2d.anchor_in_window]  # the anchor, in the window adapter's layout
    assert tensors["prompt_ids"].dtype == torch.int32 and tensors["prompt_ids"].tolist() == prefill["commit_ids"] + lead
    assert prefill["cached_ids"] == [] and prefill["window_ids"][a2d.anchor_in_window:] == [a2d.mask_token_id] * B
    assert cached["cached_ids"] == prefill["commit_ids"] + lead and a2d.mask_token_id in cached["window_ids"]
    assert len(cached["window_ids"]) == B + a2d.anchor_in_window and any(t != a2d.mask_token_id for t in cached["window_ids"])
    for f in data["forwards"]:
        got = tensors[f"logits_{f['name']}"]
        assert got.dtype == torch.float32 and got.shape == (len(f["commit_ids"]) + len(f["window_ids"]), cfg.vocab_size)
        want = cache_free_logits(model, f["cached_ids"], f["commit_ids"], f["window_ids"])
        assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5


@pytest.mark.parametrize("name", SOME)
def test_decode_runs_replay_exactly(golden, name):
    data, _ = load_case(golden, name)
    model, _, a2d = load_transformer(golden / name / "model")
    runs = {r["name"]: r for r in data["decodes"]}
    assert list(runs) == [
        "greedy_fused", "greedy_separate", "min_per_step_2", "steps_schedule", "max_tokens_odd", "eos_stop",
        "sample_top_p", "sample_full", "remask_random", "remask_leftmost", "threshold_low", "reveal_prefix", "block_2", "block_4", "block_8",
        "slide", "slide_mid", "slide_leftmost", "slide_sample",
    ]
    assert [f["name"] for f in data["forwards"]] == ["prefill", "cached"]
    for run in data["decodes"]:
        assert set(run["params"]) == PARAM_KEYS
        params = DecodeParams(**{**run["params"], "eos_token_ids": tuple(run["params"]["eos_token_ids"])})
        result = decode(BlockForward(model), run["prompt_ids"], params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits,
                        anchor_in_window=a2d.anchor_in_window, trace=True)
        assert result.token_ids == run["token_ids"] and result.finish_reason == run["finish_reason"]
        assert result.forward_passes == run["forward_passes"] and len(result.trace) == len(run["trace"])
        for ours, theirs in zip(result.trace, run["trace"]):
            assert [ours["forward"], ours["block_start"], ours["step"], list(ours["candidates"])] == [theirs["forward"], theirs["block_start"], theirs["step"], theirs["candidates"]]
            assert [[j, t] for j, t, _ in ours["revealed"]] == [[j, t] for j, t, _ in theirs["revealed"]]
            assert all(abs(c - c2) <= 1e-12 for (_, _, c), (_, _, c2) in zip(ours["revealed"], theirs["revealed"]))
    greedy = runs["greedy_fused"]
    assert runs["greedy_separate"]["token_ids"] == greedy["token_ids"]
    assert runs["greedy_separate"]["forward_passes"] > greedy["forward_passes"]
    stop = runs["eos_stop"]
    assert stop["finish_reason"] == "stop" and stop["token_ids"] == greedy["token_ids"][: len(stop["token_ids"])]
    assert stop["params"]["eos_token_ids"][0] not in stop["token_ids"]
    odd = runs["max_tokens_odd"]
    assert odd["params"]["max_tokens"] % odd["params"]["block_size"] and len(odd["token_ids"]) == odd["params"]["max_tokens"]
    assert [runs[f"block_{b}"]["params"]["block_size"] for b in (2, 4, 8)] == [2, 4, 8]
    for name in ("slide", "slide_leftmost"):  # each moved its window mid-block at least once
        run, B = runs[name], runs[name]["params"]["block_size"]
        assert any((s["block_start"] - len(run["prompt_ids"])) % B for s in run["trace"]), name


@pytest.mark.parametrize("name", SOME)
def test_tokenization_entries(golden, name):
    data, _ = load_case(golden, name)
    codec = load_prompt_codec(golden / name / "model")
    kinds = [t["kind"] for t in data["tokenization"]]
    assert kinds == ["plain", "chat", "chat", "decode"]
    for entry in data["tokenization"]:
        if entry["kind"] == "plain":
            assert entry["ids"] == codec.encode_plain(entry["text"])
        elif entry["kind"] == "chat":
            assert entry["rendered"] == codec.render_chat(entry["messages"], entry["enable_thinking"])
            assert entry["ids"] == codec.encode_chat(entry["messages"], entry["enable_thinking"])
        else:
            assert entry["text"] == codec.decode(entry["ids"])
    chats = [t for t in data["tokenization"] if t["kind"] == "chat"]
    assert chats[0]["ids"] != chats[1]["ids"]


def test_same_seed_same_files(golden, tmp_path):
    name = "llama_appended_mask"
    write_golden(tmp_path, seed=0, cases=[name])
    for path in ("golden.json", "golden.safetensors", "model/model.safetensors", "model/tokenizer.json", "model/config.json"):
        assert (tmp_path / name / path).read_bytes() == (golden / name / path).read_bytes(), path


def test_refuses_to_overwrite_and_unknown_cases(golden, tmp_path):
    with pytest.raises(A2DError, match="folder is not empty; choose an empty --out or pass --force"):
        write_golden(golden, cases=SOME)
    with pytest.raises(A2DError, match="--case 'gpt2' is not a golden case"):
        write_golden(tmp_path / "new", cases=["gpt2"])
