"""`export`: a training checkpoint -> the engine's model folder (docs/model-format.md) with its evidence;
`rebuild`: a compact delta + the sha256-pinned base -> the same folder, bit for bit.

The exported folder holds the weights (bf16), config.json with `a2d.trained: true` and the chosen
decoding defaults, the tokenizer files (mask token included), generation_config.json, and the
evidence: lineage.json (the sha256 chain base files -> import -> init -> train checkpoint -> these
files, with each stage's command and config), data_manifest.json (the training data and its filters)
and decoder_config.json (the decoding parameters and how they were chosen).

A delta (`--delta DIR`) ships the folder without the base's weights: delta.json + delta.safetensors +
the small files. Tensors are stored against the *imported* base (the output of `import`, which is a
deterministic function of the pinned base files) as one of
- `same`: unchanged;
- `lora`: int16 factors A, B with a power-of-two exponent each; the shipped tensor is
  lora.merge_lora(base, A, B, scale), a bit-reproducible merge (export computes the shipped weights
  with that same function);
- `rows`: rows replaced or appended (the mask token's embedding row, a grown vocabulary);
- `full`: the tensor itself (norms: a few kilobytes);
- `xor`: bf16 bits XOR the base's, zlib-compressed (a full fine-tune's fallback; not compact).
`rebuild --base BASE --delta DIR --out OUT` imports BASE (or takes an already imported folder),
checks every pinned sha256, applies the delta, and checks that the rebuilt weights have exactly the
sha256 that lineage.json records; `verify OUT` then passes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

from . import lineage as lin
from .config import ADAPTER_RULES, read_json, write_json
from .decoding import add_decoding_flags, decoding_flags
from .errors import A2DError
from .tiny import staged_out_dir

WEIGHTS = "model.safetensors"
DELTA_JSON = "delta.json"
DELTA_WEIGHTS = "delta.safetensors"
DELTA_FORMAT = "a2d-delta-1"
DECODER_CONFIG = "decoder_config.json"
DATA_MANIFEST = "data_manifest.json"
CARRIED = (
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)


# --------------------------------------------------------------------------------------------- export


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder, or a run folder (its latest checkpoint)."""
    if (path / "checkpoint.json").is_file():
        return path
    if (path / "latest.json").is_file():
        return path / read_json(path / "latest.json")["path"]
    raise A2DError(f"{path}: neither a checkpoint (checkpoint.json) nor a run folder (latest.json); pass one of them")


def check_recorded(path: Path, record: dict[str, Any], what: str) -> None:
    if not path.is_file():
        raise A2DError(f"{path}: missing; {what} needs it as it was when training ran")
    if lin.sha256_file(path) != record["sha256"]:
        raise A2DError(f"{path}: sha256 differs from the one training recorded; {what} changed after training — restore it")


