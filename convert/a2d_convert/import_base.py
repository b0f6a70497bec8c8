"""`import`: bring an AR base into an HF-style bf16 folder and start its lineage.

Two sources:
- an HF folder (config.json + *.safetensors + tokenizer files): bf16 safetensors are copied byte for
  byte (the base's own sha256 carries through); other dtypes are rounded to bf16 (round to nearest even).
- a GGUF file: tensors are dequantized with the `gguf` package, renamed to HF names and rounded to bf16.
  llama.cpp stores the q/k projections of `llama` models row-permuted for its interleaved RoPE; the
  permutation is undone here so HF's rotate-half RoPE computes the same attention. The tokenizer comes
  from the GGUF's own `tokenizer.huggingface.json` when present, otherwise it is rebuilt from the GGUF
  vocabulary and merges with the `tokenizers` library (byte-level BPE only); `--tokenizer DIR` overrides
  both with an HF tokenizer folder.

The base's config.json must hold only what the engine supports (engine/supported-config.json, the list
the C++ config reader compiles in): anything else is refused here, naming the field and the fix, not
after a conversion at `generate` time. One exception is converted instead: MiniCPM (`MiniCPMForCausalLM`,
its own modeling_minicpm.py) is Llama with three muP scalars, each linear in one weight, so they are
folded into the weights and the folder becomes a plain `LlamaForCausalLM` (fold_minicpm_mup).

The output's lineage.json starts the sha256 chain: the import stage is its root, listing every input
file's hash and the base's origin (`--origin`: hub repo and commit, PyPI package, version and wheel
sha256, or the path; lineage.parse_origin), which `verify --base` checks the chain from.
The conversion is deterministic, so importing the same file twice gives byte-identical weights
(`rebuild` relies on this).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from . import lineage as lin
from .config import ModelConfig, read_json, write_json
from .errors import A2DError
from .tiny import staged_out_dir
from .weights import check_tensors, read_tensors

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)
WEIGHTS_FILE = "model.safetensors"


# --------------------------------------------------------------------------------------------- HF folder


def weight_files(folder: Path) -> list[Path]:
    """The base's weight files: the shards its index lists, or its single model.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise A2DError(f"{index}: no 'weight_map'; restore the index that came with the shards")
        return sorted({folder / shard for shard in weight_map.values()})
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    hint = " (PyTorch .bin weights are not read: convert them to safetensors first)" if any(folder.glob("*.bin")) else ""
    raise A2DError(f"{folder}: no {WEIGHTS_FILE} or model.safetensors.index.json{hint}")


def all_bf16(files: list[Path]) -> bool:
    from safetensors import safe_open

    for path in files:
        with safe_open(path, "pt") as f:
            for name in f.keys():
                if f.get_slice(name).get_dtype() != "BF16":
                    return False
    return True


def stores_tied_head(files: list[Path], config: dict[str, Any]) -> bool:
    from safetensors import safe_open

    if not config.get("tie_word_embeddings", False):
        return False
    for path in files:
        with safe_open(path, "pt") as f:
            if "lm_head.weight" in f.keys():
                return True
    return False


MINICPM_ARCHITECTURE = "MiniCPMForCausalLM"
MINICPM_MUP_FIELDS = ("scale_emb", "dim_model_base", "scale_depth")


