"""`data`: tokenized, packed block-diffusion training rows from declared sources, and their manifest.

Sources are local files (JSONL, JSON lists, Parquet, plain text), declared with `--source
PATH[,key=value...]` or in a `--sources FILE.json` list, or a *self-distillation* source: prompts
answered by the AR base itself with transformers' `generate` (greedy or sampled), so the converted
model learns the base's own behaviour without outside data — one main response per prompt, plus
`samples` sampled ones each seeded per (seed, prompt, sample), by one process or `workers` processes
over the visible GPUs, optionally bounded by `time_limit_s` (distill.py). A row is one of
- chat: `messages` (or ShareGPT `conversations`) — loss on every assistant turn;
- prompt/response: `prompt`+`response` (also question/answer, instruction/output, problem/solution),
  rendered as a user turn and an assistant turn with the chat template — loss on the response only;
- distilled: `prompt_ids` + `response_ids` — the exact tokens the base produced, loss on the response, and
  with greedy answers `response_confidence`, the base's probability of each token it chose;
- text: `text` (or a text file, or its lines/paragraphs) — loss on every token, EOS appended.
Every other field of a row is its metadata.

Filters, applied in this order, each dropped row counted (and the first ones listed) in the manifest:
1. `eval_split`: a split-like metadata field at any depth (split, hf_split, meta.split, subset, fold,
   ...) or the source's declared split names a test/validation/dev/eval split (test, testmini, ...).
2. `benchmark_metadata`: any metadata string (or the source's name) names a benchmark of the maintained
   list in benchmarks.json (gpqa, livecodebench, math-500, mmlu(-pro), aime, humanity's last exam, ...,
   and `--benchmark-name` additions), whatever its case and separators (benchmarks.py).
3. `ngram_overlap`: the row's text shares a 13-gram of normalised words with a `--blocklist` entry
   (benchmark questions the user supplies); entries shorter than n words must appear whole.

Layout (what train.py reads): every sample is placed so that its first loss token starts a block of
`block_size` positions (a gap of unused slots before it when needed), because decoding starts its first
block right after the prompt; its end is padded to a block boundary with the pad token (trained on as
a target when the sample is finished, so the model learns to fill a block's tail after EOS). Samples
are packed first-fit into rows of `seq_len` tokens; position ids restart at 0 for every sample and
attention never crosses samples (segment ids). train.safetensors holds int32 `input_ids`, uint8
`loss_mask` and int32 `segment_ids` (0 = unused slot), each [rows, seq_len], and where any sample has the base's
confidences, float16 `confidence` (each response token's; NaN elsewhere, 1 on a finished sample's pads), which
`train --mask-pattern teacher` orders its masks by.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from tqdm import tqdm

from . import benchmarks
from . import lineage as lin
from .config import read_json, write_json
from .errors import A2DError
from .tiny import staged_out_dir

MANIFEST_FILE = "data_manifest.json"
TRAIN_FILE = "train.safetensors"
HELDOUT_FILE = "heldout.safetensors"
DATA_FORMAT = "a2d-data-1"

BENCHMARK_NAMES = benchmarks.default_names()  # benchmarks.json, the maintained list
PROMPT_RESPONSE_FIELDS = (
    ("prompt", "response"),
    ("prompt", "completion"),
    ("question", "answer"),
    ("instruction", "output"),
    ("problem", "solution"),
    ("query", "response"),
)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
MAX_DROP_EXAMPLES = 50


# --------------------------------------------------------------------------------------------- sources


@dataclass
class Source:
    """One declared data source (a row of --sources, or one --source flag)."""

    path: Path  # file or folder of files; for kind=distill the prompts file
    name: str = ""  # defaults to the file name
    kind: str = "rows"  # rows | distill
    format: str = "auto"  # jsonl | json | parquet | text | auto (by extension)
    split: str = "train"  # the split this source is declared to be
    revision: str = ""  # dataset revision / version, recorded
    license: str = ""
    url: str = ""
    text_unit: str = "file"  # text files: one sample per file | line | paragraph
    max_rows: int = 0  # 0: all rows
    system: str = ""  # system prompt added to prompt/response rows
    enable_thinking: str = ""  # "true"/"false": passed to the chat template; "" leaves it undefined
    # self-distillation only
    base: str = ""  # AR base folder that answers the prompts
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 8
    batch_slots: int = 0  # KV cache slots a batch may hold, rows x (longest prompt + max_new_tokens); 0: no bound
    seed: int = 0
    samples: int = 0  # sampled responses per prompt besides the main one, each seeded per (seed, prompt, sample)
    sample_temperature: float = 0.8
    sample_top_p: float = 0.95
    workers: int = 1  # generating processes, spread over the visible GPUs in turn; 0: one per GPU
    time_limit_s: float = 0.0  # start no batch expected to end past this many seconds; 0: no limit

    @staticmethod
    def from_dict(raw: dict[str, Any], where: str) -> "Source":
        known = {f.name: f for f in fields(Source)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise A2DError(f"{where}: unknown source field(s) {unknown}; known: {sorted(known)}")
        if "path" not in raw:
            raise A2DError(f"{where}: a source needs a 'path'")
        values: dict[str, Any] = {}
        for key, value in raw.items():
            kind = known[key].type
            try:
                if kind == "Path":
                    values[key] = Path(value)
                elif kind == "int":
                    values[key] = int(value)
                elif kind == "float":
                    values[key] = float(value)
                else:
                    values[key] = str(value)
            except (TypeError, ValueError):
                raise A2DError(f"{where}: source field {key}={value!r} is not a valid {kind}") from None
        source = Source(**values)
        source.name = source.name or source.path.name
        if source.kind not in ("rows", "distill"):
            raise A2DError(f"{where}: kind {source.kind!r} must be 'rows' or 'distill'")
        if source.kind == "distill" and not source.base:
            raise A2DError(f"{where}: a distill source needs base=DIR (the AR base that answers the prompts)")
        if source.text_unit not in ("file", "line", "paragraph"):
            raise A2DError(f"{where}: text_unit {source.text_unit!r} must be file, line or paragraph")
        if source.enable_thinking not in ("", "true", "false"):
            raise A2DError(f"{where}: enable_thinking must be true, false or empty")
        if not source.path.exists():
            raise A2DError(f"{where}: {source.path} does not exist; fix the path")
        return source


def parse_source_flag(text: str) -> Source:
    """`PATH[,key=value...]` -> Source."""
    path, *pairs = text.split(",")
    raw: dict[str, Any] = {"path": path}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise A2DError(f"--source {text!r}: {pair!r} is not key=value")
        raw[key.strip()] = value.strip()
    return Source.from_dict(raw, f"--source {text}")


def read_sources_file(path: Path) -> list[Source]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise A2DError(f"{path}: cannot read the sources list ({err})") from None
    if not isinstance(raw, list):
        raise A2DError(f"{path}: expected a JSON list of source objects")
    base = path.parent
    sources = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise A2DError(f"{path}[{i}]: expected an object")
        item = dict(item)
        if "path" in item and not Path(item["path"]).is_absolute():
            item["path"] = str(base / item["path"])  # relative to the sources file, like a config file
        if item.get("base") and not Path(item["base"]).is_absolute():
            item["base"] = str(base / item["base"])
        sources.append(Source.from_dict(item, f"{path}[{i}]"))
    return sources


def source_files(source: Source) -> list[Path]:
    if source.path.is_file():
        return [source.path]
    files = sorted(p for p in source.path.rglob("*") if p.is_file() and file_format(p, "auto", strict=False))
    if not files:
        raise A2DError(f"{source.path}: no .jsonl/.json/.parquet/.txt/.md files in this folder")
    return files


def file_format(path: Path, declared: str, strict: bool = True) -> str | None:
    if declared != "auto":
        return declared
    suffix = path.suffix.lower()
    kinds = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".txt": "text", ".md": "text"}
    if suffix not in kinds and strict:
        raise A2DError(f"{path}: cannot tell the format from {suffix!r}; add format=jsonl|json|parquet|text to the source")
    return kinds.get(suffix)


def read_rows(source: Source, path: Path) -> Iterator[dict[str, Any]]:
    kind = file_format(path, source.format)
    if kind == "jsonl":
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise A2DError(f"{path}:{line_no}: not valid JSON ({err.msg}); fix or remove the line") from None
                if not isinstance(row, dict):
                    raise A2DError(f"{path}:{line_no}: a row must be a JSON object")
                yield row
    elif kind == "json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise A2DError(f"{path}: a .json source must hold a list of row objects")
        yield from rows
    elif kind == "parquet":
        import pyarrow.parquet as pq

        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            yield from batch.to_pylist()
    elif kind == "text":
        text = path.read_text(encoding="utf-8")
        if source.text_unit == "file":
            yield {"text": text, "file": path.name}
        elif source.text_unit == "line":
            yield from ({"text": line} for line in text.splitlines())
        else:
            yield from ({"text": para} for para in re.split(r"\n\s*\n", text))
    else:
        raise A2DError(f"{path}: unknown format {kind!r}; use jsonl, json, parquet or text")


# --------------------------------------------------------------------------------------------- rows


@dataclass
class Example:
    """A row's content, separated from its metadata."""

    messages: list[dict[str, str]] | None = None  # chat (prompt/response rows become two turns)
    text: str | None = None
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_confidence: list[float] | None = None  # distilled greedy answers: the base's probability of each token
    metadata: dict[str, Any] = field(default_factory=dict)

    def content_text(self, decode) -> str:
        if self.messages is not None:
            return "\n".join(m["content"] for m in self.messages)
        if self.text is not None:
            return self.text
        return decode(self.prompt_ids) + "\n" + decode(self.response_ids)