def probes_decoding(probes_file: Path, block_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole decoding an evaluate-probes report measured at its recommended threshold, and where the
    rest of it was read: the report's own `decoding` record when it has one, else the a2d.decoding of the
    folder it probed (`model_dir`, which evaluate-probes decodes with, greedily, at each threshold)."""
    from .decoding import DecodingDefaults

    probes = read_json(probes_file)
    if probes.get("diagnostic"):
        raise A2DError(f"{probes_file}: {probes['diagnostic']}; export takes a report made with the model's own block size")
    recommended = probes.get("recommended")
    if not isinstance(recommended, dict) or "threshold" not in recommended:
        raise A2DError(f"{probes_file}: no 'recommended' decoding in it; run `evaluate-probes` with --thresholds")
    if probes.get("block_size", block_size) != block_size:
        raise A2DError(f"{probes_file}: the probes decoded blocks of {probes['block_size']}, this model's are {block_size}; probe this model")
    if isinstance(probes.get("decoding"), dict):
        measured, source = dict(probes["decoding"]), {"from": "report"}
    else:
        probed = Path(probes.get("model_dir") or "") / "config.json"
        if not probes.get("model_dir") or not probed.is_file():
            raise A2DError(
                f"{probes_file}: the report does not say which decoding it measured and the folder it probed "
                f"({probes.get('model_dir')}) has no config.json; run `evaluate-probes` again on the model and pass that report"
            )
        measured = dict((read_json(probed).get("a2d") or {}).get("decoding") or {})
        measured["temperature"] = 0.0
        source = {"from": "probed model", "config": {"path": str(probed), **lin.file_record(probed)}}
    measured.update(recommended)
    fields = DecodingDefaults.__dataclass_fields__
    unknown = sorted(set(measured) - set(fields))
    if unknown:
        raise A2DError(f"{probes_file}: the measured decoding has fields {unknown} this a2d does not know; probe with this a2d version")
    return measured, source


def decoder_choice(init_config: dict, args_decoding: dict[str, Any], probes_file: Path | None) -> tuple[dict, dict]:
    """(decoding defaults for config.json, decoder_config.json). A probes report, when given, chooses the
    whole decoding (the one it measured); a flag may only restate it, since the probes measured nothing else."""
    from .decoding import DecodingDefaults, written_decoding

    decoding = dict(init_config["a2d"]["decoding"])
    chosen_by: dict[str, Any] = {"method": "defaults"}
    overrides = {k: v for k, v in args_decoding.items() if v is not None}
    if probes_file is not None:
        decoding, measured_from = probes_decoding(probes_file, init_config["a2d"]["block_size"])
        for name, value in overrides.items():
            probed = decoding.get(name, getattr(DecodingDefaults(), name))
            if value != probed:
                raise A2DError(
                    f"--{name.replace('_', '-')} {value} differs from the decoding the probes in {probes_file} measured "
                    f"({name} {probed}); drop the flag, or export a candidate with it, probe that and pass its report"
                )
        chosen_by = {"method": "probes", "probes_file": {"path": str(probes_file), **lin.file_record(probes_file)},
                     "rule": read_json(probes_file).get("rule"), "measured": measured_from}
        if overrides:
            chosen_by["flags"] = overrides
    elif overrides:
        decoding.update(overrides)
        chosen_by = {"method": "flags", "flags": overrides}
    return written_decoding(decoding), chosen_by


def shipped_weights(ckpt: Path, record: dict[str, Any], init_dir: Path) -> tuple[dict, dict | None]:
    """(bf16 tensors to ship, adapters in their shipped form or None for a full fine-tune)."""
    from safetensors.torch import load_file

    from . import lora as lora_mod
    from .weights import read_tensors

    if record["mode"] == "full":
        return load_file(ckpt / WEIGHTS), None
    shipped_adapters = lora_mod.ship_adapters(load_file(ckpt / record["weights"]))
    base = read_tensors(init_dir)
    scale = record["lora"]["alpha"] / record["lora"]["rank"]
    mask_id = read_json(init_dir / "config.json")["a2d"]["mask_token_id"]
    return lora_mod.merged_state(base, shipped_adapters, scale, mask_id), shipped_adapters


def export(
    checkpoint: Path,
    out: Path,
    decoding_flags: dict[str, Any] | None = None,
    probes_file: Path | None = None,
    delta_dir: Path | None = None,
    force: bool = False,
) -> Path:
    from .config import load_config
    from .weights import check_tensors

    ckpt = resolve_checkpoint(Path(checkpoint))
    record = read_json(ckpt / "checkpoint.json")
    chain = lin.read_lineage(ckpt)
    train_stage = chain["stages"][-1]
    init_dir = Path(record["init"])
    for name, rec in train_stage["inputs"].items():
        if name.startswith("init/"):
            check_recorded(init_dir / name.removeprefix("init/"), rec, "the init folder")
    data_dir = Path(record["config"]["data"])
    if "data/data_manifest.json" in train_stage["inputs"]:
        check_recorded(data_dir / DATA_MANIFEST, train_stage["inputs"]["data/data_manifest.json"], "the data manifest")
    for name in (record["weights"], "checkpoint.json"):
        check_recorded(ckpt / name, train_stage["outputs"][name], "the checkpoint")

    if delta_dir is not None and (Path(delta_dir).resolve().is_relative_to(Path(out).resolve()) or Path(out).resolve().is_relative_to(Path(delta_dir).resolve())):
        raise A2DError(f"--delta {delta_dir} and --out {out} overlap; give them separate folders")
    with contextlib.ExitStack() as staged:
        work = staged.enter_context(staged_out_dir(out, force))
        delta_work = staged.enter_context(staged_out_dir(delta_dir, force)) if delta_dir is not None else None
        tensors, adapters = shipped_weights(ckpt, record, init_dir)
        lin.save_tensors(work / WEIGHTS, tensors, {"format": "pt"})

        init_config = read_json(init_dir / "config.json")
        decoding, chosen_by = decoder_choice(init_config, decoding_flags or {}, probes_file)
        config = json.loads(json.dumps(init_config))
        config["a2d"].update(trained=True, decoding=decoding)
        for rule in ADAPTER_RULES:  # a row adapter ships unmerged: its rule and factors stay in the model
            if f"{rule}_targets" in record.get("lora", {}):
                config["a2d"][f"{rule}_adapter"] = {"rank": record["lora"]["rank"], "targets": record["lora"][f"{rule}_targets"]}
        if record["config"].get("window_rule"):  # the window adapter's rule without factors: merged weights, nothing more
            config["a2d"]["window_rule"] = True
        write_json(work / "config.json", config)
        for name in CARRIED[1:]:
            if (init_dir / name).is_file():
                shutil.copyfile(init_dir / name, work / name)
        if (data_dir / DATA_MANIFEST).is_file():
            shutil.copyfile(data_dir / DATA_MANIFEST, work / DATA_MANIFEST)
        write_json(
            work / DECODER_CONFIG,
            {
                "format_version": 1,
                "block_size": config["a2d"]["block_size"],
                "shift_logits": config["a2d"]["shift_logits"],
                "decoding": decoding,
                "chosen_by": chosen_by,
                "checkpoint_step": record["step"],
            },
        )
        cfg, a2d, _ = load_config(work)  # the folder must read back as a valid a2d model
        from .weights import read_tensors

        check_tensors(read_tensors(work), cfg, work, a2d)

        inputs = {f"checkpoint/{n}": {**r, "from_previous": True} for n, r in train_stage["outputs"].items()}
        stage = lin.make_stage(
            "export",
            config={"checkpoint": str(ckpt.resolve()), "mode": record["mode"], "decoding": decoding, "chosen_by": chosen_by},
            inputs=inputs,
            outputs=lin.hash_folder(work),
        )
        lineage = lin.append_stage(chain, stage)
        lineage["shipped"] = {"files": lin.hash_folder(work), "weights_sha256": lin.sha256_file(work / WEIGHTS)}
        if delta_dir is not None:
            lineage["delta"] = write_delta(delta_work, work, tensors, adapters, record, chain)
        lin.write_lineage(work, lineage)
        if delta_dir is not None:
            shutil.copyfile(work / lin.LINEAGE_FILE, delta_work / lin.LINEAGE_FILE)
            finish_delta(delta_work)
    return out


def redecode(folder: Path, decoding_flags: dict[str, Any] | None = None, probes_file: Path | None = None) -> dict[str, Any]:
    """New default decoding for an exported model folder or a delta folder, recorded as a `redecode`
    stage: config.json and decoder_config.json are rewritten, the lineage's shipped records (and a delta's
    delta_files.json) follow. The weights are untouched. `chosen_by.previous` names the decoder_config.json
    replaced, by its sha256: the choice it held stays in the lineage, as the config of the stage that wrote it.
    Returns the new decoding."""
    from .config import load_config
    from .decoding import RETIRED_DECODING_FIELDS, DecodeParams, DecodingDefaults, written_decoding

    folder = Path(folder)
    for name in ("config.json", DECODER_CONFIG, lin.LINEAGE_FILE):
        if not (folder / name).is_file():
            raise A2DError(f"{folder / name}: missing; redecode takes a folder written by `export` (a model or its --delta)")
    lineage = lin.read_lineage(folder)
    old = {name: lin.file_record(folder / name) for name in ("config.json", DECODER_CONFIG)}
    for name, rec in old.items():
        if lineage.get("shipped", {}).get("files", {}).get(name, {}).get("sha256") != rec["sha256"]:
            raise A2DError(f"{folder / name}: not the file the lineage records; run `verify {folder}` and restore it first")
    config, decoder = read_json(folder / "config.json"), read_json(folder / DECODER_CONFIG)
    decoding = dict(config["a2d"]["decoding"])
    previous = {"sha256": old[DECODER_CONFIG]["sha256"]}
    chosen_by: dict[str, Any] = {"method": "redecode", "previous": previous}
    # A model exported by an earlier a2d may hold fields of the retired rules: dropped, and said so.
    dropped = {k: decoding.pop(k) for k in RETIRED_DECODING_FIELDS if k in decoding}
    if dropped:
        chosen_by["dropped"] = dropped
    flags = {k: v for k, v in (decoding_flags or {}).items() if v is not None}
    if probes_file is not None:
        # The probes' whole measured decoding, flags only restating it (decoder_choice's rule).
        decoding, chosen_by = decoder_choice(config, flags, probes_file)
        chosen_by = {**chosen_by, "method": "redecode", "previous": previous, **({"dropped": dropped} if dropped else {})}
    if not flags and probes_file is None:
        raise A2DError("redecode: give the decoding parameters to change (e.g. --threshold 0.8 --advance slide) or --probes")
    decoding.update(flags)
    chosen_by["flags"] = flags
    a2d = config["a2d"]
    DecodeParams.from_defaults(DecodingDefaults(**decoding), block_size=a2d["block_size"], max_tokens=0,
                               eos_token_ids=a2d["eos_token_ids"]).validate(f"{folder / 'config.json'}: a2d.decoding")
    decoding = written_decoding(decoding)
    config["a2d"]["decoding"] = decoding
    decoder = {**decoder, "decoding": decoding, "chosen_by": chosen_by}
    # Written beside the old files and renamed over them only once all are complete.
    staged = {name: folder / f".{name}.redecode" for name in ("config.json", DECODER_CONFIG)}
    write_json(staged["config.json"], config)
    write_json(staged[DECODER_CONFIG], decoder)
    new = {name: lin.file_record(path) for name, path in staged.items()}
    stage = lin.make_stage(
        "redecode",
        config={"decoding": decoding, "chosen_by": chosen_by},
        inputs={name: {**rec, "from_previous": True} for name, rec in old.items()},
        outputs=new,
    )
    lineage = lin.append_stage(lineage, stage)
    lineage["shipped"] = {**lineage["shipped"], "files": {**lineage["shipped"]["files"], **new}}
    staged_lineage = lin.write_lineage(folder, lineage, f".{lin.LINEAGE_FILE}.redecode")
    for name, path in staged.items():
        path.replace(folder / name)
    staged_lineage.replace(folder / lin.LINEAGE_FILE)
    if (folder / "delta_files.json").is_file():
        finish_delta(folder)
    else:
        load_config(folder)  # the folder must read back as a valid a2d model
    return decoding


# --------------------------------------------------------------------------------------------- delta


def base_pins(chain: dict[str, Any]) -> dict[str, Any]:
    """What the delta applies to: the import stage's source files and imported weights, or (a chain that
    starts at init on a plain HF folder) that folder's files."""
    first = chain["stages"][0]
    if first["stage"] == "import":
        return {
            "source_files": {k: {"sha256": v["sha256"], "bytes": v["bytes"]} for k, v in first["inputs"].items()},
            "import_config": {k: v for k, v in first["config"].items() if k != "source"},
            "weights_sha256": first["outputs"][WEIGHTS]["sha256"],
            "weights_folder": first["config"].get("source"),
        }
    return {
        "source_files": {k: {"sha256": v["sha256"], "bytes": v["bytes"]} for k, v in first["inputs"].items()},
        "import_config": None,
        "weights_sha256": first["inputs"][WEIGHTS]["sha256"],
        "weights_folder": first["config"].get("base"),
    }


