"""The data filters' vocabulary (benchmarks.json): every spelling of every benchmark name, nested and
oddly named split fields, and no match on look-alike words."""

import json

import pytest

from a2d_convert.benchmarks import BenchmarkNames, default_names, eval_split_reason, benchmark_reason, words

NAMES = BenchmarkNames(default_names())


def spellings(name: str) -> list[str]:
    """How a name turns up in dataset metadata: re-separated, re-cased, camelCased, run together, versioned."""
    ws = words(name)
    camel = "".join(w.capitalize() for w in ws)
    variants = ["_".join(ws), "-".join(ws), " ".join(ws), " ".join(ws).upper(), camel, "".join(ws), "".join(ws).upper()]
    variants += [f"{'_'.join(ws)}_v6", f"{camel}-v2", f"{''.join(ws)}2025", f"org/{'-'.join(ws)}", f"{camel}Test"]
    return variants


@pytest.mark.parametrize("name", default_names())
def test_every_listed_name_is_found_in_every_spelling(name):
    for text in spellings(name):
        assert NAMES.find(text), f"{name!r} not found in {text!r}"


@pytest.mark.parametrize(
    "text",
    [
        "live_code_bench_v6", "LiveCodeBench-v6", "livecodebench/v6", "livecodebenchv6", "lcb_v6", "LCB",
        "humanitys_last_exam", "Humanity's Last Exam", "cais/hle", "HLE", "hle_v1",
        "gpqa_diamond", "GPQA-Diamond", "GPQADiamond", "Idavidrein/gpqa",
        "math500", "MATH-500", "math_500", "Math 500", "HuggingFaceH4/MATH-500",
        "mmlu_pro", "MMLU-Pro", "MMLUPro", "mmlupro", "TIGER-Lab/MMLU-Pro", "mmlu",
        "aime24", "AIME 2025", "aime_2024", "AIME2024", "HumanEval+", "humaneval", "openai_humaneval",
        "mbpp", "BigCodeBench", "arc-agi", "ARC_AGI_2", "ArcAgi",
    ],
)
def test_the_variants_seen_in_real_metadata_are_found(text):
    assert NAMES.find(text), text


@pytest.mark.parametrize(
    "text",
    ["aimed at", "self-written", "mathematics 500 problems", "flcb", "mmlucky", "while", "humane", "gpq", "arcade",
     "livebenches", "samc", "dataset", "math"],
)
def test_look_alike_words_are_not_benchmarks(text):
    assert NAMES.find(text) is None, text


@pytest.mark.parametrize(
    "metadata",
    [
        {"split": "test"},
        {"Split": "Test"},
        {"split": "testmini"},
        {"hf_split": "test"},
        {"dataset_split": "validation_matched"},
        {"meta": {"split": "test"}},
        {"meta": {"source": {"data": {"subset": "dev"}}}},
        {"info": [{"name": "x"}, {"split": "eval"}]},
        {"splits": ["train", "test"]},
        {"metadata": json.dumps({"split": "test"})},
        {"fold": "heldout"},
        {"partition": "dev_clean"},
    ],
)
def test_eval_splits_are_found_at_any_depth_and_spelling(metadata):
    assert eval_split_reason(metadata), metadata


@pytest.mark.parametrize(
    "metadata",
    [{"split": "train"}, {"split": "training"}, {"hf_split": "train_sft"}, {"meta": {"split": "train"}}, {"dataset": "test"},
     {"note": "we test things"}, {"subset": "algebra"}, {"split": ["train"]}],
)
def test_training_splits_and_other_fields_pass(metadata):
    assert eval_split_reason(metadata) is None, metadata


def test_names_are_found_in_nested_metadata_and_json_strings():
    assert benchmark_reason({"meta": {"origin": {"dataset": "livecodebench/code_generation_lite"}}}, NAMES)
    assert benchmark_reason({"metadata": json.dumps({"source": "humanitys_last_exam"})}, NAMES)
    assert benchmark_reason({"tags": ["chat", "AIME 2025"]}, NAMES)
    assert benchmark_reason({"source": "self-written", "meta": {"split": "train"}}, NAMES) is None


def test_the_blocklist_folder_names_are_the_files_a2d_eval_reads():
    """benchmarks.json's eval_data_files equal the `files` every eval/benchmarks/*.ts reader looks for."""
    import re
    from pathlib import Path

    from a2d_convert.benchmarks import vocabulary

    readers = Path(__file__).resolve().parents[2] / "eval" / "benchmarks"
    listed = set()
    for ts in readers.glob("*.ts"):
        for group in re.findall(r"files:\s*\[([^\]]*)\]", ts.read_text(encoding="utf-8")):
            listed |= set(re.findall(r'"([^"]+)"', group))
    assert listed and set(vocabulary()["eval_data_files"]) == listed
