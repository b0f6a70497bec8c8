"""`data`: filters drop planted benchmark/eval rows and say so; samples sit on the block grid."""

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from a2d_convert.data import (
    MANIFEST_FILE,
    TRAIN_FILE,
    DataConfig,
    Source,
    build_data,
    load_rows,
    parse_source_flag,
)
from a2d_convert.errors import A2DError
from a2d_convert.lineage import sha256_file
from a2d_convert.tiny import make_tiny_base

BLOCKED_QUESTION = "A train leaves the station at noon travelling north at sixty miles per hour towards the old mill"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("base") / "base")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def clean_rows(n: int) -> list[dict]:
    return [
        {"id": f"ok{i}", "prompt": f"What is {i} plus {i}?", "response": f"{i} plus {i} is {2 * i}.", "source": "self-written"}
        for i in range(n)
    ]


PLANTED = [
    {"id": "gpqa", "prompt": "Which gas is noble?", "response": "Neon.", "source": "gpqa_diamond"},
    {"id": "mmlu", "prompt": "Pick one.", "response": "(B)", "meta": {"dataset": "TIGER-Lab/MMLU-Pro"}},
    {"id": "math500", "prompt": "Solve x+1=2.", "response": "x=1", "origin": "HuggingFaceH4/MATH-500"},
    {"id": "aime", "prompt": "Find n.", "response": "n=7", "tags": ["aime24"]},
    {"id": "lcb", "prompt": "Write code.", "response": "print(1)", "benchmark": "LiveCodeBench v6"},
    {"id": "test-split", "prompt": "Hello there", "response": "Hi!", "split": "test"},
    {"id": "val-split", "prompt": "Good day", "response": "Hello!", "subset": "validation"},
    {"id": "ngram", "prompt": f"Tell me: {BLOCKED_QUESTION.lower()}?", "response": "Soon.", "source": "web"},
    # Spellings and depths the first filters let through.
    {"id": "lcb-underscores", "prompt": "Write more code.", "response": "print(2)", "source": "live_code_bench_v6"},
    {"id": "hle", "prompt": "Hard one.", "response": "Unknown.", "dataset": "humanitys_last_exam"},
    {"id": "nested-split", "prompt": "Nested hello", "response": "Nested hi!", "meta": {"split": "test"}},
    {"id": "testmini", "prompt": "Mini hello", "response": "Mini hi!", "split": "testmini"},
    {"id": "hf-split", "prompt": "HF hello", "response": "HF hi!", "hf_split": "test"},
]




def test_planted_benchmark_rows_are_dropped_and_recorded(base, tmp_path):
    src = write_jsonl(tmp_path / "mix.jsonl", clean_rows(12) + PLANTED + [{"id": "aimed", "prompt": "Where is it aimed at?", "response": "North.", "note": "aimed at nothing"}])
    blocklist = tmp_path / "questions.txt"
    blocklist.write_text(BLOCKED_QUESTION + "\nshort one\n")
    out = build_data([parse_source_flag(f"{src},name=mix,revision=r1,license=cc0")], base, tmp_path / "data", DataConfig(block_size=4, seq_len=64), [blocklist])
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    (source,) = manifest["sources"]
    assert source["rows_read"] == 26 and source["rows_kept"] == 13
    assert source["dropped"] == {"benchmark_metadata": 7, "eval_split": 5, "ngram_overlap": 1}
    dropped_ids = {d["id"]: d["filter"] for d in source["dropped_examples"]}
    assert dropped_ids == {
        "gpqa": "benchmark_metadata",
        "mmlu": "benchmark_metadata",
        "math500": "benchmark_metadata",
        "aime": "benchmark_metadata",
        "lcb": "benchmark_metadata",
        "test-split": "eval_split",
        "val-split": "eval_split",
        "ngram": "ngram_overlap",
        "lcb-underscores": "benchmark_metadata",
        "hle": "benchmark_metadata",
        "nested-split": "eval_split",
        "testmini": "eval_split",
        "hf-split": "eval_split",
    }
    assert source["files"][0]["sha256"] == sha256_file(src)
    assert manifest["filters"]["ngram_overlap"]["blocklist"][0]["sha256"] == sha256_file(blocklist)
    assert manifest["filters"]["ngram_overlap"]["entries_ignored_short"] == 1
    assert manifest["outputs"][TRAIN_FILE]["sha256"] == sha256_file(out / TRAIN_FILE)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    arrays, _ = load_rows(out / TRAIN_FILE, block_size=4)
    text = tokenizer.decode(arrays["input_ids"].ravel().tolist(), skip_special_tokens=False)
    for planted in ("Neon", "n=7", "Soon.", "Hi!", "print(1)", "print(2)", "Unknown.", "Nested hi!", "Mini hi!", "HF hi!"):
        assert planted not in text
    assert "North." in text and "5 plus 5 is 10." in text