def fold_minicpm_mup(config: dict[str, Any], path: Path) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """MiniCPM's forward (modeling_minicpm.py of openbmb's MiniCPM-1B/2B) is Llama's with three muP scalars:
    the embeddings times `scale_emb`, each residual branch (attention after o_proj, MLP after down_proj)
    times `scale_depth / sqrt(num_hidden_layers)`, and the final hidden state divided by
    `hidden_size / dim_model_base` before lm_head. Each is linear in one weight, so Llama with
        embed_tokens * scale_emb,  o_proj (and its bias) and down_proj * scale_depth / sqrt(L),
        model.norm * 1 / (hidden_size / dim_model_base)   (the final RMSNorm's gain is all lm_head reads)
    computes the same function; with tied embeddings lm_head reads the scaled embedding too, so the final
    norm also takes 1 / scale_emb. Products are taken in fp32 and rounded to bf16 once, as any import
    rounds. The versions of MiniCPM's code default these fields differently, so all of them (and
    tie_word_embeddings) must be written in config.json.

    Returns (the Llama config, a factor per tensor name, the record for the lineage)."""
    import math

    missing = [k for k in (*MINICPM_MUP_FIELDS, "tie_word_embeddings") if k not in config]
    if missing:
        raise A2DError(
            f"{path}: {MINICPM_ARCHITECTURE} without {missing}: MiniCPM's code versions default them differently; "
            "write the values the checkpoint was trained with into config.json"
        )
    for key in MINICPM_MUP_FIELDS:
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise A2DError(f"{path}: field '{key}' must be a positive number, got {value!r}")
    layers, hidden, tied = config.get("num_hidden_layers"), config.get("hidden_size"), config["tie_word_embeddings"]
    if not (isinstance(layers, int) and layers > 0 and isinstance(hidden, int) and hidden > 0 and isinstance(tied, bool)):
        raise A2DError(f"{path}: num_hidden_layers, hidden_size and tie_word_embeddings must be set; fix config.json")
    residual = config["scale_depth"] / math.sqrt(layers)
    width = hidden / config["dim_model_base"]
    final_norm = 1.0 / (width * config["scale_emb"]) if tied else 1.0 / width
    factors = {"model.embed_tokens.weight": float(config["scale_emb"]), "model.norm.weight": final_norm}
    if tied:  # a stored copy of the tied head stays equal to the embedding, and is dropped as such
        factors["lm_head.weight"] = float(config["scale_emb"])
    for i in range(layers):
        for name in ("self_attn.o_proj.weight", "self_attn.o_proj.bias", "mlp.down_proj.weight"):
            factors[f"model.layers.{i}.{name}"] = residual
    llama = {k: v for k, v in config.items() if k not in (*MINICPM_MUP_FIELDS, "auto_map")}
    llama.update(architectures=["LlamaForCausalLM"], model_type="llama")
    record = {
        "from": MINICPM_ARCHITECTURE,
        **{k: config[k] for k in MINICPM_MUP_FIELDS},
        "embed_tokens": float(config["scale_emb"]),
        "o_proj_down_proj": residual,
        "final_norm": final_norm,
    }
    return llama, factors, record


def import_hf_folder(source: Path, out: Path) -> dict[str, Any]:
    """One bf16 model.safetensors: copied byte for byte when the base already is exactly that,
    otherwise rewritten (shards merged, other dtypes rounded, a stored copy of a tied head dropped,
    MiniCPM's muP scales folded in)."""
    config_path = source / "config.json"
    if not config_path.is_file():
        raise A2DError(f"{config_path} is missing: an HF base folder needs its config.json")
    config = read_json(config_path)
    factors: dict[str, float] = {}
    folded = None
    if (config.get("architectures") or [None])[0] == MINICPM_ARCHITECTURE:
        config, factors, folded = fold_minicpm_mup(config, config_path)
    ModelConfig.from_dict(config, config_path)
    files = weight_files(source)
    for path in files:
        if not path.is_file():
            raise A2DError(f"{path}: shard listed in model.safetensors.index.json is missing; restore it")
    verbatim = not folded and files == [source / WEIGHTS_FILE] and all_bf16(files) and not stores_tied_head(files, config)
    if verbatim:
        shutil.copyfile(files[0], out / WEIGHTS_FILE)
        shutil.copyfile(config_path, out / "config.json")
    else:
        import torch
        from safetensors import safe_open

        tensors = {}
        for path in tqdm(files, desc="merge and round to bf16", unit="file"):
            with safe_open(path, "pt") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    if name in factors:
                        tensor = tensor.float() * factors[name]
                    tensors[name] = tensor.to(torch.bfloat16).contiguous()
        if config.get("tie_word_embeddings", False) and "lm_head.weight" in tensors:
            if not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
                raise A2DError(f"{config_path}: tie_word_embeddings is true but lm_head.weight differs from the embeddings")
            del tensors["lm_head.weight"]
        lin.save_tensors(out / WEIGHTS_FILE, tensors, {"format": "pt"})
        config.pop("torch_dtype", None)
        write_json(out / "config.json", {**config, "dtype": "bfloat16"})
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    if not (out / "tokenizer.json").is_file():
        raise A2DError(f"{source / 'tokenizer.json'} is missing: a2d needs the HF fast-tokenizer file")
    inputs = {p.relative_to(source).as_posix(): lin.file_record(p) for p in sorted(source.iterdir()) if p.is_file()}
    record = {"source_kind": "hf", "weights_copied_verbatim": verbatim}
    if folded:
        record["folded_mup"] = folded
    return {"inputs": inputs, "config": record}


# --------------------------------------------------------------------------------------------- GGUF

GGUF_ARCH_TO_HF = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# GGUF tensor name suffix -> HF name suffix, per layer (blk.N.<key> -> model.layers.N.<value>).
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Pre-tokenizer split patterns of the byte-level BPE families llama.cpp names in `tokenizer.ggml.pre`.
_GPT2_STYLE = None  # ByteLevel's built-in GPT-2 pattern
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS = {
    "default": ("bytelevel", None),
    "gpt2": ("bytelevel", None),
    "gpt-2": ("bytelevel", None),
    "smollm": ("digits+bytelevel", None),
    "llama-bpe": ("split", _LLAMA3_PATTERN),
    "llama3": ("split", _LLAMA3_PATTERN),
    "qwen2": ("split", _QWEN2_PATTERN),
}


