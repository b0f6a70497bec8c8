"""`verify DIR`: re-hash an exported model folder (or a delta folder) against its lineage.

Checks, each printed as one `ok`/`FAIL` line naming the file:
- every file lineage.json's `shipped` section lists exists with that sha256 and size, and the folder
  holds no file it does not list (lineage.json itself aside);
- the weights' sha256 equals `shipped.weights_sha256` (the merged weights a delta must rebuild);
- the chain has no gap: each stage read what the stage before it wrote (lineage.chain_gaps);
- data_manifest.json is the one the train stage read, and decoder_config.json's decoding equals
  config.json's `a2d.decoding` (the evidence describes what is served);
- in a delta folder: every file delta_files.json lists, the delta the lineage records, and delta.json's
  base pins are the lineage root's;
- the root (lineage.root_checks): every base file is pinned by a real sha256 (a zeroed or missing one
  fails), and a format 2 lineage's root is an import that records the base's origin (repo and commit,
  or PyPI package, version and wheel sha256, or path);
- with `--base PATH` (what `import --source` took): PATH's files have the root's sha256, and importing
  PATH again gives every file the import stage recorded, so the chain is checked from the base itself.
Exit status 0 when all pass, 1 otherwise.

What this proves, and what it does not, is in docs/conversion.md ("What verify proves").
"""

from __future__ import annotations

import argparse
import json
import tempfile
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


def check_chain(lineage: dict, report: Report, base: Path | None) -> None:
    """The root's pins and origin, the base itself when given, then every link of the chain."""
    for ok, message in lin.root_checks(lineage):
        report.check(ok, message)
    if base is not None:
        check_base(lineage, Path(base), report)
    gaps = lin.chain_gaps(lineage)
    stages = " -> ".join(s["stage"] for s in lineage["stages"])
    report.check(not gaps, f"chain {stages}: " + ("; ".join(gaps) if gaps else "every stage read what the previous one wrote"))


def check_base(lineage: dict, base: Path, report: Report) -> None:
    """--base: the base's files are the root's, and importing them again gives what the import stage wrote."""
    from .import_base import import_base

    root = lineage["stages"][0]
    pinned = {name: rec for name, rec in root.get("inputs", {}).items() if not rec.get("from_previous")}
    # A GGUF imported with --tokenizer DIR also pinned DIR's files; --base names the GGUF alone.
    tokenizer = {name: rec for name, rec in pinned.items() if name.startswith("tokenizer/")}
    models = {name: rec for name, rec in pinned.items() if name not in tokenizer}
    if base.is_file():
        digest = lin.sha256_file(base)
        named = next((name for name, rec in models.items() if rec["sha256"] == digest), None)
        report.check(named is not None, f"--base {base}: sha256 {digest[:16]}… " + (f"is the root's {named}" if named else "is none of the root's base files"))
    elif base.is_dir():
        for name, rec in sorted(models.items()):
            path = base / name
            same = path.is_file() and lin.sha256_file(path) == rec["sha256"]
            report.check(same, f"--base {base}: {name} " + ("has the root's sha256" if same else "is missing or differs from the root's sha256"))
    else:
        report.check(False, f"--base {base}: not found; give what `import --source` took (a GGUF file or an HF folder)")
        return
    if root.get("stage") != "import":
        report.check(False, f"--base: the chain's root is {root.get('stage')!r}, not an import, so there is no import to repeat")
        return
    recorded = root.get("outputs", {})
    if tokenizer:
        recorded = {name: rec for name, rec in recorded.items() if name in ("model.safetensors", "config.json", "generation_config.json")}
    with tempfile.TemporaryDirectory(prefix="a2d-verify-") as scratch:
        try:
            imported = import_base(base, Path(scratch) / "imported")
        except A2DError as err:
            report.check(False, f"--base {base}: importing it again failed ({err})")
            return
        got = lin.hash_folder(imported)
    differ = sorted(name for name, rec in recorded.items() if got.get(name, {}).get("sha256") != rec["sha256"])
    report.check(
        bool(recorded) and not differ,
        f"import: importing --base again gives the {len(recorded)} files the root stage recorded"
        if recorded and not differ else f"import: importing --base again gives other {', '.join(differ) or 'files'} than the root stage recorded",
    )


def verify_folder(folder: Path, base: Path | None = None) -> Report:
    folder = Path(folder)
    report = Report()
    if (folder / "delta_files.json").is_file():
        return verify_delta(folder, report, base)
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
    check_chain(lineage, report, base)
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


def verify_delta(folder: Path, report: Report, base: Path | None = None) -> Report:
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
        if not lineage.get("stages"):
            report.check(False, f"{lin.LINEAGE_FILE}: no stages")
            return report
        check_chain(lineage, report, base)
        manifest = read_json_checked(folder / "delta.json", report) if (folder / "delta.json").is_file() else None
        if manifest is not None:
            pins = {k: v["sha256"] for k, v in (manifest.get("base") or {}).get("source_files", {}).items()}
            root = {k: v.get("sha256") for k, v in lineage["stages"][0].get("inputs", {}).items() if not v.get("from_previous")}
            report.check(pins == root, "delta.json: " + ("pins the base files the lineage root records" if pins == root else "pins other base files than the lineage root records"))
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
    p.add_argument("--base", type=Path, help="the base `import --source` took (GGUF file or HF folder): re-hash it and re-import it against the lineage's root")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=run)


def run(args) -> int:
    if not Path(args.folder).is_dir():
        raise A2DError(f"{args.folder}: not a folder; pass an exported model folder or a delta folder")
    report = verify_folder(args.folder, args.base)
    if args.json:
        print(json.dumps({"ok": report.ok, "checks": report.lines, "failures": report.failures}, indent=2))
    else:
        print("\n".join(report.lines))
        print(f"verify {args.folder}: {'PASS' if report.ok else 'FAIL'} ({len(report.lines)} checks, {len(report.failures)} failed)")
    if not report.ok:
        raise SystemExit(1)
    return 0
