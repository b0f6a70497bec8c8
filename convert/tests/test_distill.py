"""Self-distillation's generation (distill.py): seeded sampled responses, several processes merged in
prompt order, a time limit, and what the data manifest declares about them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from a2d_convert import distill as gen
from a2d_convert.data import MANIFEST_FILE, DataConfig, build_data, parse_source_flag
from a2d_convert.errors import A2DError
from a2d_convert.rng import SplitMix64, uniforms
from a2d_convert.tiny import make_tiny_base


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("distill") / "base")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    words = "river stone cloud tiger paper green music window garden orange bridge candle".split()
    rows = [{"prompt": f"Tell me about the {w}" + " please" * (i % 3), "id": i} for i, w in enumerate(words)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def distilled(base: Path, prompts: Path, out: Path, **options) -> tuple[list[dict], dict]:
    flags = ",".join(f"{k}={v}" for k, v in {"max_new_tokens": 8, "batch_size": 3, "name": "self", **options}.items())
    data = build_data([parse_source_flag(f"{prompts},kind=distill,base={base},{flags}")], base, out, DataConfig(block_size=4, seq_len=64))
    rows = [json.loads(line) for line in (data / "distill" / "self.jsonl").read_text().splitlines()]
    return rows, json.loads((data / MANIFEST_FILE).read_text())["sources"][0]["generator"]


def test_uniforms_are_splitmix64_streams():
    seeds = [0, 1, 2**64 - 1, gen.sample_seed(7, 12, 3)]
    table = uniforms(seeds, 5)
    for row, seed in zip(table, seeds):
        rng = SplitMix64(seed)
        assert row.tolist() == [rng.uniform() for _ in range(5)]
    assert len({gen.sample_seed(0, i, k) for i in range(50) for k in range(1, 4)}) == 150


def test_sampler_draws_by_inverse_cdf_over_the_nucleus():
    probs = torch.tensor([[0.05, 0.5, 0.0, 0.3, 0.15], [0.05, 0.5, 0.0, 0.3, 0.15]])
    scores = torch.log(probs)
    for u in (0.0, 0.3, 0.62, 0.63, 0.99):
        rows = torch.tensor([[u], [u]], dtype=torch.float64)
        out = gen.make_sampler(rows, temperature=1.0, top_p=0.7, prompt_width=0)(torch.zeros((2, 0), dtype=torch.long), scores.clone())
        # nucleus {1: 0.5, 3: 0.3} in descending order; r = u * 0.8
        want = 1 if u * 0.8 < 0.5 else 3
        assert (out.argmax(-1) == want).all() and torch.isfinite(out).sum() == 2
    # Without top-p the whole distribution is reachable, walked in descending probability.
    rows = torch.tensor([[0.999]], dtype=torch.float64)
    out = gen.make_sampler(rows, 1.0, 1.0, 0)(torch.zeros((1, 0), dtype=torch.long), scores[:1].clone())
    assert out.argmax(-1).item() == 0  # the least likely non-zero token is last


def test_batches_hold_at_most_batch_size_rows_and_batch_slots_slots():
    lengths = [5, 30, 10, 20, 10, 40, 5]
    plan = gen.plan_batches(lengths, 4, 0, batch_slots=100, max_new_tokens=10)
    # Sorted by length: 5, 5, 10, 10 | 20, 30 | 40 (4 x 20, 2 x 40 and 1 x 50 slots; a fifth row or a third would overflow).
    assert [[lengths[i] for i in b.indices] for b in plan] == [[5, 5, 10, 10], [20, 30], [40]]
    assert [b.start for b in plan] == [0, 4, 6]
    assert [len(b.indices) for b in gen.plan_batches(lengths, 4, 1)] == [4, 3, 4, 3]  # no slot bound; and the sampled pass
    lone = gen.plan_batches([500, 600], 8, 0, batch_slots=100, max_new_tokens=10)  # a prompt larger than the bound runs alone
    assert [b.indices for b in lone] == [[0], [1]]
    with pytest.raises(A2DError, match="batch_slots"):
        gen.plan_batches(lengths, 4, 0, batch_slots=-1)


def test_workers_and_batch_sizes_give_the_same_data_in_prompt_order(base, prompts, tmp_path):
    one, record = distilled(base, prompts, tmp_path / "one", samples=2, seed=5)
    two, record2 = distilled(base, prompts, tmp_path / "two", samples=2, seed=5, workers=2)
    assert one == two
    assert record2["batching"]["workers"] == 2 and record["batching"]["workers"] == 1
    assert not (tmp_path / "two" / "distill" / ".self.work").exists()
    # Prompt order, each prompt's main response first, then its (distinct) sampled ones.
    ids = [r["id"] for r in one]
    assert ids == sorted(ids) and set(ids) == set(range(12))
    for i in range(12):
        mine = [r for r in one if r["id"] == i]
        assert mine[0]["distill_response"] == {"sample": 0}
        assert [r["distill_response"]["sample"] for r in mine] == sorted(r["distill_response"]["sample"] for r in mine)
        assert len({tuple(r["response_ids"]) for r in mine}) == len(mine)
    # A sampled response depends on its own seed only, not on the batch it was generated in.
    single, _ = distilled(base, prompts, tmp_path / "single", samples=2, seed=5, batch_size=1)
    assert single == one
    slotted, record_slots = distilled(base, prompts, tmp_path / "slots", samples=2, seed=5, batch_size=12, batch_slots=40)
    assert slotted == one and record_slots["batching"]["batch_slots"] == 40
    # The greedy main responses carry the base's probability of each token; the sampled ones do not.
    for row in one:
        if row["distill_response"]["sample"]:
            assert "response_confidence" not in row
        else:
            assert len(row["response_confidence"]) == len(row["response_ids"])
            assert all(0 < c <= 1 for c in row["response_confidence"])
    other_seed, _ = distilled(base, prompts, tmp_path / "seed6", samples=2, seed=6)
    sampled = lambda rows: [r["response_ids"] for r in rows if r["distill_response"]["sample"]]  # noqa: E731
    assert sampled(other_seed) != sampled(one)
    assert [r["response_ids"] for r in other_seed if not r["distill_response"]["sample"]] == [
        r["response_ids"] for r in one if not r["distill_response"]["sample"]
    ]  # greedy main responses do not depend on the seed


def test_manifest_declares_the_sampled_responses(base, prompts, tmp_path):
    rows, generator = distilled(base, prompts, tmp_path / "d", samples=1, sample_temperature=1.2, sample_top_p=0.9, seed=3)
    sampled = generator["sampled"]
    assert sampled["per_prompt"] == 1 and sampled["temperature"] == 1.2 and sampled["top_p"] == 0.9 and "SplitMix64" in sampled["seeding"]
    by_kind = generator["responses_by_kind"]
    assert by_kind["main"] == 12 and by_kind["sampled"] + generator["duplicates_dropped"] == 12
    assert generator["responses"] == len(rows) == by_kind["main"] + by_kind["sampled"]
    for row in rows:
        if row["distill_response"]["sample"]:
            assert row["distill_response"]["seed"] == gen.sample_seed(3, row["id"], 1)
    assert generator["temperature"] == 0 and "unanswered" not in generator


def test_default_is_one_greedy_response_per_prompt(base, prompts, tmp_path):
    rows, generator = distilled(base, prompts, tmp_path / "d")
    assert len(rows) == 12 and all("distill_response" not in r for r in rows)
    assert generator["responses"] == 12 and "sampled" not in generator and generator["batching"]["workers"] == 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


def test_time_limit_answers_whole_batches_and_counts_the_rest(base, prompts, tmp_path, monkeypatch):
    monkeypatch.setattr(gen, "time", FakeClock())  # every clock read is one second later
    rows, generator = distilled(base, prompts, tmp_path / "d", samples=1, time_limit_s=6.5)
    # run() reads the clock once; each batch reads it three times (check, start, end): two batches fit.
    assert len({(r["id"], r["distill_response"]["sample"]) for r in rows}) + generator.get("duplicates_dropped", 0) == 6
    unanswered = generator["unanswered"]
    assert unanswered["main"] + unanswered["sampled"] == 24 - 6 and unanswered["why"] == "time_limit_s"
    assert generator["batching"]["batches_answered"] == 2 and generator["batching"]["batches"] == 8
    monkeypatch.setattr(gen, "time", FakeClock())
    with pytest.raises(A2DError, match="time_limit_s"):
        distilled(base, prompts, tmp_path / "none", time_limit_s=0.5)


def test_bad_sampling_options_are_named(base, prompts, tmp_path):
    with pytest.raises(A2DError, match="sample_temperature"):
        distilled(base, prompts, tmp_path / "a", samples=1, sample_temperature=0)
    with pytest.raises(A2DError, match="workers"):
        distilled(base, prompts, tmp_path / "b", workers=-1)
    assert np.all(uniforms([1], 3) < 1)


def test_static_cache_greedy_answers_as_the_one_by_one_reference(base):
    """greedy_static (left-padded prefill, preallocated cache) gives every prompt exactly the tokens of greedy
    decoding it alone with the reference's growing KV cache, EOS cuts included."""
    from a2d_convert.model import load_transformer
    from a2d_convert.probes import ar_answer

    model, cfg, _ = load_transformer(base)
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, cfg.vocab_size, size=n)] for n in (1, 5, 9, 2, 17, 5)]
    alone = [ar_answer(model, p, 12, set())[0] for p in prompts]
    assert gen.greedy_static(model, prompts, 12, set(), pad_id=0) == alone
    eos = {alone[1][4]}  # a token one answer emits mid-way: that answer stops there, EOS kept
    cut = gen.greedy_static(model, prompts, 12, eos, pad_id=0)
    for got, full in zip(cut, alone):
        end = next((k for k, t in enumerate(full) if t in eos), None)
        assert got == (full if end is None else full[: end + 1])
    assert len(cut[1]) <= 5
    with pytest.raises(A2DError, match="max_new_tokens"):
        gen.greedy_static(model, prompts, 0, set(), pad_id=0)