def to_example(row: dict[str, Any], source: Source) -> Example | None:
    row = dict(row)
    if "prompt_ids" in row and "response_ids" in row:
        prompt_ids, response_ids = row.pop("prompt_ids"), row.pop("response_ids")
        confidence = row.pop("response_confidence", None)
        row.pop("messages", None)
        row.pop("response", None)
        if confidence is not None and len(confidence) != len(response_ids):
            confidence = None  # not this response's: order its masks at random
        return Example(prompt_ids=list(prompt_ids), response_ids=list(response_ids), response_confidence=confidence, metadata=row)
    for key in ("messages", "conversations"):
        turns = row.get(key)
        if isinstance(turns, list) and turns:
            row.pop(key)
            messages = []
            for turn in turns:
                if not isinstance(turn, dict):
                    return None
                role = turn.get("role", turn.get("from"))
                content = turn.get("content", turn.get("value"))
                if role not in SHAREGPT_ROLES or not isinstance(content, str):
                    return None
                messages.append({"role": SHAREGPT_ROLES[role], "content": content})
            return Example(messages=messages, metadata=row)
    for prompt_key, response_key in PROMPT_RESPONSE_FIELDS:
        prompt, response = row.get(prompt_key), row.get(response_key)
        if isinstance(prompt, str) and isinstance(response, str):
            row.pop(prompt_key)
            row.pop(response_key)
            messages = [{"role": "system", "content": source.system}] if source.system else []
            messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            return Example(messages=messages, metadata=row)
    for key in ("text", "content"):
        if isinstance(row.get(key), str):
            text = row.pop(key)
            return Example(text=text, metadata=row)
    return None


