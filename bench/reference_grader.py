"""A reference grader for `a2d eval`, written from the official harnesses' rules and apart from eval/'s
code, to check a2d's per-item grades. It reads the benchmark files itself and grades responses:

  python bench/reference_grader.py items --data eval/fixtures --details DETAILS.jsonl [--rules a2d|official]
      one JSON line per line of DETAILS (an `a2d eval --details` file): {"benchmark", "id", "correct"}
  python bench/reference_grader.py endings DIR [--rules a2d|official]
      the eval/fixtures/endings tables: {"gpqa_diamond": [letter, ...], "mmlu_pro": [...],
      "livecodebench_v6": [code, ...], "math_500": [bool, ...]}

--rules official: the harnesses as published -- simple-evals' GPQA pattern, first match
(gpqa_eval.py); TIGER-Lab's MMLU-Pro cascade (evaluate_from_api.py); lcb_runner's extract_code and
testing_util (bench/reference_lcb_run.py); math-verify as its own MATH-500 task configures the
prediction (LatexExtractionConfig(), ExprExtractionConfig()).
--rules a2d (default): the same plus the departures docs/eval.md lists: the reasoning before the last
</think> is dropped (an unclosed <think> leaves no answer), GPQA's letter must be a whole word and gets
fallbacks where simple-evals reads nothing, and an MMLU-Pro answer without a letter gets the guess
sha256("mmlu_pro guess:" + id) mod the option count.
LiveCodeBench programs run here unsandboxed: only for the trusted fixed answers of the fixtures.
"""

import argparse
import base64
import csv
import hashlib
import json
import pickle
import random
import re
import subprocess
import sys
import zlib
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).parent

# ---------------------------------------------------------------- reasoning


def answer_part(content, rules):
    if rules == "official":
        return content
    if "</think>" in content:
        return content.rsplit("</think>", 1)[1].strip()
    return "" if content.lstrip().startswith("<think>") else content.strip()


# ---------------------------------------------------------------- GPQA

SIMPLE_EVALS_MULTICHOICE = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?"
WHOLE_WORD_MULTICHOICE = r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])(?!\w)"


def simple_evals_normalize(text):
    for piece in ("**", "$\\boxed{", "}$", "\\$", "$\\text{", "$", "\\mathrm{", "\\{", "\\text", "\\(", "\\mathbf{", "{", "\\boxed"):
        text = text.replace(piece, "")
    return text


def gpqa_letter(text, rules):
    if rules == "official":
        found = re.search(SIMPLE_EVALS_MULTICHOICE, text)
        return found.group(1).upper() if found else None
    found = re.search(WHOLE_WORD_MULTICHOICE, text)
    if found:
        return found.group(1).upper()
    plain = simple_evals_normalize(text)
    matches = re.findall(WHOLE_WORD_MULTICHOICE, plain)
    if matches:
        return matches[-1].upper()
    # the remaining fallbacks: last match; a letter outside brackets must be a capital
    candidates = [
        (plain, r"(?i)Answer\s*:\s*([(\[])?\s*([A-D])\s*[)\]]?(?!\w)"),
        (text.replace("**", ""), r"(?i)(?<!\w)(?:answer|choice|option)\s+is\s*:?\s*(?:option\s+|choice\s+)?([(\[])?\s*([A-D])\s*[)\]]?(?!\w)"),
    ]
    for source, pattern in candidates:
        for bracket, letter in reversed(re.findall(pattern, source)):
            if bracket or letter.isupper():
                return letter.upper()
    boxed = re.findall(r"(?i)\\boxed\s*\{\s*(?:\\(?:text|textbf|mathrm|mathbf)\s*\{\s*)?\(?\s*([A-D])\s*\)?\s*\}", text)
    return boxed[-1].upper() if boxed else None


def gpqa_rows(data):
    with open(data / "gpqa_diamond.csv", newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    rng = random.Random(0)
    keyed = {}
    for number, row in enumerate(rows, start=1):
        order = rng.sample(range(4), 4)
        answers = [row["Correct Answer"], row["Incorrect Answer 1"], row["Incorrect Answer 2"], row["Incorrect Answer 3"]]
        shown = [answers[i] for i in order]
        keyed[row.get("Record ID", "").strip() or str(number)] = "ABCD"[shown.index(row["Correct Answer"])]
    return keyed


# ---------------------------------------------------------------- MMLU-Pro


def tiger_lab_letter(text):
    text = text.replace("**", "")
    found = re.search(r"answer is \(?([A-J])\)?", text)
    if found:
        return found.group(1)
    found = re.search(r".*[aA]nswer:\s*([A-J])", text)
    if found:
        return found.group(1)
    found = re.search(r"\b[A-J]\b(?!.*\b[A-J]\b)", text, re.DOTALL)
    return found.group(0) if found else None


def mmlu_rows(data):
    import pyarrow.parquet as pq

    parquet = data / "mmlu_pro.parquet"
    rows = pq.read_table(parquet).to_pylist() if parquet.exists() else [json.loads(line) for line in open(data / "mmlu_pro.jsonl") if line.strip()]
    return {str(row["question_id"]): (row["answer"], [o for o in row["options"] if o != "N/A"]) for row in rows}


def mmlu_guess(item_id, option_count):
    digest = hashlib.sha256(f"mmlu_pro guess:{item_id}".encode()).digest()
    return "ABCDEFGHIJ"[int.from_bytes(digest[:4], "big") % option_count]


# ---------------------------------------------------------------- MATH-500


def math_correct(gold, text):
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold_parsed = parse(f"${gold}$", extraction_config=[LatexExtractionConfig()])
    predicted = parse(text, extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()])
    return bool(predicted) and bool(verify(gold_parsed, predicted))


