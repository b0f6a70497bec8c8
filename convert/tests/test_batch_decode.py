"""Batched decoding (decode.decode_batch over model.BatchBlockForward, and the batched AR base of
evaluate-probes) makes the same decisions as decoding each sequence alone."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from a2d_convert.decode import decode, decode_batch
from a2d_convert.decoding import DecodeParams
from a2d_convert.model import BatchBlockForward, BlockForward, load_transformer
from a2d_convert.probes import ar_answer, ar_answers, evaluate_probes, generated_probes
from a2d_convert.tiny import TinySpec


def prompts_of(vocab: int, mask: int, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    ids = [t for t in range(3, min(vocab, 300)) if t != mask]
    return [rng.sample(ids, rng.randint(1, 23)) for _ in range(n)]


def params_grid(a2d, n: int, eos: int) -> list[DecodeParams]:
    """A different decoding for every sequence: thresholds, floors, schedules, sampling, commit policy, EOS."""
    variants = [
        {"threshold": 0.9},
        {"threshold": 0.5},
        {"threshold": 0.05},
        {"threshold": 1.0, "steps": 2},
        {"threshold": 0.7, "min_per_step": 2},
        {"threshold": 0.6, "commit": "separate"},
        {"threshold": 0.8, "temperature": 1.0, "top_p": 0.9, "seed": 11},
        {"threshold": 0.3, "temperature": 0.7, "seed": 5, "remasking": "random"},
        {"threshold": 0.9, "eos_token_ids": (eos,)},
        {"threshold": 0.2, "eos_token_ids": (eos,), "commit": "separate"},
        {"threshold": 0.5, "max_tokens": 0},
        {"threshold": 0.5, "max_tokens": 7},
    ]
    # The last eight sequences slide their windows, so their commits change length every forward.
    sliding = [
        {"threshold": 0.9, "advance": "slide"},
        {"threshold": 0.3, "advance": "slide", "temperature": 0.8, "seed": 3, "eos_token_ids": (eos,)},
        {"threshold": 0.5, "advance": "slide", "commit": "separate", "min_per_step": 2},
        {"threshold": 0.6, "advance": "slide", "remasking": "leftmost", "max_tokens": 9},
    ]
    out = []
    for i in range(n):
        v = {"max_tokens": 17, "eos_token_ids": (), **(sliding[i % 4] if i >= n - 8 else variants[i % len(variants)])}
        max_tokens, eos_ids = v.pop("max_tokens"), v.pop("eos_token_ids")
        out.append(DecodeParams.from_defaults(a2d.decoding, block_size=a2d.block_size, max_tokens=max_tokens, eos_token_ids=eos_ids, **v))
    return out


def decisions(result):
    return [[(j, t) for j, t, _ in step["revealed"]] for step in result.trace]


@pytest.mark.parametrize("name,spec,init", [
    ("llama", TinySpec(), {}),
    ("batch_qwen3_noshift", TinySpec(arch="qwen3", seed=3), {"block_size": 8, "shift_logits": False}),
])
def test_batched_decoding_equals_one_by_one(tiny_models, name, spec, init):
    model_dir = tiny_models(name, spec, **init)[1]
    model, cfg, a2d = load_transformer(model_dir)
    prompts = prompts_of(cfg.vocab_size, a2d.mask_token_id, 30, seed=len(name))
    # An EOS the model does produce (its most frequent output token), so some sequences stop early.
    produced = Counter()
    for ids in prompts[:12]:
        produced.update(decode(BlockForward(model), ids, DecodeParams(max_tokens=12, block_size=a2d.block_size, threshold=0.5),
                               mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits).token_ids)
    params = params_grid(a2d, len(prompts), eos=produced.most_common(1)[0][0])
    alone = [
        decode(BlockForward(model), ids, p, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits, trace=True)
        for ids, p in zip(prompts, params)
    ]
    forward = BatchBlockForward(model, len(prompts))
    together = decode_batch(forward, prompts, params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits, trace=True, threads=3)
    for one, batched in zip(alone, together):
        assert batched.token_ids == one.token_ids
        assert batched.forward_passes == one.forward_passes and batched.finish_reason == one.finish_reason
        assert decisions(batched) == decisions(one)
        conf = lambda r: [c for s in r.trace for _, _, c in s["revealed"]]  # noqa: E731
        assert np.allclose(conf(batched), conf(one), rtol=0, atol=1e-5)
    assert any(r.finish_reason == "stop" for r in alone) and any(r.token_ids == [] for r in alone)
    assert len({len(r.token_ids) for r in alone}) > 3
    # Lockstep: one batched forward per step of the longest sequence, not one per sequence.
    assert forward.forwards == max(r.forward_passes for r in alone) < sum(r.forward_passes for r in alone) / 4


def test_a_batched_forward_that_wants_no_logits(tiny_models):
    """Every sequence only commits (its last block): no logits rows, and the cache still grows as one by one."""
    model, cfg, a2d = load_transformer(tiny_models("llama")[1])
    prompts = prompts_of(cfg.vocab_size, a2d.mask_token_id, 3, seed=4)
    batch = BatchBlockForward(model, len(prompts))
    out = batch([(ids, [], []) for ids in prompts])
    assert [tuple(o.shape) for o in out] == [(0, cfg.vocab_size)] * len(prompts)
    window = [a2d.mask_token_id] * 4
    after = batch([([5], window, [1, 2, 3, 4])] * len(prompts))
    for ids, got in zip(prompts, after):
        alone = BlockForward(model)
        alone(ids, [], [])
        np.testing.assert_allclose(got, alone([5], window, [1, 2, 3, 4]).numpy(), rtol=1e-4, atol=1e-4)


def test_batched_ar_equals_one_by_one(tiny_models):
    model, cfg, a2d = load_transformer(tiny_models("llama")[0])
    prompts = prompts_of(cfg.vocab_size, -1, 13, seed=9)
    eos = {ar_answer(model, prompts[0], 8, set())[0][3]}
    alone = [ar_answer(model, ids, 15, eos) for ids in prompts]
    assert ar_answers(model, prompts, 15, eos, batch_size=5, threads=2) == alone
    assert any(len(tokens) < 15 for tokens, _ in alone) and any(len(tokens) == 15 for tokens, _ in alone)


def test_evaluate_probes_batched_equals_one_by_one(tiny_models, tmp_path):
    base, model = tiny_models("llama")
    probes = generated_probes(2, seed=4)
    details = {}
    reports = {}
    for batch in (1, 9):
        details[batch] = tmp_path / f"b{batch}.jsonl"
        reports[batch] = evaluate_probes(model, base, probes, [0.9, 0.3], max_tokens=10, tolerance=0.0, details=details[batch], batch_size=batch, threads=2)
    rows = {b: [json.loads(line) for line in path.read_text().splitlines()] for b, path in details.items()}
    assert len(rows[9]) == 3 * len(probes) and rows[9] == rows[1]
    assert reports[9] == reports[1]


def test_block_size_one_is_refused_and_another_block_size_is_only_a_diagnostic(tiny_models, tmp_path):
    """Block size 1 is left-to-right decoding: refused. Another block size than the model's gives a report
    that recommends nothing and that export refuses."""
    from a2d_convert.errors import A2DError
    from a2d_convert.export import decoder_choice

    base, model = tiny_models("llama")
    probes = generated_probes(1, seed=4)
    with pytest.raises(A2DError, match="block_size is 1"):
        evaluate_probes(model, base, probes, [0.9], max_tokens=10, tolerance=0.0, batch_size=9, block_size=1)
    report = evaluate_probes(model, None, probes, [0.9], max_tokens=10, tolerance=0.0, batch_size=9, block_size=8)
    assert report["block_size"] == 8 and "recommended" not in report and "block size 8, not the model's 4" in report["diagnostic"]
    details = tmp_path / "own.jsonl"
    own = evaluate_probes(model, base, probes, [0.9, 0.5], max_tokens=10, tolerance=0.0, batch_size=9, overrides={"advance": "slide"}, details=details)
    again = evaluate_probes(model, None, probes, [0.9, 0.5], max_tokens=10, tolerance=0.0, batch_size=9, overrides={"advance": "slide"},
                            base_answers_from=details)
    assert again["base"] == own["base"] and again["model"] == own["model"]
    with pytest.raises(A2DError, match="not of these"):
        evaluate_probes(model, None, probes, [0.9], max_tokens=9, tolerance=0.0, batch_size=9, base_answers_from=details)
    assert own["block_size"] == 4 and own["decoding"]["advance"] == "slide" and "threshold" in own["recommended"]
    assert own["aup"]["value"] >= 0 and own["aup"]["reference_accuracy"] == own["base"]["accuracy"]
    for row in own["model"].values():
        assert 0 <= row["parallel_share"] <= 1 and 0 <= row["topup_share"] <= 1
    path = tmp_path / "b8.json"
    path.write_text(json.dumps(report))
    with pytest.raises(A2DError, match="block size 8.*own block size"):
        decoder_choice(json.loads((model / "config.json").read_text()), {}, path)