def is_empty(example: Example | None) -> bool:
    if example is None:
        return True
    if example.messages is not None:
        return not any(m["role"] == "assistant" and m["content"].strip() for m in example.messages)
    if example.text is not None:
        return not example.text.strip()
    return not example.response_ids


# --------------------------------------------------------------------------------------------- filters


def normalised_words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def ngram_key(words: list[str]) -> bytes:
    # Stable across processes (Python's hash() is salted per run).
    return hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest()


@dataclass
class Blocklist:
    n: int
    ngrams: set[bytes] = field(default_factory=set)
    short_lengths: set[int] = field(default_factory=set)  # lengths of entries shorter than n
    files: list[dict[str, Any]] = field(default_factory=list)
    entries: int = 0
    skipped_short: int = 0  # entries too short to mean anything (fewer than min_words)

    def add(self, text: str, min_words: int) -> None:
        words = normalised_words(text)
        if len(words) < min_words:
            self.skipped_short += 1
            return
        self.entries += 1
        if len(words) < self.n:
            self.short_lengths.add(len(words))
            self.ngrams.add(ngram_key(words))
            return
        for i in range(len(words) - self.n + 1):
            self.ngrams.add(ngram_key(words[i : i + self.n]))

    def overlap(self, text: str) -> bool:
        if not self.ngrams:
            return False
        words = normalised_words(text)
        for n in (self.n, *sorted(self.short_lengths)):
            for i in range(len(words) - n + 1):
                if ngram_key(words[i : i + n]) in self.ngrams:
                    return True
        return False


def blocklist_files(path: Path) -> list[Path]:
    """A blocklist path: one file, or a folder's benchmark files: those of the names `a2d eval --data` looks for
    (other files there, notes or answers, are not benchmark text)."""
    if path.is_dir():
        names = benchmarks.vocabulary()["eval_data_files"]
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name in names)
        if not files:
            raise A2DError(f"--blocklist {path}: none of the benchmark files {', '.join(names)} in this folder; name the files themselves")
        return files
    if not path.is_file():
        raise A2DError(f"--blocklist {path}: file not found")
    return [path]


def blocklist_rows(path: Path) -> Iterator[dict[str, Any]]:
    if path.suffix.lower() == ".csv":
        import csv

        with open(path, encoding="utf-8-sig", newline="") as f:
            yield from csv.DictReader(f)
    else:
        yield from read_rows(Source(path=path, name=path.name), path)


def load_blocklist(paths: list[Path], n: int, min_words: int) -> Blocklist:
    """Benchmark text to dedup against: .txt lines, or rows of each benchmark's own file (GPQA's CSV,
    MATH-500's, MMLU-Pro's and LiveCodeBench's JSONL, MMLU-Pro's parquet: benchmarks.QUESTION_FORMATS)."""
    blocklist = Blocklist(n=n)
    for path in (f for p in paths for f in blocklist_files(Path(p))):
        before = blocklist.entries
        kind = "text lines"
        if path.suffix.lower() in (".txt", ".md"):
            for line in path.read_text(encoding="utf-8").splitlines():
                blocklist.add(line, min_words)
        else:
            for i, row in enumerate(blocklist_rows(path)):
                kind, names = benchmarks.question_format(row)
                texts = [row[k] for k in names if isinstance(row.get(k), str)]
                if not texts:
                    raise A2DError(
                        f"{path} row {i}: no question field; use a benchmark's own file (GPQA csv, MATH-500, MMLU-Pro, "
                        f"LiveCodeBench jsonl) or rows with one of {benchmarks.GENERIC_QUESTION_FIELDS}"
                    )
                for text in texts:
                    blocklist.add(text, min_words)
        blocklist.files.append({"path": str(path), **lin.file_record(path), "format": kind, "entries": blocklist.entries - before})
    return blocklist


# --------------------------------------------------------------------------------------------- tokens