def imported_base_folder(chain: dict[str, Any]) -> Path:
    """The imported base folder training started from (recorded by the init stage)."""
    init = next(s for s in chain["stages"] if s["stage"] == "init")
    folder = Path(init["config"]["base"])
    pins = base_pins(chain)
    if not (folder / WEIGHTS).is_file() or lin.sha256_file(folder / WEIGHTS) != pins["weights_sha256"]:
        raise A2DError(f"{folder / WEIGHTS}: the imported base training started from is missing or changed; restore it to write a delta")
    return folder


def write_delta(delta_dir: Path, out: Path, tensors: dict, adapters: dict | None, record: dict, chain: dict) -> dict[str, Any]:
    import numpy as np
    import torch
    from .weights import read_tensors

    base = read_tensors(imported_base_folder(chain))
    stored: dict[str, torch.Tensor] = {}
    ops: dict[str, dict[str, Any]] = {}
    scale = record["lora"]["alpha"] / record["lora"]["rank"] if adapters else None
    for name, shipped in tensors.items():
        original = base.get(name)
        a_name = name.removesuffix(".weight") + ".lora_A"
        if adapters and a_name in adapters:
            (qa, a_exp), (qb, b_exp) = adapters[a_name], adapters[name.removesuffix(".weight") + ".lora_B"]
            stored[f"{name}:lora_A"], stored[f"{name}:lora_B"] = qa, qb
            ops[name] = {"op": "lora", "a_exp": a_exp, "b_exp": b_exp}
            continue
        if original is not None and original.dtype == shipped.dtype and torch.equal(original, shipped):
            ops[name] = {"op": "same"}
            continue
        if original is not None and original.ndim == 2 and original.shape[1] == shipped.shape[1]:
            common = min(original.shape[0], shipped.shape[0])
            changed = (original[:common] != shipped[:common]).any(dim=1).nonzero()[:, 0]
            rows = torch.cat([changed, torch.arange(common, shipped.shape[0])])
            if original.shape[0] <= shipped.shape[0] and len(rows) <= shipped.shape[0] // 8:
                stored[f"{name}:rows"] = rows.to(torch.int64)
                stored[f"{name}:values"] = shipped[rows].contiguous()
                ops[name] = {"op": "rows", "shape": list(shipped.shape)}
                continue
        if original is not None and original.shape == shipped.shape and shipped.numel() > 4096:
            bits = (shipped.view(torch.int16) ^ original.to(shipped.dtype).view(torch.int16)).numpy()
            packed = np.frombuffer(zlib.compress(bits.tobytes(), 9), dtype=np.uint8)
            stored[f"{name}:xor"] = torch.from_numpy(packed.copy())
            ops[name] = {"op": "xor", "shape": list(shipped.shape)}
            continue
        stored[f"{name}:full"] = shipped.contiguous()
        ops[name] = {"op": "full"}
    lin.save_tensors(delta_dir / DELTA_WEIGHTS, stored, {"format": DELTA_FORMAT})
    for name in (*CARRIED, DATA_MANIFEST, DECODER_CONFIG):
        if (out / name).is_file():
            shutil.copyfile(out / name, delta_dir / name)
    manifest = {
        "format": DELTA_FORMAT,
        "base": base_pins(chain),
        "lora_scale": scale,
        "tensors": ops,
        "weights_sha256": lin.sha256_file(out / WEIGHTS),
        "weights_bytes": (out / WEIGHTS).stat().st_size,
    }
    write_json(delta_dir / DELTA_JSON, manifest)
    return {"delta_json": lin.file_record(delta_dir / DELTA_JSON), "delta_weights": lin.file_record(delta_dir / DELTA_WEIGHTS)}


