"""`verify DIR`: re-hash an exported model folder (or a delta folder) against its lineage.

Checks, each printed as one `ok`/`FAIL` line naming the file:
- every file lineage.json's `shipped` section lists exists with that sha256 and size, and the folder
  holds no file it does not list (lineage.json itself aside);
- the weights' sha256 equals `shipped.weights_sha256` (the merged weights a delta must rebuild);
- the chain has no gap: each stage read what the stage before it wrote (lineage.chain_gaps);
- data_manifest.json is the one the train stage read, and decoder_config.json's decoding equals
  config.json's `a2d.decoding` (the evidence describes what is served);
- in a delta folder: every file delta_files.json lists, and the delta the lineage records.
Exit status 0 when all pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from . import lineage as lin
from .errors import A2DError


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        self.lines.append(("ok    " if ok else "FAIL  ") + message)
        if not ok:
            self.failures.append(message)

    @property
    def ok(self) -> bool:
        return not self.failures


def check_files(folder: Path, listed: dict, report: Report, skip: tuple[str, ...]) -> None:
    for name, rec in sorted(listed.items()):
        path = folder / name
        if not path.is_file():
            report.check(False, f"{name}: missing")
            continue
        digest = lin.sha256_file(path)
        same = digest == rec["sha256"] and path.stat().st_size == rec["bytes"]
        detail = f"sha256 {digest[:16]}…" if same else f"sha256 {digest[:16]}… but lineage records {rec['sha256'][:16]}…"
        report.check(same, f"{name}: {detail}")
    present = set(lin.hash_folder(folder, skip=skip))
    for name in sorted(present - set(listed)):
        report.check(False, f"{name}: not listed in the lineage (an unrecorded file)")


def read_json_checked(path: Path, report: Report) -> dict | None:
    """The file's JSON object, or None with a FAIL line (a damaged file must be named, not crash verify)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        report.check(False, f"{path.name}: unreadable ({str(err).splitlines()[0]})")
        return None
    if not isinstance(value, dict):
        report.check(False, f"{path.name}: not a JSON object")
        return None
    return value


def find_stage(lineage: dict, name: str) -> dict | None:
    return next((s for s in reversed(lineage.get("stages", [])) if s["stage"] == name), None)


def verify_folder(folder: Path) -> Report:
    folder = Path(folder)
    report = Report()
    if (folder / "delta_files.json").is_file():
        return verify_delta(folder, report)
    try:
        lineage = lin.read_lineage(folder)
    except (FileNotFoundError, ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        report.check(False, f"{lin.LINEAGE_FILE}: {str(err).splitlines()[0]}")
        return report
    shipped = lineage.get("shipped")
    if not shipped:
        report.check(False, f"{lin.LINEAGE_FILE}: no 'shipped' section; this folder was not written by `export`")
        return report
    check_files(folder, shipped["files"], report, skip=(lin.LINEAGE_FILE,))
    weights = folder / "model.safetensors"
    if weights.is_file():
        digest = lin.sha256_file(weights)
        report.check(digest == shipped["weights_sha256"], f"model.safetensors: merged weights sha256 {digest[:16]}… (recorded {shipped['weights_sha256'][:16]}…)")
    gaps = lin.chain_gaps(lineage)
    stages = " -> ".join(s["stage"] for s in lineage["stages"])
    report.check(not gaps, f"chain {stages}: " + ("; ".join(gaps) if gaps else "every stage read what the previous one wrote"))
    train = find_stage(lineage, "train")
    manifest = folder / "data_manifest.json"
    if train is not None and "data/data_manifest.json" in train["inputs"]:
        recorded = train["inputs"]["data/data_manifest.json"]["sha256"]
        same = manifest.is_file() and lin.sha256_file(manifest) == recorded
        report.check(same, f"data_manifest.json: {'is' if same else 'is NOT'} the manifest training read")
        parsed = read_json_checked(manifest, report) if manifest.is_file() else None
        if parsed is not None and "data/train.safetensors" in train["inputs"]:
            rec = parsed.get("outputs", {}).get("train.safetensors", {})
            report.check(
                rec.get("sha256") == train["inputs"]["data/train.safetensors"]["sha256"],
                "data_manifest.json: its train.safetensors is the data training read",
            )
    config_path, decoder_path = folder / "config.json", folder / "decoder_config.json"
    if config_path.is_file() and decoder_path.is_file():
        config, decoder = read_json_checked(config_path, report), read_json_checked(decoder_path, report)
        if config is not None and decoder is not None:
            served = (config.get("a2d") or {}).get("decoding")
            report.check(served == decoder.get("decoding"), "decoder_config.json: decoding equals config.json a2d.decoding")
    else:
        report.check(False, "decoder_config.json / config.json: missing")
    return report


def verify_delta(folder: Path, report: Report) -> Report:
    listed = read_json_checked(folder / "delta_files.json", report)
    if listed is None:
        return report
    check_files(folder, listed, report, skip=("delta_files.json",))
    lineage_path = folder / lin.LINEAGE_FILE
    lineage = read_json_checked(lineage_path, report) if lineage_path.is_file() else None
    if lineage is not None:
        recorded = lineage.get("delta", {})
        for key, name in (("delta_json", "delta.json"), ("delta_weights", "delta.safetensors")):
            rec = recorded.get(key)
            same = rec is not None and (folder / name).is_file() and lin.sha256_file(folder / name) == rec["sha256"]
            report.check(same, f"{name}: matches the delta lineage.json records")
    elif not lineage_path.is_file():
        report.check(False, f"{lin.LINEAGE_FILE}: missing from the delta")
    return report


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "verify",
        help="re-hash an exported model (or delta) folder against its lineage; non-zero exit on any mismatch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("folder", type=Path)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    if not Path(args.folder).is_dir():
        raise A2DError(f"{args.folder}: not a folder; pass an exported model folder or a delta folder")
    report = verify_folder(args.folder)
    if args.json:
        print(json.dumps({"ok": report.ok, "checks": report.lines, "failures": report.failures}, indent=2))
    else:
        print("\n".join(report.lines))
        print(f"verify {args.folder}: {'PASS' if report.ok else 'FAIL'} ({len(report.lines)} checks, {len(report.failures)} failed)")
    if not report.ok:
        raise SystemExit(1)
    return 0
