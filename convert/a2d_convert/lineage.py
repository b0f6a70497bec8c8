"""Lineage: the sha256 chain from the pinned base files to the shipped weights.

Every pipeline stage (import, train, export, rebuild) writes a ``lineage.json`` into its output folder.
It is the input's chain with one more stage appended, so the shipped folder carries the whole history:

    {"format_version": 2,
     "stages": [
        {"stage": "import", "command": "...", "config": {...},
         "origin": {"kind": "huggingface", "repo_id": ..., "revision": ...},
         "inputs": {"<name>": {"sha256": ..., "bytes": ...}, ...},
         "outputs": {"<file>": {"sha256": ..., "bytes": ...}, ...}, "time": ..., "versions": {...}},
        {"stage": "train", ...}, {"stage": "export", ...}],
     "shipped": {"files": {...}, "weights_sha256": {...}}}

A stage's ``inputs`` name the files it read and their hashes; the previous stage's ``outputs`` must
contain the same hashes, which is how ``verify`` proves the chain has no gap. ``shipped`` lists every
file of the final folder (except lineage.json itself) so a flipped byte anywhere is caught.

The root is the import stage: its ``inputs`` are every base file with its sha256 and its ``origin`` says
where those files came from (see ``parse_origin``). Format 1 (lineages written before the origin was
recorded, such as the bundled demo model's) is read as it is: its base files are pinned by sha256 but
its origin is unknown, which `verify` reports; a chain keeps the format it started with.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from .config import write_text_atomic
from .errors import A2DError

LINEAGE_FILE = "lineage.json"
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)
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
    if lineage.get("format_version") not in READABLE_FORMATS:
        raise ValueError(f"{path}: format_version {lineage.get('format_version')!r} is not one of {READABLE_FORMATS}")
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
    # A chain keeps the format of its root: a format 1 chain has no origin to check, however long it grows.
    version = lineage.get("format_version", FORMAT_VERSION) if lineage.get("stages") else FORMAT_VERSION
    return {**lineage, "format_version": version, "stages": [*lineage.get("stages", []), stage]}


# --------------------------------------------------------------------------------------------- the root

SHA256 = re.compile(r"[0-9a-f]{64}")
COMMIT = re.compile(r"[0-9a-f]{40}")


def parse_origin(spec: str | None, source: Path) -> dict[str, Any]:
    """Where the base files came from, for the root stage:
    - `hf:ORG/NAME@REVISION` (REVISION the 40-hex commit: a branch name pins nothing);
    - `pypi:PACKAGE==VERSION,wheel_sha256=HEX[,member=PATH]`, or `wheel=PATH` for a local wheel, whose
      sha256 is taken and whose `member`, when named, must be the source file byte for byte;
    - none given: the Hugging Face cache's repo and commit when the source lies in a hub cache
      (.../models--ORG--NAME/snapshots/REVISION/...), else the source's path (`file`)."""
    source = Path(source).resolve()
    if not spec:
        parts = source.parts
        for i, part in enumerate(parts[:-2]):
            if part.startswith("models--") and parts[i + 1] == "snapshots" and COMMIT.fullmatch(parts[i + 2]):
                return {"kind": "huggingface", "repo_id": part.removeprefix("models--").replace("--", "/"), "revision": parts[i + 2]}
        return {"kind": "file", "path": str(source)}
    kind, _, rest = spec.partition(":")
    if kind == "hf":
        repo_id, at, revision = rest.partition("@")
        if not at or repo_id.count("/") != 1 or not COMMIT.fullmatch(revision):
            raise A2DError(f"--origin {spec!r}: give hf:ORG/NAME@COMMIT with the 40-hex commit the files were downloaded at")
        return {"kind": "huggingface", "repo_id": repo_id, "revision": revision}
    if kind == "pypi":
        package, *pairs = rest.split(",")
        name, eq, version = package.partition("==")
        fields = dict(p.partition("=")[::2] for p in pairs)
        unknown = sorted(set(fields) - {"wheel_sha256", "wheel", "member"})
        if not eq or not name or not version or unknown:
            raise A2DError(f"--origin {spec!r}: give pypi:PACKAGE==VERSION,wheel_sha256=HEX (or wheel=PATH)[,member=PATH]")
        origin = {"kind": "pypi", "package": name, "version": version}
        if "wheel" in fields:
            wheel = Path(fields["wheel"])
            if not wheel.is_file():
                raise A2DError(f"--origin: wheel {wheel} not found")
            origin["wheel_sha256"] = sha256_file(wheel)
            if "member" in fields:
                import zipfile

                digest = hashlib.sha256()
                try:
                    with zipfile.ZipFile(wheel) as archive, archive.open(fields["member"]) as member:
                        while chunk := member.read(_CHUNK):
                            digest.update(chunk)
                except (KeyError, zipfile.BadZipFile) as err:
                    raise A2DError(f"--origin: {wheel} has no member {fields['member']!r} ({err})") from None
                if source.is_file() and digest.hexdigest() != sha256_file(source):
                    raise A2DError(f"--origin: {fields['member']} in {wheel} is not {source} (sha256 differs); give the wheel the source came from")
        elif SHA256.fullmatch(fields.get("wheel_sha256", "")):
            origin["wheel_sha256"] = fields["wheel_sha256"]
        else:
            raise A2DError(f"--origin {spec!r}: wheel_sha256 must be the wheel's 64-hex sha256 (or give wheel=PATH)")
        if "member" in fields:
            origin["member"] = fields["member"]
        return origin
    raise A2DError(f"--origin {spec!r}: use hf:ORG/NAME@COMMIT or pypi:PACKAGE==VERSION,wheel_sha256=HEX")