def finish_delta(delta_dir: Path) -> None:
    """The delta folder's own file list (everything but itself), checked by `verify` and `rebuild`."""
    write_json(delta_dir / "delta_files.json", lin.hash_folder(delta_dir, skip=("delta_files.json",)))


def row_adapter_tensors(folder: Path, rule: str, mask_token_id: int) -> dict:
    """A shipped row adapter's tensors as they ship (`P.<rule>_a`, `scale x P.<rule>_b`, bf16) and the mask token's
    embedding row, from an exported model folder or its delta folder, read without loading the base's weights:
    where `train --init-adapter` starts a run from an earlier one."""
    from safetensors import safe_open

    folder = Path(folder)
    suffixes = (f".{rule}_a", f".{rule}_b")
    embed = "model.embed_tokens.weight"
    out: dict = {}
    if (folder / DELTA_JSON).is_file():
        manifest = read_json(folder / DELTA_JSON)
        with safe_open(folder / DELTA_WEIGHTS, framework="pt") as stored:
            for name, op in manifest["tensors"].items():
                if name.endswith(suffixes) and op["op"] == "full":
                    out[name] = stored.get_tensor(f"{name}:full")
            if manifest["tensors"].get(embed, {}).get("op") == "rows":
                rows = stored.get_tensor(f"{embed}:rows").tolist()
                if mask_token_id in rows:
                    out["mask_embedding"] = stored.get_tensor(f"{embed}:values")[rows.index(mask_token_id)]
    elif (folder / WEIGHTS).is_file():
        with safe_open(folder / WEIGHTS, framework="pt") as stored:
            for name in stored.keys():
                if name.endswith(suffixes):
                    out[name] = stored.get_tensor(name)
            if embed in stored.keys():
                out["mask_embedding"] = stored.get_slice(embed)[mask_token_id : mask_token_id + 1][0]
    else:
        raise A2DError(f"{folder}: neither a model folder ({WEIGHTS}) nor a delta ({DELTA_JSON}) written by `export`")
    if not any(name.endswith(suffixes[0]) for name in out):
        raise A2DError(f"{folder}: no {rule} adapter in it (no *{suffixes[0]} tensors); start from a model trained with --{rule}-adapter")
    return out


