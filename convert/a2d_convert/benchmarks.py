"""The data filters' vocabulary: which metadata names a benchmark or an evaluation split.

The lists live in benchmarks.json beside this file (a maintained data file; convert/tests/test_benchmarks.py
checks every spelling of every entry). Matching works on *words*: a metadata string is cut at every
separator, at camelCase humps and between letters and digits ('LiveCodeBench-v6' -> live code bench v 6,
'humanitys_last_exam' -> humanitys last exam), lower-cased, and a name matches a run of whole words whose
letters and digits spell it ('live code bench' = 'livecodebench' = the name 'LiveCodeBench'), optionally
followed inside the last word by a version ('livecodebenchv6', 'aime24'); never a part of a word ('aimed',
'flcb', 'while' do not name aime, lcb, hle). A split field is any key with one of the split words among its
words ('split', 'hf_split', 'dataset_split', 'subset', ...), at any depth of the metadata (nested objects,
lists, and strings that hold a JSON object); its value names an evaluation split when one of its words is an
eval word or starts with an eval prefix ('test', 'testmini', 'validation_matched', 'dev_clean').
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Iterator

VOCABULARY_FILE = Path(__file__).with_name("benchmarks.json")
_VERSION = re.compile(r"v?\d*")


@functools.cache
def vocabulary() -> dict[str, Any]:
    return json.loads(VOCABULARY_FILE.read_text(encoding="utf-8"))


def words(text: str) -> list[str]:
    """Lower-case words and digit runs, cut at separators, camelCase humps and letter/digit changes."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)  # camelCase -> camel Case
    text = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", text)  # GPQADiamond -> GPQA Diamond
    return re.findall(r"[a-z]+|\d+", text.lower())


def compact(name: str) -> str:
    return "".join(words(name))


class BenchmarkNames:
    """Finds a benchmark name in free text (names compared as their letters and digits, on word runs)."""

    def __init__(self, names) -> None:
        self.names = tuple(names)
        self.compact = sorted({compact(n) for n in self.names if compact(n)}, key=len, reverse=True)
        # A run never needs more words than the longest name has, plus one for a version.
        self.max_run = max((len(words(n)) for n in self.names), default=0) + 1

    def find(self, text: str) -> str | None:
        """The first name `text` names (as it appears there), or None."""
        ws = words(text)
        for start in range(len(ws)):
            run = ""
            for end in range(start, min(len(ws), start + self.max_run)):
                run += ws[end]
                for name in self.compact:
                    if run.startswith(name) and _VERSION.fullmatch(run[len(name):]):
                        return " ".join(ws[start : end + 1])
        return None


def default_names() -> tuple[str, ...]:
    return tuple(vocabulary()["names"])


def is_split_key(key: str) -> bool:
    return any(w in vocabulary()["split_keys"] for w in words(key))


def is_eval_split(value: Any) -> bool:
    """A split value that names a test/validation/dev/eval split."""
    if not isinstance(value, str):
        return False
    vocab = vocabulary()
    return any(w in vocab["eval_split_words"] or w.startswith(tuple(vocab["eval_split_prefixes"])) for w in words(value))


def _as_object(value: Any) -> Any:
    """A string that holds a JSON object (LiveCodeBench's `metadata`, say) is walked as that object."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def split_fields(metadata: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key path, value) of every split field at any depth of the metadata."""
    metadata = _as_object(metadata)
    if isinstance(metadata, dict):
        for key, value in metadata.items():
            here = f"{path}.{key}" if path else str(key)
            value = _as_object(value)
            if is_split_key(str(key)) and not isinstance(value, (dict, list)):
                yield here, value
            elif is_split_key(str(key)) and isinstance(value, list) and all(not isinstance(v, (dict, list)) for v in value):
                yield from ((here, v) for v in value)
            else:
                yield from split_fields(value, here)
    elif isinstance(metadata, list):
        for i, value in enumerate(metadata):
            yield from split_fields(value, f"{path}[{i}]")


def eval_split_reason(metadata: dict[str, Any]) -> str | None:
    for path, value in split_fields(metadata):
        if is_eval_split(value):
            return f"{path}={value!r}"
    return None


def metadata_strings(value: Any) -> Iterator[str]:
    """Every key and string value at any depth (JSON-object strings walked as objects, and kept whole)."""
    if isinstance(value, str):
        yield value
        parsed = _as_object(value)
        if parsed is not value:
            yield from metadata_strings(parsed)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from metadata_strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from metadata_strings(v)


def benchmark_reason(metadata: dict[str, Any], names: BenchmarkNames) -> str | None:
    for text in metadata_strings(metadata):
        found = names.find(text)
        if found:
            return f"metadata names {found!r}"
    return None


# ------------------------------------------------------------------------------------- blocklist files

# Each benchmark's own file, as `a2d eval` reads it (eval/benchmarks/*.ts): the field that identifies the
# format, and the fields whose text is benchmark content (questions, and the worked solutions and
# explanations the files carry: training text that quotes them leaks the answers too).
QUESTION_FORMATS = (
    ("gpqa_diamond", ("Question", "Incorrect Answer 1"), ("Question", "Pre-Revision Question", "Explanation")),
    ("livecodebench", ("question_content",), ("question_content",)),
    ("math_500", ("problem", "answer"), ("problem", "solution")),
    ("mmlu_pro", ("question", "options"), ("question",)),
)
GENERIC_QUESTION_FIELDS = ("question", "problem", "prompt", "text", "Question", "input", "question_content")
# What `--blocklist DIR` reads: a folder laid out for `a2d eval --data DIR`, or any other benchmark files.
BLOCKLIST_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".json", ".parquet", ".txt")


def question_format(columns) -> tuple[str, tuple[str, ...]]:
    """(format name, fields holding benchmark text) for a row or table with these columns."""
    present = set(columns)
    for name, identifying, fields in QUESTION_FORMATS:
        if set(identifying) <= present:
            return name, tuple(f for f in fields if f in present)
    return "questions", tuple(f for f in GENERIC_QUESTION_FIELDS if f in present)
