"""Lineage: the sha256 chain from the pinned base files to the shipped weights.

Every pipeline stage (import, train, export, rebuild) writes a ``lineage.json`` into its output folder.
It is the input's chain with one more stage appended, so the shipped folder carries the whole history:

    {"format_version": 1,
     "stages": [
        {"stage": "import", "command": "...", "config": {...},
         "inputs": {"<name>": {"sha256": ..., "bytes": ...}, ...},
         "outputs": {"<file>": {"sha256": ..., "bytes": ...}, ...}, "time": ..., "versions": {...}},
        {"stage": "train", ...}, {"stage": "export", ...}],
     "shipped": {"files": {...}, "weights_sha256": {...}}}

A stage's ``inputs`` name the files it read and their hashes; the previous stage's ``outputs`` must
contain the same hashes, which is how ``verify`` proves the chain has no gap. ``shipped`` lists every
file of the final folder (except lineage.json itself) so a flipped byte anywhere is caught.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from .config import write_text_atomic

LINEAGE_FILE = "lineage.json"
FORMAT_VERSION = 1
_CHUNK = 8 << 20


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def hash_folder(folder: str | os.PathLike, skip: Iterable[str] = (LINEAGE_FILE,)) -> dict[str, dict[str, Any]]:
    """Every regular file under ``folder`` (recursively, sorted), keyed by its '/'-separated relative path."""
    folder = Path(folder)
    skipped = set(skip)
    records = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skipped:
            continue
        records[rel] = file_record(path)
    return records


def save_tensors(path: str | os.PathLike, tensors: dict, metadata: dict[str, str]) -> Path:
    """safetensors' writer creates files private to the user (0600); a model folder is read by servers
    and packers running as other users, so weights get the same 0644 as every other file."""
    from safetensors.torch import save_file

    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path), metadata=metadata)
    os.chmod(path, 0o644)
    return Path(path)


def command_line() -> str:
    """The command that runs now, as a user would retype it."""
    return shlex.join([Path(sys.executable).name, "-m", "a2d_convert", *sys.argv[1:]])


def software_versions() -> dict[str, str]:
    import torch
    import transformers

    from . import __version__

    return {
        "a2d_convert": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def read_lineage(folder: str | os.PathLike) -> dict[str, Any]:
    path = Path(folder) / LINEAGE_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the folder was not written by an a2d_convert stage "
            "(run `python -m a2d_convert import` on the base first)"
        )
    lineage = json.loads(path.read_text())
    if lineage.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {lineage.get('format_version')!r} is not {FORMAT_VERSION}")
    return lineage


def read_lineage_or_root(folder: str | os.PathLike) -> dict[str, Any]:
    """The folder's chain, or an empty chain when the folder is a plain HF checkpoint (a new root)."""
    if (Path(folder) / LINEAGE_FILE).is_file():
        return read_lineage(folder)
    return {"format_version": FORMAT_VERSION, "stages": []}


def make_stage(
    stage: str,
    config: dict[str, Any],
    inputs: dict[str, dict[str, Any]],
    outputs: dict[str, dict[str, Any]],
    **extra: Any,
) -> dict[str, Any]:
    return {
        "stage": stage,
        "command": command_line(),
        "config": config,
        "inputs": inputs,
        "outputs": outputs,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": software_versions(),
        **extra,
    }


def append_stage(lineage: dict[str, Any], stage: dict[str, Any]) -> dict[str, Any]:
    return {**lineage, "format_version": FORMAT_VERSION, "stages": [*lineage.get("stages", []), stage]}


def write_lineage(folder: str | os.PathLike, lineage: dict[str, Any], name: str = LINEAGE_FILE) -> Path:
    path = Path(folder) / name
    write_text_atomic(path, json.dumps(lineage, indent=2, sort_keys=False) + "\n")
    return path


def chain_gaps(lineage: dict[str, Any]) -> list[str]:
    """Stages whose inputs do not appear with the same sha256 among the outputs of the stage they name.

    Inputs marked ``"from_previous": true`` must be among the previous stage's outputs; an input marked
    ``"from_stage": i`` (a file an earlier stage wrote and the stages since left alone, such as the weights
    under a `redecode`) must be stage i's output of the same name, and no stage after i may have written
    that name. Other inputs (data files, the base's own files at the root) enter the chain there, with
    their hash recorded.
    """
    gaps = []
    stages = lineage.get("stages", [])
    for index, (previous, stage) in enumerate(zip(stages, stages[1:]), start=1):
        produced = {rec["sha256"] for rec in previous.get("outputs", {}).values()}
        for name, rec in stage.get("inputs", {}).items():
            if rec.get("from_previous") and rec["sha256"] not in produced:
                gaps.append(
                    f"stage {stage['stage']!r} read {name} (sha256 {rec['sha256'][:16]}…) which stage "
                    f"{previous['stage']!r} did not produce"
                )
            writer = rec.get("from_stage")
            if writer is None:
                continue
            written = stages[writer].get("outputs", {}).get(name) if isinstance(writer, int) and 0 <= writer < index else None
            rewritten = written is not None and any(name in s.get("outputs", {}) for s in stages[writer + 1 : index])
            if written is None or written["sha256"] != rec["sha256"] or rewritten:
                gaps.append(
                    f"stage {stage['stage']!r} read {name} (sha256 {rec['sha256'][:16]}…) as stage {writer!r}'s output, "
                    "which that stage did not produce or a later stage replaced"
                )
    return gaps