def math_rows(data):
    rows = [json.loads(line) for line in open(data / "math_500.jsonl", encoding="utf-8") if line.strip()]
    return {str(row.get("unique_id", number)): row["answer"] for number, row in enumerate(rows, start=1)}


# ---------------------------------------------------------------- LiveCodeBench


def lcb_code(text):
    lines = text.split("\n")
    fence_lines = [number for number, line in enumerate(lines) if "```" in line]
    if len(fence_lines) < 2:
        return None
    return "\n".join(lines[fence_lines[-2] + 1 : fence_lines[-1]])


def lcb_rows(data):
    start, end = datetime.strptime("2025-02-01", "%Y-%m-%d"), datetime.strptime("2025-05-01", "%Y-%m-%d")
    problems = {}
    for line in open(data / "livecodebench_v6.jsonl", encoding="utf-8"):
        if not line.strip():
            continue
        row = json.loads(line)
        if not start <= datetime.fromisoformat(row["contest_date"]) <= end:
            continue
        try:
            private = json.loads(row["private_test_cases"])
        except json.JSONDecodeError:
            private = json.loads(pickle.loads(zlib.decompress(base64.b64decode(row["private_test_cases"].encode("utf-8")))))
        tests = json.loads(row["public_test_cases"]) + private
        problems[row["question_id"]] = {
            "inputs": [t["input"] for t in tests],
            "outputs": [t["output"] for t in tests],
            "fn_name": json.loads(row["metadata"]).get("func_name"),
        }
    return problems


def lcb_passes(problem, code):
    job = dict(problem, code=code, timeout=6)
    limit = (6 + 1) * len(problem["inputs"]) + 5
    try:
        done = subprocess.run([sys.executable, str(HERE / "reference_lcb_run.py")], input=json.dumps(job), capture_output=True,
                              text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return False
    lines = done.stdout.strip().splitlines()
    return bool(lines) and json.loads(lines[-1])["passed"]


# ---------------------------------------------------------------- commands


def grade_items(data, details, rules):
    gpqa = gpqa_rows(data) if (data / "gpqa_diamond.csv").exists() else {}
    mmlu = mmlu_rows(data) if (data / "mmlu_pro.parquet").exists() or (data / "mmlu_pro.jsonl").exists() else {}
    maths = math_rows(data) if (data / "math_500.jsonl").exists() else {}
    code = lcb_rows(data) if (data / "livecodebench_v6.jsonl").exists() else {}
    for line in open(details, encoding="utf-8"):
        if not line.strip():
            continue
        item = json.loads(line)
        text = answer_part(item["content"], rules)
        bench, item_id = item["benchmark"], item["id"]
        if item.get("error", "").startswith("request refused"):
            correct = False
        elif bench == "gpqa_diamond":
            correct = gpqa_letter(text, rules) == gpqa[item_id]
        elif bench == "mmlu_pro":
            answer, options = mmlu[item_id]
            letter = tiger_lab_letter(text)
            if letter is None and rules == "a2d":
                letter = mmlu_guess(item_id, len(options))
            correct = letter == answer
        elif bench == "math_500":
            correct = text.strip() != "" and math_correct(maths[item_id], text)
        elif bench == "livecodebench_v6":
            extracted = lcb_code(text)
            correct = extracted is not None and lcb_passes(code[item_id], extracted)
        else:
            raise SystemExit(f"unknown benchmark {bench}")
        print(json.dumps({"benchmark": bench, "id": item_id, "correct": correct}))


def grade_endings(folder, rules):
    """The tables state each harness's reading of the same final answer, so the reasoning is cut either way."""
    rows = lambda name: [answer_part(r["content"], "a2d") for r in json.load(open(folder / f"{name}.json", encoding="utf-8"))["rows"]]
    golds = [r["gold"] for r in json.load(open(folder / "math_500.json", encoding="utf-8"))["rows"]]
    print(json.dumps({
        "gpqa_diamond": [gpqa_letter(text, rules) for text in rows("gpqa_diamond")],
        "mmlu_pro": [tiger_lab_letter(text) for text in rows("mmlu_pro")],
        "livecodebench_v6": [lcb_code(text) for text in rows("livecodebench_v6")],
        "math_500": [text.strip() != "" and math_correct(gold, text) for gold, text in zip(golds, rows("math_500"))],
    }))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    items = sub.add_parser("items")
    items.add_argument("--data", type=Path, required=True)
    items.add_argument("--details", type=Path, required=True)
    items.add_argument("--rules", choices=["a2d", "official"], default="a2d")
    endings = sub.add_parser("endings")
    endings.add_argument("folder", type=Path)
    endings.add_argument("--rules", choices=["a2d", "official"], default="a2d")
    args = parser.parse_args()
    sys.set_int_max_str_digits(50000)
    if args.command == "items":
        grade_items(args.data, args.details, args.rules)
    else:
        grade_endings(args.folder, args.rules)


if __name__ == "__main__":
    main()