def apply_delta(base: dict, delta: dict, manifest: dict) -> dict:
    import numpy as np
    import torch

    from . import lora as lora_mod

    out = {}
    for name, op in manifest["tensors"].items():
        kind = op["op"]
        if kind == "same":
            out[name] = base[name]
        elif kind == "lora":
            out[name] = lora_mod.merge_lora(
                base[name], delta[f"{name}:lora_A"], op["a_exp"], delta[f"{name}:lora_B"], op["b_exp"], manifest["lora_scale"]
            )
        elif kind == "rows":
            shape = op["shape"]
            tensor = torch.zeros(shape, dtype=base[name].dtype)
            tensor[: min(shape[0], base[name].shape[0])] = base[name][: shape[0]]
            tensor[delta[f"{name}:rows"]] = delta[f"{name}:values"]
            out[name] = tensor
        elif kind == "xor":
            bits = np.frombuffer(zlib.decompress(delta[f"{name}:xor"].numpy().tobytes()), dtype=np.int16).reshape(op["shape"])
            out[name] = (base[name].view(torch.int16) ^ torch.from_numpy(bits.copy())).view(base[name].dtype)
        elif kind == "full":
            out[name] = delta[f"{name}:full"]
        else:
            raise A2DError(f"{DELTA_JSON}: unknown op {kind!r} for {name}; rebuild with the a2d version that wrote it")
    return out


