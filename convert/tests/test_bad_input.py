"""Bad model folders: a one-line error naming the file and the fix, exit status 2, never a traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from a2d_convert.errors import A2DError
from a2d_convert.model import load_transformer


def broken_copy(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return edit


def truncate(folder):
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


CASES = {
    "missing_folder": (None, "model folder not found"),
    "missing_config": (lambda f: (f / "config.json").unlink(), "config.json: file not found"),
    "bad_json": (lambda f: (f / "config.json").write_text("{not json"), "config.json: not valid JSON"),
    "missing_weights": (lambda f: (f / "model.safetensors").unlink(), "no model.safetensors"),
    "garbage_safetensors": (lambda f: (f / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00garbage!garbage!"), "model.safetensors: not a readable safetensors file"),
    "truncated_safetensors": (truncate, "model.safetensors: not a readable safetensors file"),
    "unknown_architecture": (edit_config(architectures=["GPT2LMHeadModel"], model_type="gpt2"), "is not supported; a2d supports"),
    "hidden_size_mismatch": (edit_config(hidden_size=96), "has shape"),
    "layer_count_mismatch": (edit_config(num_hidden_layers=3), "'model.layers.2.input_layernorm.weight' is missing"),
    "bias_not_announced": (edit_config(architectures=["Qwen2ForCausalLM"], model_type="qwen2"), "self_attn.q_proj.bias' is missing"),
    "rope_scaling": (edit_config(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_type 'yarn' is not supported"),
}


@pytest.fixture(scope="module")
def broken(tiny_models, tmp_path_factory):
    base, _ = tiny_models("llama")
    root = tmp_path_factory.mktemp("broken")

    def make(name):
        edit, _ = CASES[name]
        folder = root / name
        return folder if edit is None or folder.exists() else broken_copy(base, folder, edit)

    return make


@pytest.mark.parametrize("name", CASES)
def test_loader_names_the_file_and_the_fix(broken, name):
    folder = broken(name)
    with pytest.raises(A2DError) as raised:
        load_transformer(folder)
    message = str(raised.value)
    assert CASES[name][1] in message and str(folder) in message and "\n" not in message


@pytest.mark.parametrize("name", ["missing_folder", "unknown_architecture", "truncated_safetensors"])
def test_cli_exits_2_with_one_line(broken, tmp_path, name):
    folder = broken(name)
    result = subprocess.run([sys.executable, "-m", "a2d_convert", "init", "--base", str(folder), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert CASES[name][1] in result.stderr and not (tmp_path / "out").exists()


def test_a_failed_stage_leaves_its_old_output_whole(broken, tiny_models, tmp_path):
    # Stages write beside --out and rename into place at the end: a failure half way (here the weights do not
    # match the config, found after they were written) keeps the previous output, and what a killed run left
    # beside it is cleared.
    from a2d_convert.import_base import import_base

    base, _ = tiny_models("llama")
    out = tmp_path / "imported"
    import_base(base, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    (tmp_path / ".imported.partial").mkdir()
    (tmp_path / ".imported.partial" / "model.safetensors").write_bytes(b"left by a killed run")
    with pytest.raises(A2DError, match="has shape"):
        import_base(broken("hidden_size_mismatch"), out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["imported"]
    import_base(base, out, force=True)  # and the next run replaces it
    assert sorted(p.name for p in out.iterdir()) == sorted(before)
    assert (out / "model.safetensors").read_bytes() == before["model.safetensors"]