def test_samples_start_their_response_on_a_block_boundary(base, tmp_path):
    src = write_jsonl(tmp_path / "rows.jsonl", clean_rows(20))
    out = build_data([Source(path=src, name="rows")], base, tmp_path / "data", DataConfig(block_size=4, seq_len=96))
    arrays, meta = load_rows(out / TRAIN_FILE)
    assert meta["block_size"] == "4" and arrays["input_ids"].shape[1] == 96
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    im_end = tokenizer.token_to_id("<|im_end|>")
    assistant = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False).ids
    samples = 0
    for ids, loss, seg in zip(arrays["input_ids"], arrays["loss_mask"], arrays["segment_ids"]):
        for s in set(seg.tolist()) - {0}:
            where = np.flatnonzero(seg == s)
            start, end = where[0], where[-1] + 1
            assert (where == np.arange(start, end)).all()  # contiguous
            first_loss = start + np.flatnonzero(loss[start:end])[0]
            assert first_loss % 4 == 0 and end % 4 == 0
            assert ids[first_loss - len(assistant) : first_loss].tolist() == assistant  # prompt is loss-free
            assert loss[start:first_loss].sum() == 0
            last_real = first_loss + np.flatnonzero(ids[first_loss:end] == im_end)[0]
            assert loss[first_loss:end].all()  # response, its end and the block-filling pads are targets
            assert (ids[last_real:end] == im_end).all() or ids[last_real + 1] == tokenizer.encode("\n").ids[0]
            samples += 1
    assert samples == 20
    assert (arrays["loss_mask"][arrays["segment_ids"] == 0] == 0).all()


def test_text_parquet_and_declared_eval_split_sources(base, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("The sun rises in the east.\n\nWater boils at one hundred degrees.")
    table = pa.table({"question": ["What is 2 plus 2?", "Name a fox."], "answer": ["4", "The quick brown fox."], "split": ["train", "train"]})
    pq.write_table(table, tmp_path / "qa.parquet")
    write_jsonl(tmp_path / "held.jsonl", clean_rows(3))
    sources = [
        parse_source_flag(f"{tmp_path / 'docs'},text_unit=paragraph"),
        parse_source_flag(f"{tmp_path / 'qa.parquet'}"),
        parse_source_flag(f"{tmp_path / 'held.jsonl'},split=validation"),
    ]
    out = build_data(sources, base, tmp_path / "data", DataConfig(block_size=8, seq_len=64))
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    by_name = {s["name"]: s for s in manifest["sources"]}
    assert by_name["docs"]["samples"] == 2 and by_name["qa.parquet"]["samples"] == 2
    assert by_name["held.jsonl"]["rows_kept"] == 0 and by_name["held.jsonl"]["dropped"] == {"eval_split": 3}
    assert manifest["totals"][TRAIN_FILE]["samples"] == 4
    arrays, _ = load_rows(out / TRAIN_FILE)
    text_tokens = int(arrays["loss_mask"].sum())
    assert text_tokens == manifest["totals"][TRAIN_FILE]["loss_tokens"] > 0
    assert "confidence" not in arrays  # no source carries the base's probabilities


def test_bad_input_is_named(base, tmp_path):
    with pytest.raises(A2DError, match="does not exist"):
        parse_source_flag(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "response": "b"}\nnot json\n')
    with pytest.raises(A2DError, match=r"bad.jsonl:2"):
        build_data([Source(path=bad, name="bad")], base, tmp_path / "d1", DataConfig())
    with pytest.raises(A2DError, match="unknown source field"):
        parse_source_flag(f"{bad},spilt=train")
    with pytest.raises(A2DError, match="multiple of --block-size"):
        build_data([Source(path=bad, name="bad")], base, tmp_path / "d2", DataConfig(block_size=4, seq_len=30))
    with pytest.raises(A2DError, match="rebuild the data with --block-size 8"):
        ok = write_jsonl(tmp_path / "ok.jsonl", clean_rows(2))
        out = build_data([Source(path=ok, name="ok")], base, tmp_path / "d3", DataConfig(block_size=4, seq_len=32))
        load_rows(out / TRAIN_FILE, block_size=8)


def test_self_distillation_trains_on_the_bases_own_tokens(base, tmp_path):
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "What is two plus two?"}, {"prompt": "Name a colour.", "response": "reference answer"}, {"prompt": "Hi", "source": "gpqa"}],
    )
    source = parse_source_flag(f"{prompts},kind=distill,base={base},max_new_tokens=6,batch_size=2,name=self")
    out = build_data([source], base, tmp_path / "data", DataConfig(block_size=4, seq_len=64))
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    (record,) = manifest["sources"]
    generator = record["generator"]
    assert generator["responses"] == 2 and generator["prompt_filter"]["dropped"] == {"benchmark_metadata": 1}
    assert generator["base_files"]["model.safetensors"]["sha256"] == sha256_file(base / "model.safetensors")
    rows = [json.loads(line) for line in (out / "distill" / "self.jsonl").read_text().splitlines()]
    assert manifest["outputs"]["distill/self.jsonl"]["sha256"] == sha256_file(out / "distill" / "self.jsonl")
    assert all(m["role"] != "assistant" for r in rows for m in r["messages"])  # the reference answer is not used
    assert all(1 <= len(r["response_ids"]) <= 6 for r in rows)
    arrays, _ = load_rows(out / TRAIN_FILE)
    packed = arrays["input_ids"].ravel().tolist()
    for r in rows:  # the exact generated tokens are the targets
        want = r["prompt_ids"] + r["response_ids"]
        assert any(packed[i : i + len(want)] == want for i in range(len(packed)))
    assert record["samples"] == 2 and int(arrays["loss_mask"].sum()) >= sum(len(r["response_ids"]) for r in rows)
    # Each response token carries the base's probability of it where it is packed; prompt tokens none (NaN).
    confidence = arrays["confidence"].astype(np.float32).ravel()
    for r in rows:
        want = r["prompt_ids"] + r["response_ids"]
        at = next(i for i in range(len(packed)) if packed[i : i + len(want)] == want)
        response = at + len(r["prompt_ids"])
        assert np.isnan(confidence[at:response]).all()
        assert np.allclose(confidence[response : response + len(r["response_ids"])], r["response_confidence"], atol=1e-3)