def rebuild(base: Path, delta_dir: Path, out: Path, force: bool = False) -> Path:
    from safetensors.torch import load_file

    from .import_base import import_base
    from .verify import verify_folder
    from .weights import read_tensors

    base, delta_dir, out = Path(base), Path(delta_dir), Path(out)
    files_path = delta_dir / "delta_files.json"
    if not files_path.is_file():
        raise A2DError(f"{files_path}: missing; {delta_dir} is not a delta written by `export --delta`")
    for name, rec in read_json(files_path).items():
        check_recorded(delta_dir / name, rec, "the delta")
    manifest = read_json(delta_dir / DELTA_JSON)
    if manifest.get("format") != DELTA_FORMAT:
        raise A2DError(f"{delta_dir / DELTA_JSON}: format {manifest.get('format')!r} is not {DELTA_FORMAT}")
    pins = manifest["base"]
    with staged_out_dir(out, force) as work:
        with tempfile.TemporaryDirectory(prefix="a2d-rebuild-") as tmp:
            weights_folder = locate_base_weights(base, pins, Path(tmp) / "imported", import_base)
            base_tensors = read_tensors(weights_folder)
            tensors = apply_delta(base_tensors, load_file(delta_dir / DELTA_WEIGHTS), manifest)
            lin.save_tensors(work / WEIGHTS, tensors, {"format": "pt"})
        got = lin.sha256_file(work / WEIGHTS)
        if got != manifest["weights_sha256"]:
            raise A2DError(
                f"{out / WEIGHTS}: rebuilt weights have sha256 {got}, the delta records {manifest['weights_sha256']}; "
                "the safetensors or torch version differs from the one that exported it"
            )
        for name in (*CARRIED, DATA_MANIFEST, DECODER_CONFIG, lin.LINEAGE_FILE):
            if (delta_dir / name).is_file():
                shutil.copyfile(delta_dir / name, work / name)
        report = verify_folder(work)
        if not report.ok:
            raise A2DError(f"{out}: the rebuilt folder fails verify: {report.failures[0]}")
    return out