def random_gqa_model(seed: int = 0):
    """A tiny random Llama with SmolLM2's head grouping (three query heads per KV head), tied embeddings."""
    from a2d_convert.config import ModelConfig
    from a2d_convert.model import Transformer

    cfg = ModelConfig(
        architecture="LlamaForCausalLM", model_type="llama", hidden_size=48, intermediate_size=96, num_layers=2,
        num_heads=6, num_kv_heads=2, head_dim=8, vocab_size=97, rms_norm_eps=1e-5, rope_theta=10000.0,
        max_position_embeddings=512, tie_word_embeddings=True, qkv_bias=False, o_bias=False, qk_norm=False,
    )
    model = Transformer(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.ones_like(p) if name.endswith("norm.weight") else torch.randn(p.shape, generator=generator) * 0.5)
    return model.eval()


def greedy_alone(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy decoding of one prompt by recomputing the whole sequence every token: no cache, no padding."""
    from a2d_convert.model import causal_mask

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            T = len(ids)
            hidden, _ = model(torch.tensor([ids]), torch.arange(T)[None], causal_mask(T)[None])
            ids.append(int(model.logits(hidden[0, -1]).argmax()))
    return ids[len(prompt):]


def test_a_batch_cache_is_freed_when_its_answers_return(monkeypatch):
    """Each greedy_static call frees its KV cache as it returns, without the cyclic collector: distill runs one
    large batch after another, and a cache held until a collection (the cache and its layers referring to each
    other) kept several batches' caches in GPU memory at once."""
    import gc
    import weakref

    from a2d_convert import model as reference

    made = []
    init = reference.StaticCache.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(reference.StaticCache, "__init__", record)
    model = random_gqa_model(2)
    enabled = gc.isenabled()
    gc.disable()
    try:
        for n in (3, 6):
            gen.greedy_static(model, [[5, 9, 14][:n % 3 + 1], [7] * n], 20, set(), pad_id=0, graph=False, with_confidence=True)
        alive = sum(ref() is not None for ref in made)
    finally:
        if enabled:
            gc.enable()
    assert made and alive == 0


def test_greedy_answers_carry_the_probability_of_each_token():
    """greedy_static(with_confidence=True): beside each answer, the softmax probability the model gave each of its
    tokens, as decoding the prompt alone computes it; cut after EOS with the answer."""
    from a2d_convert.model import causal_mask

    model = random_gqa_model(2)
    prompts = [[5, 9, 14], [7] * 11, [3]]
    answers, confidences = gen.greedy_static(model, prompts, 9, set(), pad_id=0, graph=False, with_confidence=True)
    assert answers == gen.greedy_static(model, prompts, 9, set(), pad_id=0, graph=False)
    for prompt, answer, probabilities in zip(prompts, answers, confidences):
        ids = prompt + answer
        with torch.no_grad():
            hidden, _ = model(torch.tensor([ids]), torch.arange(len(ids))[None], causal_mask(len(ids))[None])
            want = model.logits(hidden[0, len(prompt) - 1 : -1]).float().softmax(-1).amax(-1)
        assert len(probabilities) == len(answer)
        assert np.allclose(probabilities, want.numpy(), atol=1e-5)
    eos = {answers[1][3]}
    cut, cut_confidences = gen.greedy_static(model, prompts, 9, eos, pad_id=0, with_confidence=True)
    assert [len(c) for c in cut_confidences] == [len(a) for a in cut]


def test_decode_spans_double_from_the_first_past_the_prompts():
    assert gen.decode_spans(17, 160) == [128, 160]
    assert gen.decode_spans(130, 1040) == [256, 512, 1024, 1040]
    assert gen.decode_spans(5, 64) == [64]
    assert gen.decode_spans(128, 144) == [144]


def test_static_steps_answer_as_greedy_decoding_alone_across_spans_and_eos():
    """The decode step greedy_static captures in a CUDA graph, run eagerly (as on a CPU): prompts of different
    lengths, left-padded, decoded past the first span (128 slots) into the next, give every prompt the tokens of
    decoding it alone; EOS cuts each answer after its first EOS, and the decoding stops once every row has one."""
    model = random_gqa_model()
    rng = np.random.default_rng(7)
    prompts = [[int(t) for t in rng.integers(0, 97, size=n)] for n in (3, 17, 1, 8, 12)]
    new = 140  # slots up to 17 + 138: spans [128, 160]
    alone = [greedy_alone(model, p, new) for p in prompts]
    assert len({tuple(a[:20]) for a in alone}) == len(prompts)  # answers that differ, so rows cannot be swapped
    assert gen.greedy_static(model, prompts, new, set(), pad_id=0, graph=False) == alone
    eos = {alone[0][130], alone[3][5]}  # one answer ends past the first span, one early
    cut = gen.greedy_static(model, prompts, new, eos, pad_id=0)
    for got, full in zip(cut, alone):
        end = next((k for k, t in enumerate(full) if t in eos), None)
        assert got == (full if end is None else full[: end + 1])
    assert len(cut[3]) <= 6

    forwards = []
    model.forward = lambda *args, **kwargs: forwards.append(1) or type(model).forward(model, *args, **kwargs)
    every = set(range(97))  # every row emits EOS at once: one prefill and 15 steps before the 16-step check
    assert gen.greedy_static(model, prompts, new, every, pad_id=0) == [a[:1] for a in alone]
    assert len(forwards) == gen.EOS_CHECK_EVERY


def test_a_batch_goes_on_with_its_running_rows_alone_with_the_same_answers(base, monkeypatch):
    """Once most rows have emitted EOS, greedy_static continues with the others alone (GreedySteps.keep: the cache
    compacted in place): every answer and probability is the one decoding without compaction gives, and the one
    decoding the prompt alone gives."""
    from a2d_convert.model import load_transformer
    from a2d_convert.probes import ar_answer

    model, cfg, _ = load_transformer(base)
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, cfg.vocab_size, size=n)] for n in (3, 7, 1, 12, 4, 9, 2, 6)]
    n_new = 80
    alone = [ar_answer(model, p, n_new, set())[0] for p in prompts]
    # EOS tokens that end some answers before the first check (16 steps), some before the second, some never.
    eos = {alone[0][5], alone[1][9], alone[2][20], alone[3][30]}
    want = []
    for full in alone:
        end = next((k for k, t in enumerate(full) if t in eos), None)
        want.append(full if end is None else full[: end + 1])
    assert sum(len(w) <= 32 for w in want) >= 3 and any(len(w) == n_new for w in want)
    kept_sizes = []
    keep = gen.GreedySteps.keep
    monkeypatch.setattr(gen.GreedySteps, "keep", lambda self, rows: kept_sizes.append(rows.numel()) or keep(self, rows))
    compacted, compacted_p = gen.greedy_static(model, prompts, n_new, eos, pad_id=0, with_confidence=True, compact_at=0.75)
    assert kept_sizes and all(0 < n < len(prompts) for n in kept_sizes)
    compactions = len(kept_sizes)
    plain, plain_p = gen.greedy_static(model, prompts, n_new, eos, pad_id=0, with_confidence=True, compact_at=0)
    assert len(kept_sizes) == compactions
    assert compacted == plain == want
    for a, b in zip(compacted_p, plain_p):
        assert np.allclose(a, b, atol=1e-6)