def gguf_field(reader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def unpermute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (pairs (2i, 2i+1) back to halves (i, i + d/2) per head)."""
    rows = weight.shape[0]
    rest = weight.shape[1:]
    return weight.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def gguf_hf_name(name: str) -> str | None:
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return None


def gguf_config(reader, path: Path, tensor_names: set[str]) -> dict[str, Any]:
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCH_TO_HF:
        raise A2DError(f"{path}: GGUF architecture {arch!r} is not supported; a2d reads {sorted(GGUF_ARCH_TO_HF)}")

    def need(key: str) -> Any:
        value = gguf_field(reader, f"{arch}.{key}")
        if value is None:
            raise A2DError(f"{path}: GGUF metadata {arch}.{key} is missing")
        return value

    scaling = gguf_field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in tensor_names:
        raise A2DError(f"{path}: RoPE scaling {scaling or 'rope_freqs'} is not supported by a2d (plain RoPE only)")
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(gguf_field(reader, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(gguf_field(reader, f"{arch}.attention.key_length", hidden // heads))
    tied = "output.weight" not in tensor_names
    has_bias = "blk.0.attn_q.bias" in tensor_names
    config: dict[str, Any] = {
        "architectures": [GGUF_ARCH_TO_HF[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "hidden_act": "silu",
        "tie_word_embeddings": tied,
        "dtype": "bfloat16",
    }
    if arch != "qwen2":
        config["attention_bias"] = has_bias
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    if bos is not None:
        config["bos_token_id"] = int(bos)
    if eos is not None:
        config["eos_token_id"] = int(eos)
    return config


def gguf_tokenizer(reader, path: Path):
    """A `tokenizers.Tokenizer` for the GGUF's vocabulary, plus its tokenizer_config.json fields."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    embedded = gguf_field(reader, "tokenizer.huggingface.json")
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    if tokens is None and embedded is None:
        raise A2DError(f"{path}: the GGUF holds no tokenizer; pass --tokenizer DIR with the base's tokenizer.json")
    if embedded is not None:
        tokenizer = Tokenizer.from_str(embedded)
    else:
        model_kind = gguf_field(reader, "tokenizer.ggml.model")
        pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
        if model_kind != "gpt2":
            raise A2DError(
                f"{path}: tokenizer.ggml.model is {model_kind!r}; only byte-level BPE ('gpt2') vocabularies are "
                "rebuilt here — pass --tokenizer DIR with the base's tokenizer.json"
            )
        if pre not in PRE_TOKENIZERS:
            raise A2DError(
                f"{path}: pre-tokenizer {pre!r} is unknown (known: {sorted(PRE_TOKENIZERS)}); pass --tokenizer DIR"
            )
        merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges", [])]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        kind, pattern = PRE_TOKENIZERS[pre]
        if kind == "bytelevel":
            tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        elif kind == "digits+bytelevel":
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
            )
        else:
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
                ]
            )
        tokenizer.decoder = decoders.ByteLevel()
        types = gguf_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
        added = [
            AddedToken(tok, special=(kind_ == 3), normalized=False)
            for tok, kind_ in zip(tokens, types)
            if kind_ in (3, 4)  # CONTROL, USER_DEFINED
        ]
        tokenizer.add_tokens(added)
        bos_id = gguf_field(reader, "tokenizer.ggml.bos_token_id")
        if gguf_field(reader, "tokenizer.ggml.add_bos_token", False) and bos_id is not None:
            bos = tokens[bos_id]
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
            )
        else:
            tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    vocab_tokens = tokens or []

    def token_text(key: str) -> str | None:
        idx = gguf_field(reader, key)
        if idx is None or idx >= len(vocab_tokens):
            return None
        return vocab_tokens[idx]

    tokenizer_config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(gguf_field(reader, "tokenizer.ggml.add_eos_token", False)),
        "bos_token": token_text("tokenizer.ggml.bos_token_id"),
        "eos_token": token_text("tokenizer.ggml.eos_token_id"),
        "unk_token": token_text("tokenizer.ggml.unknown_token_id"),
        "pad_token": token_text("tokenizer.ggml.padding_token_id"),
        "model_max_length": int(gguf_field(reader, f"{gguf_field(reader, 'general.architecture')}.context_length", 2048)),
    }
    template = gguf_field(reader, "tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    return tokenizer, {k: v for k, v in tokenizer_config.items() if v is not None}


def gguf_tensors(reader, path: Path, config: dict[str, Any]) -> dict[str, "torch.Tensor"]:
    import torch
    from gguf import dequantize

    permute = config["model_type"] == "llama"
    tensors: dict[str, torch.Tensor] = {}
    for tensor in tqdm(reader.tensors, desc="dequantize", unit="tensor"):
        hf_name = gguf_hf_name(tensor.name)
        if hf_name is None:
            raise A2DError(f"{path}: GGUF tensor {tensor.name!r} has no HF counterpart in a2d's architectures")
        # GGUF lists dims innermost first; HF shapes are outermost first.
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)
        if permute and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            values = unpermute_rope_rows(values, config["num_attention_heads"])
        elif permute and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            values = unpermute_rope_rows(values, config["num_key_value_heads"])
        tensors[hf_name] = torch.from_numpy(np.array(values, dtype=np.float32, order="C")).to(torch.bfloat16)
    config["vocab_size"] = int(tensors["model.embed_tokens.weight"].shape[0])
    return tensors


