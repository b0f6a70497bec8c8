"""Prompt tokenization (docs/model-format.md "Tokenizer and prompts") agrees with transformers."""

from __future__ import annotations

import json
import shutil

import pytest

from a2d_convert.errors import A2DError
from a2d_convert.prompts import load_prompt_codec

MESSAGES = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "What is two plus two? Answer with one word: \"four\" or ünïcode."},
]


def test_plain_chat_and_decode_match_transformers(llama_model):
    from transformers import AutoTokenizer

    ours, ref = load_prompt_codec(llama_model), AutoTokenizer.from_pretrained(llama_model)
    text = "The cat sat on the mat. <|im_end|> and 42"
    assert ours.encode_plain(text) == ref(text)["input_ids"]
    for thinking in (None, True, False):
        extra = {} if thinking is None else {"enable_thinking": thinking}
        want = ref.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False, **extra)
        assert ours.render_chat(MESSAGES, thinking) == want
        ids = ref.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=True, **extra)["input_ids"]
        assert ours.encode_chat(MESSAGES, thinking) == ids
    sample = ours.encode_chat(MESSAGES) + ours.encode_plain(" Paris")
    assert ours.decode(sample) == ref.decode(sample, skip_special_tokens=True)


def test_thinking_switch_changes_the_prompt(llama_model):
    codec = load_prompt_codec(llama_model)
    on, off = codec.render_chat(MESSAGES, None), codec.render_chat(MESSAGES, False)
    assert on.endswith("<|im_start|>assistant\n") and off == on + "<think>\n\n</think>\n\n"
    mask = json.loads((llama_model / "config.json").read_text())["a2d"]["mask_token_id"]
    assert mask not in codec.encode_chat(MESSAGES) and codec.decode([mask]) == ""


def test_bad_tokenizer_files(llama_model, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(llama_model, folder)
    (folder / "tokenizer.json").write_text("{broken")
    with pytest.raises(A2DError, match=r"tokenizer.json: not a readable tokenizer"):
        load_prompt_codec(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(A2DError, match=r"tokenizer.json: file not found"):
        load_prompt_codec(folder)
    shutil.copy(llama_model / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(A2DError, match=r"no chat template.*drop --chat"):
        load_prompt_codec(folder).encode_chat(MESSAGES)
    (folder / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    with pytest.raises(A2DError, match=r"chat template failed to render \(no system role\)"):
        load_prompt_codec(folder).encode_chat(MESSAGES)