def origin_problem(origin: Any) -> str | None:
    """Why a recorded origin does not say where the base came from, or None."""
    if not isinstance(origin, dict):
        return "no origin recorded"
    kind = origin.get("kind")
    if kind == "huggingface":
        ok = isinstance(origin.get("repo_id"), str) and "/" in origin["repo_id"] and COMMIT.fullmatch(str(origin.get("revision", "")))
        return None if ok else "a huggingface origin needs repo_id and a 40-hex revision"
    if kind == "pypi":
        ok = origin.get("package") and origin.get("version") and SHA256.fullmatch(str(origin.get("wheel_sha256", "")))
        return None if ok else "a pypi origin needs package, version and a 64-hex wheel_sha256"
    if kind == "file":
        return None if origin.get("path") else "a file origin needs its path"
    return f"origin kind {kind!r} is none of huggingface, pypi, file"


def describe_origin(origin: dict[str, Any]) -> str:
    if origin["kind"] == "huggingface":
        return f"{origin['repo_id']}@{origin['revision'][:12]}…"
    if origin["kind"] == "pypi":
        return f"pypi {origin['package']}=={origin['version']} (wheel sha256 {origin['wheel_sha256'][:12]}…)"
    return f"file {origin['path']}"


def root_checks(lineage: dict[str, Any]) -> list[tuple[bool, str]]:
    """What the chain's root says about the base, without the base: every base file pinned by a real
    sha256, and (format 2) where the files came from. (ok, message) per check."""
    stages = lineage.get("stages") or []
    if not stages:
        return [(False, "root: the lineage has no stages")]
    root = stages[0]
    pinned = {name: rec for name, rec in (root.get("inputs") or {}).items() if not rec.get("from_previous")}
    checks = []
    if not pinned:
        checks.append((False, f"root: stage {root.get('stage')!r} records no base files"))
    for name, rec in sorted(pinned.items()):
        digest = str(rec.get("sha256", ""))
        real = SHA256.fullmatch(digest) is not None and digest != "0" * 64
        size_ok = isinstance(rec.get("bytes"), int) and rec["bytes"] > 0
        detail = f"sha256 {digest[:16]}…, {rec.get('bytes')} bytes" if real and size_ok else f"sha256 {digest!r}, bytes {rec.get('bytes')!r}: not a pin of a real file"
        checks.append((real and size_ok, f"root: base file {name}: {detail}"))
    version = lineage.get("format_version")
    if version == 1:
        checks.append((True, "root: lineage format 1 pins the base files by sha256 but records no origin (written before a2d recorded it)"))
    elif root.get("stage") != "import":
        checks.append((False, f"root: the chain starts at stage {root.get('stage')!r}, not at an import of the base; import the base and convert from its output"))
    else:
        problem = origin_problem(root.get("origin"))
        checks.append((problem is None, f"root: origin {describe_origin(root['origin'])}" if problem is None else f"root: {problem}; re-import with --origin"))
    return checks


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
