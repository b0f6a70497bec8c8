"""bench/window_calibration.py on a tiny window-adapter model and a tiny window-rule one: it reads each window offset against the answer it is
given, so answers made of the model's own first-position predictions score 1.00 at offset 0, and each offset
counts the positions that have a token there."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from a2d_convert.golden import write_golden
from a2d_convert.model import BlockForward, load_transformer
from a2d_convert.prompts import load_prompt_codec

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", ["llama_window_adapter", "llama_window_rule"])
def test_offset_zero_agrees_with_the_models_own_next_tokens(tmp_path, case):
    write_golden(tmp_path / "golden", seed=0, cases=[case])
    model_dir = tmp_path / "golden" / case / "model"
    model, _, a2d = load_transformer(model_dir)
    codec = load_prompt_codec(model_dir)
    B, mask = a2d.block_size, a2d.mask_token_id
    lines = []
    for prompt_text, n in (("Name a colour.", 6), ("Count to three.", 4)):
        prompt = codec.encode_chat([{"role": "user", "content": prompt_text}], None)
        context = list(prompt)
        for _ in range(n):  # greedy through the anchor row: what the window's first position predicts
            with torch.no_grad():
                logits = BlockForward(model)(context[:-1], [context[-1]] + [mask] * B, [len(context) - 1]).clone()
            logits[:, mask] = float("-inf")
            context.append(int(logits[0].argmax()))
        lines.append({"kind": "base", "prompt": prompt_text, "token_ids": context[len(prompt):]})
        lines.append({"kind": "model@0.5", "prompt": prompt_text, "token_ids": [1, 2]})  # not a base answer: skipped
    answers = tmp_path / "base.jsonl"
    answers.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "calibration.json"
    run = subprocess.run([sys.executable, str(REPO / "bench" / "window_calibration.py"), "--model", str(model_dir),
                          "--base-answers", str(answers), "--json", str(out), "--threads", "1"],
                         capture_output=True, text=True, check=True)
    assert "| all masked | 0 | 1.00 of 10 |" in run.stdout
    counts = json.loads(out.read_text())["counts"]
    lengths = (6, 4)
    for j in range(B):
        masked = sum(max(0, n - j) for n in lengths)
        assert sum(cell[0] for cell in counts["all masked"][j]) == masked
        revealed = sum(max(0, n - j) for n in lengths) if j >= 1 else 0
        assert sum(cell[0] for cell in counts["first revealed"][j]) == revealed
    assert sum(cell[1] for cell in counts["all masked"][0]) == 10