def locate_base_weights(base: Path, pins: dict, scratch: Path, import_base) -> Path:
    """A folder whose model.safetensors is the pinned imported base: BASE itself, or BASE imported."""
    if base.is_dir() and (base / WEIGHTS).is_file() and lin.sha256_file(base / WEIGHTS) == pins["weights_sha256"]:
        return base
    sources = pins["source_files"]
    if base.is_file():
        # A downloaded base keeps whatever name its host gives it; only its content is pinned.
        models = {k: v for k, v in sources.items() if not k.startswith("tokenizer/")}
        got = lin.sha256_file(base)
        if not any(rec["sha256"] == got for rec in models.values()):
            want = ", ".join(f"sha256 {v['sha256'][:16]}… (recorded as {k})" for k, v in models.items())
            raise A2DError(f"--base {base}: not the pinned base (its sha256 is {got[:16]}…); the delta needs {want}")
    elif base.is_dir():
        for name, rec in sources.items():
            if name.startswith("tokenizer/"):
                continue
            check_recorded(base / name, rec, "the pinned base")
    else:
        raise A2DError(f"--base {base}: not found")
    if pins["import_config"] is None:
        raise A2DError(f"--base {base}: its model.safetensors is not the pinned base weights (sha256 {pins['weights_sha256'][:16]}…)")
    imported = import_base(base, scratch)
    if lin.sha256_file(imported / WEIGHTS) != pins["weights_sha256"]:
        raise A2DError(
            f"--base {base}: importing it gives weights other than the pinned ones; the gguf/torch versions differ "
            "from the exporting machine's (see lineage.json versions)"
        )
    return imported


# --------------------------------------------------------------------------------------------- commands


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export",
        help="write the engine's model folder (and optionally a compact delta) from a training checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint folder, or a run folder (its latest)")
    p.add_argument("--out", type=Path, required=True, help="the model folder to write")
    p.add_argument("--delta", type=Path, help="also write a delta folder against the pinned base (for `rebuild`)")
    p.add_argument("--probes", type=Path, help="evaluate-probes result whose 'recommended' decoding becomes the default")
    add_decoding_flags(p)
    p.add_argument("--force", action="store_true", help="overwrite non-empty output folders")
    p.set_defaults(run=run_export)

    r = subparsers.add_parser(
        "rebuild",
        help="rebuild an exported model folder bit for bit from the pinned base and a delta",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument("--base", type=Path, required=True, help="the pinned base: its GGUF/HF source, or its imported folder")
    r.add_argument("--delta", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--force", action="store_true")
    r.set_defaults(run=run_rebuild)

    d = subparsers.add_parser(
        "redecode",
        help="change an exported model's (or delta's) default decoding, recorded in its lineage; weights untouched",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--model", type=Path, required=True, help="a folder written by `export`: the model, or its --delta")
    d.add_argument("--probes", type=Path, help="evaluate-probes result whose 'recommended' decoding becomes the default")
    add_decoding_flags(d)
    d.set_defaults(run=run_redecode)


def run_redecode(args) -> int:
    decoding = redecode(args.model, decoding_flags(args), args.probes)
    print(json.dumps({"model": str(args.model), "decoding": decoding}))
    return 0


def run_export(args) -> int:
    out = export(args.checkpoint, args.out, decoding_flags(args), args.probes, args.delta, args.force)
    lineage = lin.read_lineage(out)
    print(json.dumps({"out": str(out), "weights_sha256": lineage["shipped"]["weights_sha256"], "delta": lineage.get("delta")}, indent=2))
    return 0


def run_rebuild(args) -> int:
    out = rebuild(args.base, args.delta, args.out, args.force)
    print(json.dumps({"out": str(out), "weights_sha256": lin.sha256_file(out / WEIGHTS)}))
    return 0