class ChatTokenizer:
    """The model folder's tokenizer and chat template, through the reference's prompt codec (chat
    prompts are rendered by the template and encoded without adding special tokens), plus the EOS ids
    and the rendering of whole conversations that training needs."""

    def __init__(self, folder: Path):
        from .prompts import load_prompt_codec

        self.folder = folder
        self.codec = load_prompt_codec(folder)
        self.tokenizer = self.codec.tokenizer
        self.has_template = self.codec.chat_template is not None
        config = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        self.pad_token = self.codec.special_tokens.get("pad_token")
        self.eos_ids = self._eos_ids(folder, config)

    def _eos_ids(self, folder: Path, config: dict) -> list[int]:
        """The tokenizer's eos token first (it ends an assistant turn, so it pads samples), then the
        model's other EOS ids (a2d section, else generation_config.json)."""
        ids: list[int] = []

        def add(value) -> None:
            for v in value if isinstance(value, list) else [value]:
                if isinstance(v, int) and not isinstance(v, bool) and v not in ids:
                    ids.append(v)

        eos_text = self.codec.special_tokens.get("eos_token")
        if eos_text is not None:
            add(self.tokenizer.token_to_id(eos_text))
        a2d = read_json(folder / "config.json").get("a2d") if (folder / "config.json").is_file() else None
        if isinstance(a2d, dict):
            add(a2d.get("eos_token_ids"))
        elif (folder / "generation_config.json").is_file():
            add(read_json(folder / "generation_config.json").get("eos_token_id"))
        if not ids:
            raise A2DError(f"{folder}: no EOS token in tokenizer_config.json or generation_config.json; set eos_token_id")
        return ids

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool, enable_thinking: str) -> str:
        if not self.has_template:
            raise A2DError(f"{self.folder}: the tokenizer has no chat template, so chat rows cannot be rendered")
        thinking = None if not enable_thinking else enable_thinking == "true"
        return self.codec.render_chat(messages, thinking, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str, add_special_tokens: bool):
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids)


@dataclass
class Sample:
    ids: list[int]
    loss: list[int]
    finished: bool  # ends where the text ends (EOS/turn end), so trailing pads are real targets
    anchor: int = 0  # the index that must start a block: the response start of a prompted sample
    confidence: list[float] | None = None  # per token: the base's probability of it (NaN: unknown), or None


def chat_sample(tok: ChatTokenizer, messages: list[dict[str, str]], enable_thinking: str) -> Sample | None:
    """Loss on every assistant turn: the characters the turn adds after its generation prompt."""
    full = tok.render(messages, add_generation_prompt=False, enable_thinking=enable_thinking)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = tok.render(messages[:i], add_generation_prompt=True, enable_thinking=enable_thinking)
        through = tok.render(messages[: i + 1], add_generation_prompt=False, enable_thinking=enable_thinking)
        if not full.startswith(through) or not through.startswith(before):
            return None  # the template rewrites earlier turns: the spans cannot be located
        spans.append((len(before), len(through)))
    encoding = tok.encode(full, add_special_tokens=False)
    loss = [int(any(a <= start < b for a, b in spans)) for start, _ in encoding.offsets]
    if 1 not in loss or loss[0] == 1:
        return None
    return Sample(list(encoding.ids), loss, finished=True, anchor=loss.index(1))


def make_sample(tok: ChatTokenizer, example: Example, source: Source) -> Sample | None:
    if example.prompt_ids is not None:
        ids = list(example.prompt_ids) + list(example.response_ids)
        loss = [0] * len(example.prompt_ids) + [1] * len(example.response_ids)
        finished = bool(example.response_ids) and example.response_ids[-1] in tok.eos_ids
        confidence = None
        if example.response_confidence is not None:
            confidence = [float("nan")] * len(example.prompt_ids) + [float(c) for c in example.response_confidence]
        return Sample(ids, loss, finished, anchor=len(example.prompt_ids), confidence=confidence) if example.prompt_ids else None
    if example.messages is not None:
        return chat_sample(tok, example.messages, source.enable_thinking)
    ids = tok.encode(example.text, add_special_tokens=True).ids + [tok.eos_ids[0]]
    if len(ids) < 2:
        return None
    # The first token has no earlier state to be predicted from; everything after it is a target.
    return Sample(ids, [0] + [1] * (len(ids) - 1), finished=True)


# --------------------------------------------------------------------------------------------- packing


@dataclass
class Placed:
    """A sample laid out on the block grid: `gap` unused slots, the tokens, then pads to a block end."""

    sample: Sample
    gap: int
    length: int  # gap + tokens + pads, a multiple of the block size