def import_gguf(source: Path, out: Path, tokenizer_dir: Path | None) -> dict[str, Any]:
    from gguf import GGUFReader
    try:
        reader = GGUFReader(source)
    except (ValueError, OSError) as err:
        raise A2DError(f"{source}: not a readable GGUF file ({err})") from err
    names = {t.name for t in reader.tensors}
    config = gguf_config(reader, source, names)
    tensors = gguf_tensors(reader, source, config)
    lin.save_tensors(out / WEIGHTS_FILE, tensors, {"format": "pt"})
    write_json(out / "config.json", config)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
    write_json(out / "generation_config.json", generation)
    inputs = {source.name: lin.file_record(source)}
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if name != "generation_config.json" and (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, out / name)
                inputs[f"tokenizer/{name}"] = lin.file_record(tokenizer_dir / name)
        if not (out / "tokenizer.json").is_file():
            raise A2DError(f"{tokenizer_dir / 'tokenizer.json'} is missing")
    else:
        tokenizer, tokenizer_config = gguf_tokenizer(reader, source)
        tokenizer.save(str(out / "tokenizer.json"))
        write_json(out / "tokenizer_config.json", tokenizer_config)
    quant_types = sorted({t.tensor_type.name for t in reader.tensors})
    return {"inputs": inputs, "config": {"source_kind": "gguf", "gguf_tensor_types": quant_types}}


# --------------------------------------------------------------------------------------------- command


def import_base(source: Path, out: Path, tokenizer_dir: Path | None = None, force: bool = False, origin: str | None = None) -> Path:
    """`origin`: where the source came from (lineage.parse_origin), recorded in the root stage with every
    source file's sha256."""
    source, out = Path(source), Path(out)
    if not source.exists():
        raise A2DError(f"{source} does not exist: give an HF folder or a .gguf file")
    if source.is_dir() and tokenizer_dir is not None:
        raise A2DError("--tokenizer is only for GGUF sources (an HF folder carries its own tokenizer)")
    recorded_origin = lin.parse_origin(origin, source)
    with staged_out_dir(out, force) as work:
        result = import_hf_folder(source, work) if source.is_dir() else import_gguf(source, work, tokenizer_dir)
        config_path = work / "config.json"
        check_tensors(read_tensors(work), ModelConfig.from_dict(json.loads(config_path.read_text()), config_path), work)
        stage = lin.make_stage(
            "import",
            config={**result["config"], "source": str(source.resolve())},
            inputs=result["inputs"],
            outputs=lin.hash_folder(work),
            origin=recorded_origin,
        )
        # An HF folder written by an earlier a2d stage carries its chain on; anything else starts a new one.
        previous = lin.read_lineage_or_root(source) if source.is_dir() else lin.read_lineage_or_root(work)
        lin.write_lineage(work, lin.append_stage(previous, stage))
    return out


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "import",
        help="import an AR base (HF safetensors folder or GGUF file) as a bf16 HF folder with lineage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--source", required=True, type=Path, help="HF folder or .gguf file")
    p.add_argument("--out", required=True, type=Path, help="output folder (new or empty)")
    p.add_argument("--tokenizer", type=Path, help="HF folder whose tokenizer files replace the GGUF's vocabulary")
    p.add_argument("--origin", help="where the source came from, recorded in the lineage's root: hf:ORG/NAME@COMMIT, or "
                   "pypi:PACKAGE==VERSION,wheel_sha256=HEX (or wheel=PATH)[,member=PATH in the wheel]; default: the hub "
                   "cache's repo and commit when the source is in one, else its path")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args) -> int:
    out = import_base(args.source, args.out, args.tokenizer, args.force, args.origin)
    print(json.dumps({"out": str(out), "files": lin.hash_folder(out)}, indent=2))
    return 0
