"""convert/recipes/demo-conversion.sh on the CPU with a tiny base, as the GPU session runs it in two calls:
call 1 imports, distils (greedy + sampled), trains until its stage timeout kills it, and still leaves the
last checkpoint's delta and its logs in OUT; call 2 on the same WORK resumes training, stops on the
trainer's own time limit, evaluates the probes and leaves the final, verified delta in OUT."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from a2d_convert.tiny import make_tiny_base

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "convert" / "recipes" / "demo-conversion.sh"
FIXTURES = REPO / "eval" / "fixtures"


def python_env(tmp: Path) -> dict[str, str]:
    """os.environ with `python3` on PATH running this interpreter and a2d_convert importable: the recipes call python3."""
    shim = tmp / "bin"
    shim.mkdir(exist_ok=True)
    python3 = shim / "python3"  # a symlink would leave this interpreter's venv
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    return {
        **os.environ,
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join([str(REPO / "convert"), os.environ.get("PYTHONPATH", "")]),
    }


def run_recipe(tmp: Path, out: Path, **env) -> tuple[int, str]:
    base_env = {
        **python_env(tmp),
        "SOURCE": str(tmp / "hf"), "WORK": str(tmp / "w"), "OUT": str(out),
        "DISTILL_N": "16", "DISTILL_TOKENS": "8", "DISTILL_SAMPLES": "1", "DISTILL_BATCH": "8", "DISTILL_S": "120",
        "SEQ_LEN": "64", "BATCH_ROWS": "2", "MICRO_ROWS": "1", "RANK": "4", "LR": "3e-3", "WARMUP": "2", "AC": "0",
        "LOG_EVERY": "2", "SAVE_EVERY": "2", "MIN_TRAIN_S": "1", "DEADLINE": "0",
        "PROBES_PER_FAMILY": "1", "PROBE_TOKENS": "6", "THRESHOLDS": "0.9,0.3", "PROBE_BATCH": "16",
        "OMP_NUM_THREADS": "1",
        **env,
    }
    done = subprocess.run(["bash", str(RECIPE)], env=base_env, capture_output=True, text=True, timeout=400)
    return done.returncode, done.stdout + done.stderr


def results(out: Path) -> dict[str, bytes]:
    with tarfile.open(out / "results.tar.gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def delta_from(out: Path) -> bytes:
    parts = sorted(out.glob("delta.safetensors.part-*"))
    assert parts, f"no delta parts in {out}: {sorted(p.name for p in out.iterdir())}"
    return b"".join(p.read_bytes() for p in parts)


def device_call(where: Path, script: str, carried, **env: str) -> subprocess.CompletedProcess:
    """One device call: a fresh tree at `where` holding only the carried folders under .device/, running
    bench/SCRIPT there with the environment's paths pointed into the test's folders."""
    subprocess.run(["rm", "-rf", str(where)], check=True)
    (where / ".device").mkdir(parents=True)
    for folder in carried:
        subprocess.run(["cp", "-r", str(folder), str(where / ".device" / folder.name)], check=True)
    return subprocess.run(["bash", str(REPO / "bench" / script)], cwd=where, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def train_log(files: dict[str, bytes]) -> list[dict]:
    return [json.loads(line) for line in files["run/train_log.jsonl"].decode().splitlines()]


def test_two_time_boxed_calls_leave_their_results_in_out(tmp_path):
    make_tiny_base(tmp_path / "hf")
    # Call 1: training has 8 s and no time limit of its own, so the stage's timeout ends it.
    out1 = tmp_path / "out1"
    rc, log = run_recipe(tmp_path, out1, PROBES="0", TRAIN_S="8", TRAIN_TAIL_S="-100000", STEPS="100000")
    assert rc == 0, log
    assert "timed out after 8 s" in log and "done (PROBES=0" in log
    files = results(out1)
    assert {"timings.txt", "status.txt", "train.log", "run/train_log.jsonl", "data/data_manifest.json", "delta.sha256", "delta/delta.json"} <= set(files)
    sha = files["delta.sha256"].decode().split()[0]
    assert hashlib.sha256(delta_from(out1)).hexdigest() == sha
    status = files["status.txt"].decode()
    assert "data ok" in status and "train stopped at step" in status and "exported" in status
    manifest = json.loads(files["data/data_manifest.json"])
    generator = manifest["sources"][0]["generator"]
    assert generator["sampled"]["per_prompt"] == 1 and generator["responses_by_kind"]["main"] == 16
    steps1 = json.loads((tmp_path / "w" / "run" / "latest.json").read_text())["step"]
    assert steps1 >= 2 and not any(r.get("time_limit_reached") for r in train_log(files))

    # Call 2, same WORK: resumes from that checkpoint; the trainer's own limit stops it (about 4 s of
    # training), then probes, the final export and verify.
    out2 = tmp_path / "out2"
    rc, log = run_recipe(tmp_path, out2, PROBES="1", OPEN_TOKENS="8", TRAIN_S="40",
                         TRAIN_TAIL_S="36", STEPS="100000")
    assert rc == 0, log
    assert "resumed" in log and "timed out" not in log
    files = results(out2)
    status = files["status.txt"].decode()
    assert "probes ok" in status and "final export verified" in status
    records = train_log(files)
    assert records[-1]["time_limit_reached"] and records[-1]["step"] > steps1
    probes = json.loads(files["probes.json"])
    assert set(probes["model"]) == {"0.9", "0.3"} and "base" in probes
    assert probes["decoding"]["advance"] == "slide" and probes["decoding"]["remasking"] == "leftmost"  # the recipe's default export decoding
    heldout = json.loads(files["probes-heldout.json"])
    assert heldout["probes"]["count"] == 56 and set(heldout["model"]) == {"0.9", "0.3"} and "held-out prompts ok" in status
    opened = json.loads(files["probes-open.json"])
    assert opened["probes"]["count"] == 12 and set(opened["model"]) == {"0.9", "0.3"}
    assert all(row["tokens_per_answer"] <= 8 for row in opened["model"].values()) and "open prompts ok" in status
    assert hashlib.sha256(delta_from(out2)).hexdigest() == files["delta.sha256"].decode().split()[0]
    decoder = json.loads(files["model/decoder_config.json"])
    assert decoder["chosen_by"]["method"] == "probes" and decoder["chosen_by"]["flags"] == {"advance": "slide", "remasking": "leftmost"}
    assert decoder["decoding"] == {**probes["decoding"], "threshold": probes["recommended"]["threshold"]}
    assert "PASS" in log

    # Call 3 (the probes-only variant): no training, the export of the same checkpoint is reused.
    out3 = tmp_path / "out3"
    rc, log = run_recipe(tmp_path, out3, PROBES="1", TRAIN="0", THRESHOLDS="0.9,0.5")  # new thresholds: probed again
    assert rc == 0, log
    assert "train: skipped (TRAIN=0)" in log and "done already" in log
    files = results(out3)
    assert "final export verified" in files["status.txt"].decode().splitlines()[-3]  # then the held-out and open prompts
    assert hashlib.sha256(delta_from(out3)).hexdigest() == files["delta.sha256"].decode().split()[0]


def test_a_variant_shares_the_data_and_adds_its_train_flags(tmp_path):
    """How the device script runs variants: DATA_ONLY stops once the data exists; a second WORK linking
    that base, prompts and data trains with TRAIN_EXTRA's flags and, with SAVE_DELTA=0, leaves the delta's
    weights out of its OUT (several variants share one call's return)."""
    make_tiny_base(tmp_path / "hf")
    rc, log = run_recipe(tmp_path, tmp_path / "out-none", BENCHMARKS=f"{FIXTURES} {tmp_path / 'no-such-benchmark.csv'}")
    assert rc == 2 and "BENCHMARKS: " in log and "no-such-benchmark.csv does not exist" in log
    # The benchmark files the user has (here eval's fixtures, as the folder `a2d eval --data` reads and one
    # file) are the data's blocklist.
    benchmarks = f"{FIXTURES} {FIXTURES / 'jsonl' / 'mmlu_pro.jsonl'}"
    rc, log = run_recipe(tmp_path, tmp_path / "out-data", DATA_ONLY="1", DISTILL_SAMPLES="0", BENCHMARKS=benchmarks)
    assert rc == 0, log
    assert "done (DATA_ONLY)" in log and not (tmp_path / "w" / "run").exists()
    manifest = json.loads((tmp_path / "w" / "data" / "data_manifest.json").read_text())
    listed = {Path(f["path"]).name: f["format"] for f in manifest["filters"]["ngram_overlap"]["blocklist"]}
    assert listed == {"gpqa_diamond.csv": "gpqa_diamond", "livecodebench_v6.jsonl": "livecodebench", "math_500.jsonl": "math_500",
                      "mmlu_pro.jsonl": "mmlu_pro", "mmlu_pro.parquet": "mmlu_pro"}
    variant = tmp_path / "w-ar"
    variant.mkdir()
    for name in ("base", "data", "prompts.jsonl"):
        (variant / name).symlink_to(tmp_path / "w" / name)
    out = tmp_path / "out-ar"
    rc, log = run_recipe(tmp_path, out, WORK=str(variant), PROBES="0", SAVE_DELTA="0", TRAIN_S="30", TRAIN_TAIL_S="26",
                         STEPS="100000", TRAIN_EXTRA="--ar-weight 0.5 --confidence-weight 0.2")
    assert rc == 0, log
    config = json.loads((variant / "run" / "train_config.json").read_text())
    assert config["ar_weight"] == 0.5 and config["confidence_weight"] == 0.2 and config["kl_weight"] == 0.0
    assert "certainty" in train_log(results(out))[-1]
    assert (variant / "delta" / "delta.safetensors").is_file() and not list(out.glob("delta.safetensors.part-*"))


def test_checkpoint_probes_ship_the_checkpoint_the_probes_rank_first(tmp_path):
    """CHECKPOINT_PROBES=1: every checkpoint is kept, exported and probed; rank-probes picks one, and the
    shipped model, its probes report and its delta are that checkpoint's."""
    make_tiny_base(tmp_path / "hf")
    out = tmp_path / "out"
    rc, log = run_recipe(tmp_path, out, PROBES="1", CHECKPOINT_PROBES="1", DISTILL_SAMPLES="0", TRAIN_S="60",
                         TRAIN_TAIL_S="0", STEPS="6", SAVE_EVERY="2")
    assert rc == 0, log
    files = results(out)
    ranking = json.loads(files["checkpoint-ranking.json"])
    probed = sorted(name for name in files if name.startswith("ck/") and name.endswith("/probes.json"))
    assert probed == ["ck/step_000002/probes.json", "ck/step_000004/probes.json", "ck/step_000006/probes.json"]
    assert len(ranking) == 3
    chosen = Path(ranking[0]["path"]).parent.name
    assert f"checkpoint chosen by the probes: {chosen}" in log
    assert files["probes.json"] == files[f"ck/{chosen}/probes.json"]
    lineage = json.loads(files["model/lineage.json"])
    assert chosen in json.dumps(lineage)
    assert "final export verified" in files["status.txt"].decode()
    assert hashlib.sha256(delta_from(out)).hexdigest() == files["delta.sha256"].decode().split()[0]


def test_a_prompt_count_the_generator_cannot_write_fails_before_the_import(tmp_path):
    """DISTILL_N past the prompt generator's distinct prompts stops the recipe at once with the generator's message,
    before the base is imported (on the GPU machine that is minutes of device time saved)."""
    status, output = run_recipe(tmp_path, tmp_path / "out", DISTILL_N="10000000", SOURCE=str(tmp_path / "no-such-base"))
    assert status != 0
    assert "distinct prompts can be written; ask for fewer" in output
    assert not (tmp_path / "w" / "base").exists()


def test_prompt_args_reach_the_prompt_generator(tmp_path):
    """PROMPT_ARGS: the recipe's default prompts made with more generator arguments (the opt-in code category);
    a bad one stops the recipe before the import, with the generator's message."""
    status, output = run_recipe(tmp_path, tmp_path / "out", DISTILL_N="300", PROMPT_ARGS="--code-weight 30 --seed 2",
                                SOURCE=str(tmp_path / "no-such-base"))
    assert status != 0  # no base: it stops at the import, after the prompts
    rows = [json.loads(line) for line in (tmp_path / "w" / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 300 and any(r["category"] == "code" for r in rows)
    status, output = run_recipe(tmp_path, tmp_path / "out2", WORK=str(tmp_path / "w2"), PROMPT_ARGS="--code-weight -3",
                                SOURCE=str(tmp_path / "no-such-base"))
    assert status != 0 and "0 or more" in output and not (tmp_path / "w2" / "prompts.jsonl").exists()


def test_auto_steps_size_the_schedule_to_the_first_training_call(tmp_path):
    """STEPS=auto: the trainer sizes the schedule to the first training call's time (train --steps-from-time; the
    run's train_config holds the size) and a call that resumes it keeps that size."""
    make_tiny_base(tmp_path / "hf")
    rc, log = run_recipe(tmp_path, tmp_path / "out1", PROBES="0", STEPS="auto", TRAIN_TAIL_S="5", TRAIN_S="30")
    assert rc == 0, log
    assert "STEPS=auto: the schedule sized" in log and '"event": "sized"' in (tmp_path / "w" / "train.log").read_text()
    sized = json.loads((tmp_path / "w" / "run" / "train_config.json").read_text())["max_steps"]
    assert 14 <= sized < 1000000
    rc, log = run_recipe(tmp_path, tmp_path / "out2", PROBES="0", STEPS="auto", TRAIN_S="20")
    assert rc == 0, log
    assert "resumed" in log
    assert json.loads((tmp_path / "w" / "run" / "train_config.json").read_text())["max_steps"] == sized

def test_a_poll_of_the_background_job_brings_back_the_latest_checkpoint_as_a_delta(tmp_path):
    """bench/device-conversion-bg.sh's snapshot: while the job runs, a poll exports the run's latest checkpoint in
    the background and the next polls copy it into their OUT, no more a poll than one call brings back (here two
    files, so the three parts span two polls); bench/snapshot-delta.sh joins the polls' folders into a delta
    folder here, the same bytes as the recipe's own export of that checkpoint."""
    make_tiny_base(tmp_path / "hf")
    out = tmp_path / "out"
    rc, log = run_recipe(tmp_path, out, PROBES="0", STEPS="4", TRAIN_EXTRA="--window-adapter --kl-weight 1")
    assert rc == 0, log
    weights = delta_from(out)
    bg = tmp_path / "bg"
    bg.mkdir()
    (bg / "repo").symlink_to(REPO)
    (bg / "export_extra").write_text("")  # the recipe above exported with no extra flags
    job = subprocess.Popen(["sleep", "300"])  # the job, still running
    try:
        (bg / "pid").write_text(str(job.pid))
        env = {**python_env(tmp_path), "BG": str(bg), "BG_WORK": str(tmp_path / "w"),
               "PART_BYTES": str(len(weights) // 3 + 1), "RETURN_FILES": "2"}

        def poll(name: str) -> str:
            done = subprocess.run(["bash", str(REPO / "bench" / "device-conversion-bg.sh")], cwd=REPO, capture_output=True,
                                  text=True, timeout=60, env={**env, "OUT": str(tmp_path / name)})
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout

        assert "snapshot: exporting checkpoints/step_000004" in poll("poll1")
        for _ in range(240):  # the export runs in the background
            if (bg / "snap" / "ready").exists():
                break
            time.sleep(0.5)
        assert (bg / "snap" / "ready").exists(), (bg / "snap" / "export.log").read_text()
        second = poll("poll2")
        assert "part of it copied back" in second and "exporting" not in second
        assert sorted(p.name for p in (tmp_path / "poll2").iterdir()) == ["snapshot-delta.safetensors.part-00", "snapshot.tar.gz"]
        assert "snapshot of checkpoints/step_000004 copied back" in poll("poll3")
        assert sorted(p.name for p in (tmp_path / "poll3").iterdir()) == [
            "snapshot-delta.safetensors.part-01", "snapshot-delta.safetensors.part-02"]
        # Sent once: the next poll neither copies it again nor exports the same checkpoint again.
        fourth = poll("poll4")
        assert "copied back" not in fourth and "exporting" not in fourth and not any((tmp_path / "poll4").iterdir())
    finally:
        job.kill()

    def join(*names: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "bench" / "snapshot-delta.sh"), *(str(tmp_path / n) for n in names)],
                              capture_output=True, text=True, timeout=60)

    done = join("poll2", "poll3", "snap")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "snap" / "delta.safetensors").read_bytes() == weights
    assert json.loads((tmp_path / "snap" / "delta.json").read_text()) == json.loads(results(out)["delta/delta.json"])
    # A missing part is caught by the weights' sha256, and nothing is left behind.
    done = join("poll2", "snap2")
    assert done.returncode != 0 and "do not match" in done.stderr and not (tmp_path / "snap2").exists()
    assert not (tmp_path / "snap2.tmp").exists()
    # So is a truncated one.
    parts = sorted((tmp_path / "poll3").glob("snapshot-delta.safetensors.part-*"))
    parts[-1].write_bytes(parts[-1].read_bytes()[:-1])
    done = join("poll2", "poll3", "snap3")
    assert done.returncode != 0 and "do not match" in done.stderr and not (tmp_path / "snap3").exists()
    # The final results (results.tar.gz and delta.safetensors.part-NN) join the same way.
    done = join("out", "final")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "final" / "delta.safetensors").read_bytes() == weights
    assert json.loads((tmp_path / "final" / "delta.json").read_text()) == json.loads(results(out)["delta/delta.json"])


def test_a_finished_job_sends_its_data_back_and_the_next_conversion_trains_on_it_without_distilling(tmp_path):
    """bench/device-conversion-bg.sh with SEND_DATA=1: once the job has finished, the polls bring back the recipe's
    training data in parts (no more a poll than one call returns); bench/stage-data.sh joins them and splits them into
    .device/data-NN for the next calls; bench/device-data.sh stashes what each call carried and, once every part is
    there, unpacks WORK/data, on which the recipe trains without distilling again."""
    make_tiny_base(tmp_path / "hf")
    rc, log = run_recipe(tmp_path, tmp_path / "out", PROBES="0", STEPS="2")
    assert rc == 0, log
    data = tmp_path / "w" / "data"
    bg = tmp_path / "bg"
    (bg / "out").mkdir(parents=True)
    (bg / "done").write_text("recipe exit 0\nfinished\n")
    (bg / "pid").write_text("999999999")  # no such process: the job has ended
    size = (data / "train.safetensors").stat().st_size
    env = {**python_env(tmp_path), "BG": str(bg), "BG_WORK": str(tmp_path / "w"), "SEND_DATA": "1",
           "PART_BYTES": str(size // 4 + 1), "RETURN_FILES": "2", "SNAPSHOT": "0"}
    polls = []
    for i in range(8):
        name = tmp_path / f"poll{i}"
        done = subprocess.run(["bash", str(REPO / "bench" / "device-conversion-bg.sh")], cwd=REPO, capture_output=True,
                              text=True, timeout=60, env={**env, "OUT": str(name)})
        assert done.returncode == 0, done.stdout + done.stderr
        polls.append(name)
        if "training data copied back" in done.stdout and "part of the training data" not in done.stdout:
            break
    assert len(polls) > 1, "the data should span polls of two files each"
    assert all(len(list(p.glob("data.*"))) <= 2 for p in polls)

    stage = tmp_path / "stage"
    stage.mkdir()
    stage_env = {**os.environ, "STAGE_ROOT": str(stage)}

    def stage_data(*dirs: Path) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO / "bench" / "stage-data.sh"), *map(str, dirs)], capture_output=True,
                              text=True, timeout=60, env=stage_env)

    # A poll's folder left out: the joined parts miss data.sha256's bytes, and nothing is staged.
    done = stage_data(*polls[:-1])
    assert done.returncode != 0 and "do not match" in done.stderr and not list(stage.glob(".device/data-*"))
    done = stage_data(*polls)
    assert done.returncode == 0, done.stdout + done.stderr
    folders = sorted(stage.glob(".device/data-*"))
    assert folders and (folders[0] / "data.sha256").is_file()

    def carry(*carried: Path) -> subprocess.CompletedProcess:
        return device_call(tmp_path / "call", "device-data.sh", carried,
                           DATA_STASH=str(tmp_path / "stash"), DATA_DIR=str(tmp_path / "w2" / "data"))

    for folder in folders[:-1]:
        done = carry(folder)
        assert done.returncode == 0 and "parts stashed" in done.stdout, done.stdout + done.stderr
        assert not (tmp_path / "w2" / "data").exists()
    done = carry(folders[-1])
    assert done.returncode == 0 and "unpacked" in done.stdout, done.stdout + done.stderr
    sent = {"train.safetensors", "heldout.safetensors", "data_manifest.json"} & {p.name for p in data.iterdir()}
    assert {"train.safetensors", "data_manifest.json"} <= sent  # a data set this small keeps no held-out rows
    assert {p.name for p in (tmp_path / "w2" / "data").iterdir()} == sent
    for name in sent:
        assert (tmp_path / "w2" / "data" / name).read_bytes() == (data / name).read_bytes()

    # The next conversion on that WORK trains on the data it was given.
    rc, log = run_recipe(tmp_path, tmp_path / "out2", PROBES="0", STEPS="2", WORK=str(tmp_path / "w2"))
    assert rc == 0, log
    assert "self-distillation" not in log and "data done" not in log
    assert json.loads(results(tmp_path / "out2")["data/data_manifest.json"]) == json.loads((data / "data_manifest.json").read_text())
    assert delta_from(tmp_path / "out2")