def place(sample: Sample, block: int, seq_len: int, pad_id: int) -> tuple[Placed | None, bool]:
    """Returns the placed sample (None when not even one target fits) and whether it was cut."""
    gap = -sample.anchor % block
    room = seq_len - gap
    cut = False
    if len(sample.ids) > room:
        if 1 not in sample.loss[:room]:
            return None, True
        conf = sample.confidence
        sample = Sample(sample.ids[:room], sample.loss[:room], False, sample.anchor, None if conf is None else conf[:room])
        cut = True
    pads = -(gap + len(sample.ids)) % block
    if pads:
        pad_loss = 1 if sample.finished else 0
        # A finished sample's pads follow its EOS: nothing is easier to predict.
        pad_conf = None if sample.confidence is None else sample.confidence + [1.0 if sample.finished else float("nan")] * pads
        sample = Sample(sample.ids + [pad_id] * pads, sample.loss + [pad_loss] * pads, sample.finished, sample.anchor, pad_conf)
    return Placed(sample, gap, gap + len(sample.ids)), cut


def pack(placed: list[Placed], seq_len: int, pad_id: int, open_rows: int = 256, with_confidence: bool = False) -> dict[str, np.ndarray]:
    """First fit over the last `open_rows` rows; every sample starts on a block boundary of its row. with_confidence:
    a `confidence` array too (NaN where a sample has none)."""
    rows: list[list[Placed]] = []
    free: list[int] = []
    first_open = 0
    for item in placed:
        for r in range(first_open, len(rows)):
            if free[r] >= item.length:
                rows[r].append(item)
                free[r] -= item.length
                break
        else:
            rows.append([item])
            free.append(seq_len - item.length)
            first_open = max(0, len(rows) - open_rows)
    input_ids = np.full((len(rows), seq_len), pad_id, dtype=np.int32)
    loss_mask = np.zeros((len(rows), seq_len), dtype=np.uint8)
    segment_ids = np.zeros((len(rows), seq_len), dtype=np.int32)
    confidence = np.full((len(rows), seq_len), np.nan, dtype=np.float16) if with_confidence else None
    for r, items in enumerate(rows):
        offset = 0
        for segment, item in enumerate(items, 1):
            start = offset + item.gap
            end = start + len(item.sample.ids)
            input_ids[r, start:end] = item.sample.ids
            loss_mask[r, start:end] = item.sample.loss
            segment_ids[r, start:end] = segment
            if confidence is not None and item.sample.confidence is not None:
                confidence[r, start:end] = item.sample.confidence
            offset += item.length
    arrays = {"input_ids": input_ids, "loss_mask": loss_mask, "segment_ids": segment_ids}
    if confidence is not None:
        arrays["confidence"] = confidence
    return arrays


def write_rows(path: Path, arrays: dict[str, np.ndarray], metadata: dict[str, str]) -> None:
    from safetensors.numpy import save_file

    save_file(arrays, str(path), metadata=metadata)


# --------------------------------------------------------------------------------------------- distillation


