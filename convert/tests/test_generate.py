"""`python -m a2d_convert generate`: the JSON contract, defaults from the model, and bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from a2d_convert.__main__ import main
from a2d_convert.decode import decode
from a2d_convert.decoding import DecodeParams
from a2d_convert.model import BlockForward, load_transformer
from a2d_convert.prompts import load_prompt_codec

FIELDS = {"token_ids", "text", "completion_tokens", "forward_passes", "tokens_per_forward", "steps", "revealed", "topped_up", "ms", "finish_reason", "prompt_tokens"}


def generate(capsys, model, *flags):
    code = main(["generate", "--model", str(model), "--json", *flags])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_json_is_the_decoder_output(capsys, llama_model):
    got = generate(capsys, llama_model, "--prompt", "What is the capital of France?", "--chat", "--max-tokens", "10", "--block-size", "4", "--threshold", "0.5", "--min-per-step", "1", "--temperature", "0", "--seed", "3")
    assert set(got) == FIELDS
    codec = load_prompt_codec(llama_model)
    prompt = codec.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    model, _, a2d = load_transformer(llama_model)
    params = DecodeParams(max_tokens=10, block_size=4, threshold=0.5, seed=3, eos_token_ids=a2d.eos_token_ids)
    want = decode(BlockForward(model), prompt, params, mask_token_id=a2d.mask_token_id, shift_logits=a2d.shift_logits)
    assert got["token_ids"] == want.token_ids and got["forward_passes"] == want.forward_passes
    assert got["finish_reason"] == want.finish_reason and got["prompt_tokens"] == len(prompt)
    assert got["completion_tokens"] == len(got["token_ids"]) and got["text"] == codec.decode(got["token_ids"])
    assert got["tokens_per_forward"] == got["completion_tokens"] / got["forward_passes"] and got["ms"] > 0


def test_defaults_come_from_the_model(capsys, llama_model, tmp_path):
    changed = tmp_path / "m"
    shutil.copytree(llama_model, changed)
    config = json.loads((changed / "config.json").read_text())
    config["a2d"]["block_size"] = 2
    config["a2d"]["decoding"].update(threshold=0.2, min_per_step=2, commit="separate", temperature=0.7, top_p=0.8)
    (changed / "config.json").write_text(json.dumps(config))
    prompt = ["--prompt", "Once upon a time", "--max-tokens", "12", "--seed", "5"]
    from_model = generate(capsys, changed, *prompt)
    explicit = generate(capsys, llama_model, *prompt, "--block-size", "2", "--threshold", "0.2", "--min-per-step", "2", "--commit", "separate", "--temperature", "0.7", "--top-p", "0.8")
    plain = generate(capsys, llama_model, *prompt)
    assert from_model["token_ids"] == explicit["token_ids"] and from_model["forward_passes"] == explicit["forward_passes"]
    assert (plain["token_ids"], plain["forward_passes"]) != (from_model["token_ids"], from_model["forward_passes"])


def test_separate_commit_gives_the_fused_tokens(capsys, llama_model):
    prompt = ["--prompt", "Count from 1 to 12.", "--chat", "--no-think", "--max-tokens", "16", "--threshold", "0.7"]
    fused = generate(capsys, llama_model, *prompt, "--commit", "fused")
    separate = generate(capsys, llama_model, *prompt, "--commit", "separate")
    assert separate["token_ids"] == fused["token_ids"] and len(fused["token_ids"]) == 16
    assert separate["forward_passes"] == fused["forward_passes"] + 16 // 4  # one commit forward per block


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seed", "-1"], "seed is -1, it must be in [0, 2^64-1]"),
        (["--threshold", "1.5"], "threshold is 1.5, it must be in [0, 1]"),
        (["--block-size", "4", "--min-per-step", "5"], "min_per_step is 5, it must be in [1, block_size (4)]"),
        (["--max-tokens", "-3"], "max_tokens is -3"),
        (["--no-think"], "--no-think only applies to a chat prompt; add --chat"),
        (["--prompt", ""], "--prompt encodes to no tokens"),
        (["--max-tokens", "100000"], "exceeds the model's max_position_embeddings"),
    ],
)
def test_bad_flags_exit_2(capsys, llama_model, flags, message):
    code = main(["generate", "--model", str(llama_model), "--prompt", "Hi", *flags])
    _, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: ")
    assert message in err and err.count("\n") == 1


def test_an_ar_base_is_refused(capsys, tiny_models):
    base, _ = tiny_models("llama")
    assert main(["generate", "--model", str(base), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert f"{base / 'config.json'}: no 'a2d' section" in err and "python -m a2d_convert init" in err


def test_cli_process(llama_model, tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "a2d_convert", "generate", "--model", str(llama_model), "--prompt", "Hello", "--max-tokens", "5", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    assert set(json.loads(ok.stdout)) == FIELDS and json.loads(ok.stdout)["completion_tokens"] == 5
    missing = subprocess.run(
        [sys.executable, "-m", "a2d_convert", "generate", "--model", str(tmp_path / "nope"), "--prompt", "Hello"],
        capture_output=True, text=True, timeout=120,
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr == f"error: {tmp_path / 'nope'}: model folder not found; pass a folder made by `python -m a2d_convert init`\n"


def truncate_weights(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 3])


def set_architecture(folder):
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (folder / "config.json").write_text(json.dumps(config))


def shrink_layers(folder):
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] += 8
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("edit", "file", "message"),
    [
        (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json", "file not found; copy the base model's tokenizer.json"),
        (truncate_weights, "model.safetensors", "not a readable safetensors file"),
        (set_architecture, "config.json", "architecture 'MistralForCausalLM' is not supported"),
        (shrink_layers, "", "the config implies"),
    ],
)
def test_broken_model_folder_exits_2(capsys, llama_model, tmp_path, edit, file, message):
    folder = tmp_path / "m"
    shutil.copytree(llama_model, folder)
    edit(folder)
    assert main(["generate", "--model", str(folder), "--prompt", "Hi", "--max-tokens", "4"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {folder / file}") and message in err and err.count("\n") == 1