def test_a_warm_delta_staged_in_parts_joins_on_the_gpu_machine_once_every_part_is_there(tmp_path):
    """bench/stage-warm-delta.sh splits an earlier delta into .device/warm-NN (small files with the first part) and
    bench/device-base-gguf.sh, run by each call, stashes what that call carried: WARM_DIR holds the delta, checked
    against its sha256, only after the call that brings the last part; a part whose bytes changed is refused. A
    corpus's files (.device/corpus) carried on the way are stashed for the start call."""
    delta = tmp_path / "delta"
    delta.mkdir()
    weights = os.urandom(11 * 1024 * 1024 + 17)
    (delta / "delta.safetensors").write_bytes(weights)
    (delta / "delta.json").write_text('{"rank": 4}')
    tree = subprocess.run(["bash", "-c", "source bench/device-parts.sh && tree_bytes"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    stage = tmp_path / "stage"
    stage.mkdir()
    margin = 64 * 1024 * 1024 - int(tree) - 4096 - 4096 - 5 * 1024 * 1024  # room for parts of about 5 MiB
    done = subprocess.run(["bash", str(REPO / "bench" / "stage-warm-delta.sh"), str(delta)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "STAGE_ROOT": str(stage), "MARGIN": str(margin)})
    assert done.returncode == 0, done.stdout + done.stderr
    folders = sorted((stage / ".device").glob("warm-*"))
    assert [f.name for f in folders] == ["warm-00", "warm-01", "warm-02", "warm-03"]  # three parts
    assert {p.name for p in folders[0].iterdir()} == {"delta.json", "delta.sha256"}

    def call(*carried: Path, warm: Path) -> subprocess.CompletedProcess:
        """No GGUF part among the folders: status 3 after the warm step."""
        return device_call(tmp_path / "call", "device-base-gguf.sh", carried, WARM_STASH=str(warm) + "-stash",
                           WARM_DIR=str(warm), GGUF_STASH=str(tmp_path / "gguf-stash"),
                           BASE_GGUF=str(tmp_path / "base.gguf"), DATA_STASH=str(tmp_path / "data-stash"),
                           DATA_DIR=str(tmp_path / "data"), CORPUS_STASH=str(tmp_path / "corpus-stash"))

    warm = tmp_path / "warm"
    corpus = tmp_path / "corpus"  # a corpus's files ride any call and are kept for the start call
    corpus.mkdir()
    (corpus / "pkg-1.0-py3-none-any.whl").write_bytes(b"wheel bytes")
    done = call(folders[0], folders[1], corpus, warm=warm)
    assert done.returncode == 3 and "1 of 3 parts stashed" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "corpus-stash" / "pkg-1.0-py3-none-any.whl").read_bytes() == b"wheel bytes"
    done = call(folders[2], warm=warm)
    assert done.returncode == 3 and "2 of 3 parts stashed" in done.stdout, done.stdout + done.stderr
    assert not warm.exists()
    done = call(folders[3], warm=warm)
    assert done.returncode == 3 and "no parts here" in done.stdout, done.stdout + done.stderr
    assert (warm / "delta.safetensors").read_bytes() == weights
    assert (warm / "delta.json").read_text() == '{"rank": 4}'

    # The same parts with one byte changed: nothing is left that looks like a delta.
    bad = tmp_path / "warm-03"
    subprocess.run(["cp", "-r", str(folders[3]), str(bad)], check=True)
    part = next(bad.iterdir())
    data = bytearray(part.read_bytes())
    data[100] ^= 1
    part.write_bytes(bytes(data))
    done = call(folders[0], folders[1], folders[2], bad, warm=tmp_path / "warm-bad")
    assert done.returncode == 1 and "do not join to its sha256" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / "warm-bad" / "delta.safetensors").exists()