def distill(source: Source, tok: ChatTokenizer, out_dir: Path, keep: "RowFilter") -> tuple[Source, dict[str, Any]]:
    """Answer the source's prompts with its AR base (distill.py: batches, processes, seeded sampling);
    returns a rows source over the generated JSONL, in prompt order (each prompt's main response, then
    its sampled ones), and the generator record for the manifest."""
    from . import distill as gen

    base = Path(source.base)
    if not (base / "config.json").is_file():
        raise A2DError(f"distill base {base}: no config.json; give the AR base folder (the output of `import`)")
    if source.samples < 0:
        raise A2DError(f"distill source {source.name}: samples={source.samples} must be 0 or more")
    if source.samples and not (0 < source.sample_temperature and 0 < source.sample_top_p <= 1):
        raise A2DError(f"distill source {source.name}: sampled responses need sample_temperature > 0 and 0 < sample_top_p <= 1")
    prompts: list[tuple[Example, list[int]]] = []
    for path in source_files(source):
        for row in read_rows(source, path):
            if source.max_rows and keep.stats["rows_read"] >= source.max_rows:
                break
            example = keep(row, prompt_only=True)
            if example is None:
                continue
            if example.messages is not None:
                messages = list(example.messages)
                while messages and messages[-1]["role"] == "assistant":
                    messages.pop()  # a prompt row may carry a reference answer: the base writes its own
                if not messages:
                    continue
            else:
                messages = [{"role": "user", "content": example.text}]
            if source.system and messages[0]["role"] != "system":
                messages = [{"role": "system", "content": source.system}, *messages]
            text = tok.render(messages, add_generation_prompt=True, enable_thinking=source.enable_thinking)
            prompts.append((Example(messages=messages, metadata=example.metadata), tok.encode(text, False).ids))
    pad_id = tok.tokenizer.token_to_id(tok.pad_token) if tok.pad_token else tok.eos_ids[0]
    settings = gen.Settings(
        max_new_tokens=source.max_new_tokens, temperature=source.temperature, top_p=source.top_p, seed=source.seed,
        sample_temperature=source.sample_temperature, sample_top_p=source.sample_top_p, eos_ids=list(tok.eos_ids), pad_id=pad_id,
    )
    safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.name)
    results, confidences, run_record = gen.run(
        base, [ids for _, ids in prompts], settings, source.samples, source.batch_size, source.workers, source.time_limit_s,
        out_dir / f".{safe_name}.work", source.name, source.batch_slots,
    )
    if prompts and not results:
        raise A2DError(f"distill source {source.name}: no prompt was answered within time_limit_s={source.time_limit_s}; raise the limit")
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / f"{safe_name}.jsonl"
    counts = {"main": 0, "sampled": 0, "unanswered_main": 0, "unanswered_sampled": 0, "duplicates_dropped": 0, "unfinished": 0}
    with open(out_path, "w", encoding="utf-8") as f:
        for i, (example, prompt_ids) in enumerate(prompts):
            seen: list[list[int]] = []
            for k in range(source.samples + 1):
                kind = "main" if k == 0 else "sampled"
                response = results.get((i, k))
                if response is None:
                    counts[f"unanswered_{kind}"] += 1
                    continue
                if response in seen:
                    counts["duplicates_dropped"] += 1  # a sampled response equal to one this prompt already has
                    continue
                seen.append(response)
                counts[kind] += 1
                counts["unfinished"] += not (response and response[-1] in tok.eos_ids)
                row = {
                    "messages": example.messages,
                    "prompt_ids": prompt_ids,
                    "response_ids": response,
                    "response": tok.decode(response),
                    **example.metadata,
                }
                if (i, k) in confidences:  # the base's probability of each token it chose (greedy answers)
                    row["response_confidence"] = [round(c, 4) for c in confidences[(i, k)]]
                if source.samples:
                    row["distill_response"] = {"sample": k, **({"seed": gen.sample_seed(source.seed, i, k)} if k else {})}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    generator = {
        "base": str(base.resolve()),
        "base_files": lin.hash_folder(base),
        "prompts": [{"path": str(p), **lin.file_record(p)} for p in source_files(source)],
        "max_new_tokens": source.max_new_tokens,
        "temperature": source.temperature,
        "top_p": source.top_p,
        "seed": source.seed,
        "device": "cuda" if run_record["gpus"] else "cpu",
        "prompts_answered": len({i for i, _ in results}),
        "responses": counts["main"] + counts["sampled"],
        "unfinished": counts["unfinished"],
        "prompt_filter": keep.stats,
        "batching": run_record,
    }
    if source.samples:
        generator["sampled"] = {
            "per_prompt": source.samples,
            "temperature": source.sample_temperature,
            "top_p": source.sample_top_p,
            "seeding": gen.SEEDING,
        }
        generator["responses_by_kind"] = {"main": counts["main"], "sampled": counts["sampled"]}
        generator["duplicates_dropped"] = counts["duplicates_dropped"]
    if counts["unanswered_main"] or counts["unanswered_sampled"]:
        generator["unanswered"] = {"main": counts["unanswered_main"], "sampled": counts["unanswered_sampled"], "why": "time_limit_s"}
    rows_source = Source(path=out_path, name=source.name, kind="rows", split=source.split, revision=source.revision)
    return rows_source, generator


# --------------------------------------------------------------------------------------------- the command


@dataclass
class DataConfig:
    block_size: int = 4  # samples are aligned and padded to this; must equal train's block size
    seq_len: int = 1024  # tokens per packed row (a multiple of block_size)
    ngram: int = 13  # n of the n-gram dedup against --blocklist
    ngram_min_words: int = 5  # blocklist entries with fewer words are ignored (too generic to match)
    holdout_fraction: float = 0.0  # samples kept apart in heldout.safetensors (for eval loss / probes)
    seed: int = 0  # shuffles samples before packing and picks the held-out ones
    pad_token_id: int = -1  # -1: the first EOS id
    benchmark_names: tuple[str, ...] = BENCHMARK_NAMES


class RowFilter:
    """Applies the filters to raw rows of one source, counting (and keeping examples of) every drop."""

    def __init__(self, source: Source, config: DataConfig, blocklist: Blocklist, decode):
        self.source = source
        self.blocklist = blocklist
        self.names = benchmarks.BenchmarkNames(config.benchmark_names)
        self.decode = decode
        self.stats: dict[str, Any] = {"rows_read": 0, "rows_kept": 0, "dropped": {}, "dropped_examples": []}
        self.source_reason = None
        if benchmarks.is_eval_split(source.split):
            self.source_reason = ("eval_split", f"source declared split={source.split!r}")
        elif self.names.find(source.name):
            self.source_reason = ("benchmark_metadata", f"source name {source.name!r} names a benchmark")

    def drop(self, filter_name: str, detail: str, row: dict[str, Any]) -> None:
        dropped = self.stats["dropped"]
        dropped[filter_name] = dropped.get(filter_name, 0) + 1
        if len(self.stats["dropped_examples"]) < MAX_DROP_EXAMPLES:
            ident = row.get("id", row.get("idx", row.get("uid")))
            self.stats["dropped_examples"].append(
                {"row": self.stats["rows_read"] - 1, **({"id": ident} if ident is not None else {}), "filter": filter_name, "detail": detail}
            )

    def __call__(self, row: dict[str, Any], prompt_only: bool = False) -> Example | None:
        self.stats["rows_read"] += 1
        example = to_example(row, self.source)
        if prompt_only and example is None and isinstance(row.get("prompt"), str):
            rest = {k: v for k, v in row.items() if k != "prompt"}
            example = Example(messages=[{"role": "user", "content": row["prompt"]}], metadata=rest)
        if example is None or (not prompt_only and is_empty(example)):
            self.drop("empty_or_unreadable", "no prompt/response, messages or text field", row)
            return None
        if self.source_reason:
            self.drop(*self.source_reason, row)
            return None
        reason = benchmarks.eval_split_reason(example.metadata)
        if reason:
            self.drop("eval_split", reason, row)
            return None
        reason = benchmarks.benchmark_reason(example.metadata, self.names)
        if reason:
            self.drop("benchmark_metadata", reason, row)
            return None
        if self.blocklist.overlap(example.content_text(self.decode)):
            self.drop("ngram_overlap", f"shares a {self.blocklist.n}-gram with the blocklist", row)
            return None
        self.stats["rows_kept"] += 1
        return example