def test_sources_file_paths_are_relative_to_it(base, tmp_path):
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "a.jsonl", clean_rows(3))
    listing = tmp_path / "sources.json"
    listing.write_text(json.dumps([{"path": "corpus/a.jsonl", "name": "a", "revision": "2024-01", "license": "cc0"}]))
    from a2d_convert.data import read_sources_file

    (source,) = read_sources_file(listing)
    assert source.path == tmp_path / "corpus" / "a.jsonl" and source.revision == "2024-01"
    with pytest.raises(A2DError, match=r"sources.json\[0\]: unknown source field"):
        listing.write_text(json.dumps([{"path": "corpus/a.jsonl", "licence": "x"}]))
        read_sources_file(listing)


FIXTURES = Path(__file__).resolve().parents[2] / "eval" / "fixtures"


def test_each_benchmarks_own_file_is_a_blocklist_source(base, tmp_path):
    """The files `a2d eval` reads (eval/fixtures has their published shapes), alone or as the folder."""
    import csv

    with open(FIXTURES / "gpqa_diamond.csv", encoding="utf-8", newline="") as f:
        gpqa = next(csv.DictReader(f))["Question"]
    math = json.loads((FIXTURES / "math_500.jsonl").read_text().splitlines()[0])
    lcb = json.loads((FIXTURES / "livecodebench_v6.jsonl").read_text().splitlines()[1])["question_content"]
    mmlu = pq.read_table(FIXTURES / "mmlu_pro.parquet").to_pylist()[1]["question"]
    leaked = {  # ids that name no benchmark: only the n-gram filter may catch these rows
        "leak-1": f"Here is one: {gpqa}",
        "leak-2": f"Try this. {math['problem']}",
        "leak-3": f"My answer: {math['solution']}",
        "leak-4": f"Please solve: {lcb[:400]}",
        "leak-5": f"Quiz time! {mmlu}",
    }
    rows = clean_rows(6) + [{"id": k, "prompt": v, "response": "Sure.", "source": "web"} for k, v in leaked.items()]
    src = write_jsonl(tmp_path / "mix.jsonl", rows)
    blocklists = [FIXTURES, FIXTURES / "jsonl" / "mmlu_pro.jsonl"]
    out = build_data([Source(path=src, name="mix")], base, tmp_path / "data", DataConfig(block_size=4, seq_len=96), blocklists)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    (source,) = manifest["sources"]
    assert {d["id"] for d in source["dropped_examples"]} == set(leaked)
    assert source["dropped"] == {"ngram_overlap": len(leaked)} and source["rows_kept"] == 6
    files = {Path(f["path"]).name: f for f in manifest["filters"]["ngram_overlap"]["blocklist"]}
    assert {name: f["format"] for name, f in files.items()} == {
        "gpqa_diamond.csv": "gpqa_diamond",
        "livecodebench_v6.jsonl": "livecodebench",
        "math_500.jsonl": "math_500",
        "mmlu_pro.jsonl": "mmlu_pro",
        "mmlu_pro.parquet": "mmlu_pro",
    }
    assert all(f["entries"] > 0 and f["sha256"] == sha256_file(f["path"]) for f in files.values())
    # A file of no benchmark's shape is named with the fix.
    odd = write_jsonl(tmp_path / "odd.jsonl", [{"title": "no question here"}])
    with pytest.raises(A2DError, match=r"odd.jsonl row 0: no question field; use a benchmark's own file"):
        build_data([Source(path=src, name="mix")], base, tmp_path / "d2", DataConfig(block_size=4, seq_len=96), [odd])
