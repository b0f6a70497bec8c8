"""The reference model: parity with transformers, and the block-causal mask of docs/decoding.md."""

from __future__ import annotations

import pytest
import torch

from a2d_convert.model import BlockForward, block_causal_mask, causal_mask, load_transformer
from a2d_convert.tiny import TinySpec

ARCHS = {
    "llama_gqa2_untied": TinySpec(arch="llama", heads=4, kv_heads=2),
    "llama_gqa4_tied_bias_headdim": TinySpec(arch="llama", heads=8, kv_heads=2, head_dim=12, tie_embeddings=True, attention_bias=True),
    "qwen2_bias": TinySpec(arch="qwen2", heads=4, kv_heads=2, seed=1),
    "qwen3_qknorm": TinySpec(arch="qwen3", heads=4, kv_heads=1, head_dim=32, layers=3, seed=2),
}


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("name", ARCHS)
def test_causal_logits_match_transformers(tiny_models, name):
    from transformers import AutoModelForCausalLM

    base, _ = tiny_models(name, ARCHS[name])
    ours, cfg, _ = load_transformer(base)
    ref = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, attn_implementation="eager").eval()
    expected_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[cfg.model_type]
    assert type(ref).__name__ == expected_class
    ids = torch.randint(0, cfg.vocab_size, (2, 23), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(23)[None].expand(2, -1)
    with torch.no_grad():
        hidden, _ = ours(ids, positions, causal_mask(23)[None].expand(2, -1, -1))
        got, want = ours.logits(hidden), ref(ids).logits
    assert rel_err(got, want) <= 1e-5


def full_block_forward(model, cached, commit, window):
    """Logits of commit ++ window rows from one cache-free forward over cached ++ commit ++ window."""
    n, C, W = len(cached), len(commit), len(window)
    mask = block_causal_mask(0, n + C, W)
    ids = torch.tensor([cached + commit + window])
    with torch.no_grad():
        hidden, _ = model(ids, torch.arange(n + C + W)[None], mask[None])
        return model.logits(hidden[0, n:])


def test_cached_forward_equals_one_long_forward(tiny_models):
    model, _, a2d = load_transformer(tiny_models("qwen3_qknorm", ARCHS["qwen3_qknorm"])[1])
    m = a2d.mask_token_id
    cached, commit, window = [5, 9, 31, 77, 2, 100], [13, 14, 15], [40, m, 41, m]
    step = BlockForward(model)
    step(cached[:4], [], [])
    step(cached[4:], [], [])
    got = step(commit, window, list(range(7)))
    assert step.cache.length == len(cached) + len(commit)
    assert rel_err(got, full_block_forward(model, cached, commit, window)) <= 1e-5


def test_block_causal_mask_layout():
    mask = block_causal_mask(cached=2, commit=2, window=3)
    expected = torch.tensor([
        [1, 1, 1, 0, 0, 0, 0],  # commit row 0 (position 2): causal
        [1, 1, 1, 1, 0, 0, 0],  # commit row 1 (position 3)
        [1, 1, 1, 1, 1, 1, 1],  # window rows: everything committed and the whole window
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_window_is_bidirectional_and_commits_are_causal(llama_model):
    """Changing one token shows exactly which rows can see it."""
    model, _, a2d = load_transformer(llama_model)
    m = a2d.mask_token_id
    cached, commit, window = [7, 8, 9, 10], [20, 21, 22], [30, m, m, m]

    def rows(commit_ids, window_ids):
        step = BlockForward(model)
        step(cached, [], [])
        return step(commit_ids, window_ids, list(range(len(commit_ids) + len(window_ids))))

    base = rows(commit, window)
    changed = lambda a, b: (a - b).abs().amax(dim=-1) > 1e-6  # noqa: E731

    # The last window token: every window row sees it (earlier ones too), no commit row does.
    diff = changed(rows(commit, window[:3] + [33]), base)
    assert diff.tolist() == [False, False, False, True, True, True, True]
    # The first window token: the same rows.
    diff = changed(rows(commit, [31] + window[1:]), base)
    assert diff.tolist() == [False, False, False, True, True, True, True]
    # The middle commit token: later commit rows and all window rows, never the earlier commit row.
    diff = changed(rows([20, 25, 22], window), base)
    assert diff.tolist() == [False, True, True, True, True, True, True]
