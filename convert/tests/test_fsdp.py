"""FSDP2 over 2 CPU processes (gloo, launched by torchrun) computes the same run as 1 process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from a2d_convert.data import DataConfig, Source, build_data
from a2d_convert.tiny import TinySpec, make_tiny_base
from a2d_convert.train_config import TrainConfig
from a2d_convert.trainer import LOG_FILE, train

from test_train import arithmetic_rows

FLAGS = {"max_steps": 3, "batch_rows": 4, "micro_batch_rows": 1, "lr": 3e-3, "warmup_steps": 1, "log_every": 1, "threads": 1}


def test_two_fsdp_processes_match_one(tmp_path):
    base = make_tiny_base(tmp_path / "base", TinySpec(layers=2, hidden=64, heads=4, kv_heads=2))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in arithmetic_rows(32)))
    # One held-out row: the second process has no share of it, yet must join every collective of the
    # final evaluation (uneven shares once hung a 2-GPU run at its end).
    data = build_data([Source(path=rows, name="arith")], base, tmp_path / "data", DataConfig(block_size=4, seq_len=96, holdout_fraction=1 / 32))

    single = train(TrainConfig(base=str(base), data=str(data), out=str(tmp_path / "one"), **FLAGS))

    torchrun = Path(sys.executable).with_name("torchrun")
    cli_flags = [f"--{k.replace('_', '-')}={v}" for k, v in FLAGS.items()]
    cmd = [
        str(torchrun), "--standalone", "--nproc-per-node=2", "-m", "a2d_convert", "train",
        f"--base={base}", f"--data={data}", f"--out={tmp_path / 'two'}", *cli_flags,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"world_size": 2' in done.stdout

    logs = [[json.loads(line) for line in (tmp_path / run / LOG_FILE).read_text().splitlines()] for run in ("one", "two")]
    for a, b in zip(*logs):
        np.testing.assert_allclose([a["loss"], a["ce"], a["grad_norm"]], [b["loss"], b["ce"], b["grad_norm"]], rtol=1e-4)
    one = load_file(single / "model.safetensors")
    two = load_file(tmp_path / "two" / "checkpoints" / "step_000003" / "model.safetensors")
    assert set(one) == set(two)
    for name in one:  # bf16 files: at most one rounding step apart
        torch.testing.assert_close(one[name].float(), two[name].float(), rtol=1e-2, atol=1e-3)
    lineage = json.loads((tmp_path / "two" / "checkpoints" / "step_000003" / "lineage.json").read_text())
    assert lineage["stages"][-1]["config"]["world_size"] == 2
    evals = [json.loads((tmp_path / run / "checkpoints" / "step_000003" / "checkpoint.json").read_text())["progress"]["eval_ce"] for run in ("one", "two")]
    np.testing.assert_allclose(evals[0], evals[1], rtol=1e-3)