def build_data(
    sources: list[Source],
    tokenizer_dir: Path,
    out: Path,
    config: DataConfig,
    blocklist_paths: list[Path] = (),
    force: bool = False,
) -> Path:
    if config.seq_len % config.block_size:
        raise A2DError(f"--seq-len {config.seq_len} must be a multiple of --block-size {config.block_size}")
    if not sources:
        raise A2DError("no sources: pass --source PATH or --sources FILE.json")
    out = Path(out)
    with staged_out_dir(out, force) as work:
        tok = ChatTokenizer(tokenizer_dir)
        pad_id = config.pad_token_id if config.pad_token_id >= 0 else tok.eos_ids[0]
        blocklist = load_blocklist(list(blocklist_paths), config.ngram, config.ngram_min_words)
        manifest_sources = []
        samples: list[Sample] = []
        for source in sources:
            record: dict[str, Any] = {
                k: v for k, v in asdict(source).items() if k in ("name", "kind", "split", "revision", "license", "url")
            }
            record["path"] = str(source.path)
            row_source = source
            if source.kind == "distill":
                row_source, generator = distill(
                    source, tok, work / "distill", RowFilter(source, config, blocklist, tok.decode)
                )
                record["generator"] = generator
            keep = RowFilter(row_source, config, blocklist, tok.decode)
            files = source_files(row_source)
            # Files generated into the staging folder are recorded where they will be: under OUT.
            record["files"] = [{"path": str(out / p.relative_to(work) if p.is_relative_to(work) else p), **lin.file_record(p)} for p in files]
            counts = {"samples": 0, "tokens": 0, "loss_tokens": 0, "unrenderable": 0}
            for path in files:
                for row in tqdm(read_rows(row_source, path), desc=f"{source.name}: {path.name}", unit="row", leave=False):
                    if source.max_rows and keep.stats["rows_read"] >= source.max_rows:
                        break
                    example = keep(row)
                    if example is None:
                        continue
                    sample = make_sample(tok, example, source)
                    if sample is None:
                        counts["unrenderable"] += 1
                        continue
                    samples.append(sample)
                    counts["samples"] += 1
                    counts["tokens"] += len(sample.ids)
                    counts["loss_tokens"] += sum(sample.loss)
            record.update(keep.stats, **counts)
            manifest_sources.append(record)
            print(json.dumps({"source": source.name, "rows_read": keep.stats["rows_read"], "kept": keep.stats["rows_kept"], "dropped": keep.stats["dropped"]}))

        rng = random.Random(config.seed)
        rng.shuffle(samples)
        n_holdout = int(len(samples) * config.holdout_fraction)
        splits = {HELDOUT_FILE: samples[:n_holdout], TRAIN_FILE: samples[n_holdout:]}
        if not splits[TRAIN_FILE]:
            raise A2DError("every row was dropped or unreadable: nothing to train on (see the per-source counts above)")
        outputs, totals = {}, {}
        # Both files have the confidence array when any sample has the base's probabilities, so that training and
        # its held-out evaluation read the same fields.
        with_confidence = any(s.confidence is not None for s in samples)
        for name, chosen in splits.items():
            if not chosen:
                continue
            placed, cut, too_long = [], 0, 0
            for sample in chosen:
                item, was_cut = place(sample, config.block_size, config.seq_len, pad_id)
                cut += was_cut
                if item is None:
                    too_long += 1
                else:
                    placed.append(item)
            arrays = pack(placed, config.seq_len, pad_id, with_confidence=with_confidence)
            meta = {"format": DATA_FORMAT, "block_size": str(config.block_size), "seq_len": str(config.seq_len), "pad_token_id": str(pad_id)}
            write_rows(work / name, arrays, meta)
            outputs[name] = lin.file_record(work / name)
            used = int((arrays["segment_ids"] > 0).sum())
            totals[name] = {
                "samples": len(placed),
                "rows": int(arrays["input_ids"].shape[0]),
                "tokens_in_samples": used,
                "loss_tokens": int(arrays["loss_mask"].sum()),
                "fill": round(used / arrays["input_ids"].size, 4),
                "samples_truncated": cut - too_long,
                "samples_dropped_too_long": too_long,
            }
        for path in sorted((work / "distill").glob("*.jsonl")) if (work / "distill").is_dir() else []:
            outputs[path.relative_to(work).as_posix()] = lin.file_record(path)
        manifest = {
            "format_version": 1,
            "command": lin.command_line(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": lin.software_versions(),
            "config": {**asdict(config), "pad_token_id": pad_id, "benchmark_names": list(config.benchmark_names)},
            "tokenizer": {"path": str(tokenizer_dir), "files": {n: lin.file_record(tokenizer_dir / n) for n in ("tokenizer.json", "tokenizer_config.json") if (tokenizer_dir / n).is_file()}},
            "filters": {
                "eval_split": {
                    "fields": "any key with a word of " + ", ".join(benchmarks.vocabulary()["split_keys"]) + ", at any depth",
                    "words": benchmarks.vocabulary()["eval_split_words"],
                    "prefixes": benchmarks.vocabulary()["eval_split_prefixes"],
                    "also": "the source's declared split",
                },
                "benchmark_metadata": {"names": list(config.benchmark_names), "also": "the source's name"},
                "ngram_overlap": {
                    "n": blocklist.n,
                    "min_words": config.ngram_min_words,
                    "blocklist": blocklist.files,
                    "entries": blocklist.entries,
                    "entries_ignored_short": blocklist.skipped_short,
                },
            },
            "sources": manifest_sources,
            "outputs": outputs,
            "totals": totals,
        }
        write_json(work / MANIFEST_FILE, manifest)
    return out


def load_rows(path: Path, block_size: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A packed rows file written by `data`, checked against the block size the trainer uses."""
    from safetensors import safe_open

    if not path.is_file():
        raise A2DError(f"{path}: not found; build it with `python -m a2d_convert data`")
    with safe_open(str(path), "np") as f:
        meta = f.metadata() or {}
        if meta.get("format") != DATA_FORMAT:
            raise A2DError(f"{path}: not an a2d data file (format {meta.get('format')!r}); rebuild it with `data`")
        arrays = {k: f.get_tensor(k) for k in ("input_ids", "loss_mask", "segment_ids")}
        if "confidence" in f.keys():
            arrays["confidence"] = f.get_tensor("confidence")
    if block_size is not None and int(meta["block_size"]) != block_size:
        raise A2DError(
            f"{path}: packed for block size {meta['block_size']}, training uses {block_size}; "
            f"rebuild the data with --block-size {block_size}"
        )
    return arrays, meta


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "data",
        help="build tokenized, packed training data with filters and a data manifest",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = DataConfig()
    p.add_argument("--tokenizer", type=Path, required=True, help="model folder whose tokenizer (and chat template) to use")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--source", action="append", default=[], help="PATH[,key=value...]: name, split, revision, license, url, format, text_unit, max_rows, system, enable_thinking; kind=distill with base=DIR, max_new_tokens, temperature, top_p, batch_size, batch_slots, seed, samples, sample_temperature, sample_top_p, workers, time_limit_s")
    p.add_argument("--sources", type=Path, help="JSON list of source objects with the same keys")
    p.add_argument("--blocklist", type=Path, action="append", default=[], help="benchmark text to dedup against: a benchmark's own file (GPQA csv, MATH-500 / MMLU-Pro / LiveCodeBench jsonl, MMLU-Pro parquet), a folder of them (as `a2d eval --data` takes), .txt lines, or rows with a question field")
    p.add_argument("--benchmark-name", action="append", default=[], help="another benchmark name for the metadata filter")
    p.add_argument("--block-size", type=int, default=defaults.block_size, help="align and pad samples to this; must equal train's (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=defaults.seq_len, help="tokens per packed row, a multiple of the block size (default: %(default)s)")
    p.add_argument("--ngram", type=int, default=defaults.ngram, help="n of the word n-gram dedup against --blocklist (default: %(default)s)")
    p.add_argument("--ngram-min-words", type=int, default=defaults.ngram_min_words, help="ignore blocklist entries shorter than this (default: %(default)s)")
    p.add_argument("--holdout-fraction", type=float, default=defaults.holdout_fraction, help="samples kept apart in heldout.safetensors (default: %(default)s)")
    p.add_argument("--pad-token-id", type=int, default=defaults.pad_token_id, help="pad token; -1: the tokenizer's eos (default: %(default)s)")
    p.add_argument("--seed", type=int, default=defaults.seed, help="sample shuffle and held-out choice (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args) -> int:
    sources = [parse_source_flag(s) for s in args.source]
    if args.sources:
        sources += read_sources_file(args.sources)
    config = DataConfig(
        block_size=args.block_size,
        seq_len=args.seq_len,
        ngram=args.ngram,
        ngram_min_words=args.ngram_min_words,
        holdout_fraction=args.holdout_fraction,
        seed=args.seed,
        pad_token_id=args.pad_token_id,
        benchmark_names=BENCHMARK_NAMES + tuple(args.benchmark_name),
    )
    out = build_data(sources, args.tokenizer, args.out, config, args.blocklist, args.force)
    manifest = read_json(out / MANIFEST_FILE)
    print(json.dumps({"out": str(out), "totals": manifest["totals"]}, indent=2))
    return 0
