"""Reading config.json exactly as docs/model-format.md defines it: the architecture fields and the a2d
section. Every rejection names the field, the file and what to do about it."""

import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .decoding import DECODING_PARAMETERS, RETIRED_DECODING_FIELDS, RETIRED_RULES_NOTE, DecodeParams, DecodingDefaults, written_decoding
from .errors import A2DError

FORMAT_VERSION = 1

# engine/supported-config.json (this package holds a link to it): the architectures, the config.json fields
# the engine reads, the metadata fields it ignores and the fix for fields known to change the math. The C++
# config reader compiles in the same file, so what passes here is what the engine loads.
SUPPORTED_CONFIG_FILE = Path(__file__).with_name("supported_config.json")


@functools.cache
def supported_config() -> dict:
    return json.loads(SUPPORTED_CONFIG_FILE.read_text(encoding="utf-8"))


# architectures[0] -> model_type; the per-type switches live in ModelConfig.from_dict.
ARCHITECTURES = {a["architecture"]: a["model_type"] for a in supported_config()["architectures"]}


def check_supported_fields(raw: dict, source: Path) -> None:
    """Refuse every top-level field the engine neither reads nor ignores as metadata, with its fix."""
    supported = supported_config()
    known = set(supported["fields"]) | set(supported["metadata"])
    for key in raw:
        if key not in known:
            fix = supported["refused"].get(
                key, "remove it if it is metadata, or use a model whose config a2d supports (docs/model-format.md)"
            )
            raise A2DError(f"{source}: field '{key}' is not supported by the a2d engine; {fix}")


def read_json(path: Path) -> dict:
    if not path.is_file():
        raise A2DError(f"{path}: file not found; point at a model folder that has it (docs/model-format.md)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise A2DError(f"{path}: not valid JSON ({error}); restore the file from the model's source") from None
    if not isinstance(data, dict):
        raise A2DError(f"{path}: expected a JSON object at the top level; restore the file from the model's source")
    return data


def write_text_atomic(path: Path, text: str) -> None:
    """Write beside the target, then rename over it: a process killed mid-write (a time box, Ctrl-C)
    leaves either the old file or the new one, never a truncated one."""
    path = Path(path)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, as every backend reads it."""

    architecture: str  # architectures[0], e.g. "LlamaForCausalLM"
    model_type: str  # "llama" | "qwen2" | "qwen3"
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # q, k and v projections carry a bias
    o_bias: bool  # the output projection carries a bias
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE (qwen3)

    @staticmethod
    def from_dict(raw: dict, source: Path) -> "ModelConfig":
        def get(name, kind, default=None, required=True):
            value = raw.get(name, default)
            if value is None:
                if required:
                    raise A2DError(f"{source}: field '{name}' is missing; add it (docs/model-format.md)")
                return None
            if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise A2DError(f"{source}: field '{name}' must be a positive integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise A2DError(f"{source}: field '{name}' must be a positive number, got {value!r}")
            if kind is bool and not isinstance(value, bool):
                raise A2DError(f"{source}: field '{name}' must be true or false, got {value!r}")
            return value

        architectures = raw.get("architectures")
        if not isinstance(architectures, list) or not architectures:
            raise A2DError(f"{source}: field 'architectures' is missing; add e.g. [\"LlamaForCausalLM\"]")
        architecture = architectures[0]
        if architecture not in ARCHITECTURES:
            raise A2DError(
                f"{source}: architecture {architecture!r} is not supported; a2d supports "
                f"{', '.join(ARCHITECTURES)} (docs/model-format.md)"
            )
        model_type = raw.get("model_type")
        if model_type != ARCHITECTURES[architecture]:
            raise A2DError(
                f"{source}: model_type {model_type!r} does not match architecture {architecture}; "
                f"set it to {ARCHITECTURES[architecture]!r}"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise A2DError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported; a2d needs 'silu'")
        if raw.get("mlp_bias", False):
            raise A2DError(f"{source}: mlp_bias true is not supported; a2d needs MLPs without bias")
        if raw.get("use_sliding_window", False):
            raise A2DError(f"{source}: use_sliding_window true is not supported; a2d needs full attention")
        if raw.get("pretraining_tp", 1) != 1:
            raise A2DError(f"{source}: pretraining_tp {raw['pretraining_tp']!r} is not supported; it must be 1")
        layer_types = raw.get("layer_types") or []
        if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
            raise A2DError(f"{source}: layer_types {layer_types!r} is not supported; a2d uses full attention in every layer")
        check_supported_fields(raw, source)

        rope_parameters = raw.get("rope_parameters") or {}
        if isinstance(rope_parameters, dict) and set(rope_parameters) - {"rope_type", "rope_theta"}:
            extra = sorted(set(rope_parameters) - {"rope_type", "rope_theta"})
            raise A2DError(f"{source}: rope_parameters {extra} are not supported; plain RoPE takes only rope_type and rope_theta")
        rope_scaling = raw.get("rope_scaling")
        for name, scaling in (("rope_scaling", rope_scaling), ("rope_parameters", rope_parameters)):
            if scaling is None:
                continue
            if not isinstance(scaling, dict):
                raise A2DError(f"{source}: field '{name}' must be an object or null, got {scaling!r}")
            rope_type = scaling.get("rope_type", scaling.get("type", "default"))
            if rope_type not in (None, "default"):
                raise A2DError(
                    f"{source}: {name}.rope_type {rope_type!r} is not supported; a2d implements plain RoPE only"
                )
        if "rope_theta" in raw and "rope_theta" in rope_parameters and raw["rope_theta"] != rope_parameters["rope_theta"]:
            raise A2DError(f"{source}: rope_parameters.rope_theta disagrees with the top-level rope_theta; keep one of them")
        rope_theta = raw.get("rope_theta", rope_parameters.get("rope_theta", 10000.0))
        if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or rope_theta <= 0:
            raise A2DError(f"{source}: field 'rope_theta' must be a positive number, got {rope_theta!r}")

        hidden = get("hidden_size", int)
        heads = get("num_attention_heads", int)
        kv_heads = get("num_key_value_heads", int, default=heads)
        if heads % kv_heads != 0:
            raise A2DError(
                f"{source}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}; fix the config"
            )
        head_dim = get("head_dim", int, required=False)
        if head_dim is None:
            if hidden % heads != 0:
                raise A2DError(f"{source}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; set head_dim")
            head_dim = hidden // heads
        if head_dim % 2 != 0:
            raise A2DError(f"{source}: head_dim {head_dim} must be even for RoPE; fix the config")

        attention_bias = get("attention_bias", bool, default=False)
        return ModelConfig(
            architecture=architecture,
            model_type=model_type,
            hidden_size=hidden,
            intermediate_size=get("intermediate_size", int),
            num_layers=get("num_hidden_layers", int),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=get("vocab_size", int),
            rms_norm_eps=float(get("rms_norm_eps", float, default=1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=get("max_position_embeddings", int, default=4096),
            tie_word_embeddings=get("tie_word_embeddings", bool, default=False),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type == "qwen3",
        )


# a2d.precision (docs/model-format.md): "bf16", the projections as stored in a float dtype (bf16, or f16/f32);
# "fp8-e4m3", every projection and the lm_head as e4m3 with one fp32 scale per output row (`quantize`).
PRECISIONS = ("bf16", "fp8-e4m3")


@dataclass(frozen=True)
class A2DSection:
    """config.json's "a2d" section (docs/model-format.md)."""

    mask_token_id: int
    mask_token: str
    block_size: int
    shift_logits: bool
    eos_token_ids: tuple[int, ...]
    trained: bool
    decoding: DecodingDefaults = field(default_factory=DecodingDefaults)
    format_version: int = FORMAT_VERSION
    # A row adapter (docs/model-format.md): low-rank factors added to some projections on the rows its rule
    # names, every other row running the base weights unchanged; None: none.
    adapter: "AdapterSpec | None" = None
    precision: str = "bf16"  # one of PRECISIONS
    # The window adapter's window and attention rule with no factors: every row runs the model's own weights
    # (docs/model-format.md, a2d.window_rule). Never beside an adapter.
    window_rule: bool = False

    @property
    def attention_rule(self) -> str | None:
        """How a window row holding a real token attends (docs/decoding.md): "mask" (the mask adapter's), "window"
        (the window adapter's or the window rule's), or None (like every window row)."""
        return self.adapter.rule if self.adapter is not None else "window" if self.window_rule else None

    @property
    def anchor_in_window(self) -> bool:
        """The window starts at the anchor, the last finished token, which enters the cache one move later
        (docs/decoding.md, "Window adapter"): the window adapter's layout, and the window rule's."""
        return self.attention_rule == "window"

    def to_dict(self) -> dict:
        out = {
            "format_version": self.format_version,
            "mask_token_id": self.mask_token_id,
            "mask_token": self.mask_token,
            "block_size": self.block_size,
            "shift_logits": self.shift_logits,
            "eos_token_ids": list(self.eos_token_ids),
            "trained": self.trained,
            "decoding": {
                "threshold": self.decoding.threshold,
                "min_per_step": self.decoding.min_per_step,
                "steps": self.decoding.steps,
                "temperature": self.decoding.temperature,
                "top_p": self.decoding.top_p,
                "remasking": self.decoding.remasking,
                "advance": self.decoding.advance,
                "commit": self.decoding.commit,
                "reveal_order": self.decoding.reveal_order,
            },
        }
        out["decoding"] = written_decoding(out["decoding"])
        if self.adapter is not None:
            out[self.adapter.section] = {"rank": self.adapter.rank, "targets": list(self.adapter.targets)}
        if self.window_rule:  # written only where it applies, as precision
            out["window_rule"] = True
        if self.precision != "bf16":  # written only where it applies: other models' files stay as they were
            out["precision"] = self.precision
        return out

    @staticmethod
    def from_dict(raw: dict, vocab_size: int, source: Path) -> "A2DSection":
        where = f"{source}: a2d."
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise A2DError(
                f"{where}format_version is {version!r}, this a2d reads {FORMAT_VERSION}; re-export the model with this a2d version"
            )

        def integer(name, low, high):
            value = raw.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise A2DError(f"{where}{name} must be an integer in [{low}, {high}], got {value!r}; fix config.json")
            return value

        mask_token_id = integer("mask_token_id", 0, vocab_size - 1)
        block = DECODING_PARAMETERS["block_size"]
        block_size = integer("block_size", block["min"], block["max"])
        eos = raw.get("eos_token_ids")
        if not isinstance(eos, list) or not eos or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in eos
        ):
            raise A2DError(f"{where}eos_token_ids must be a non-empty list of token ids below {vocab_size}, got {eos!r}")
        for name in ("shift_logits", "trained"):
            if not isinstance(raw.get(name), bool):
                raise A2DError(f"{where}{name} must be true or false, got {raw.get(name)!r}; fix config.json")
        mask_token = raw.get("mask_token")
        if not isinstance(mask_token, str) or not mask_token:
            raise A2DError(f"{where}mask_token must be the mask token's text, got {mask_token!r}; fix config.json")
        decoding_raw = raw.get("decoding", {})
        if not isinstance(decoding_raw, dict):
            raise A2DError(f"{where}decoding must be an object, got {decoding_raw!r}; fix config.json")
        known = DecodingDefaults.__dataclass_fields__
        unknown = sorted(set(decoding_raw) - set(known))
        if unknown:
            retired = [name for name in unknown if name in RETIRED_DECODING_FIELDS]
            hint = f" ({', '.join(retired)}: {RETIRED_RULES_NOTE})" if retired else ""
            raise A2DError(f"{where}decoding has unknown fields {unknown}{hint}; allowed: {sorted(known)}")
        decoding = DecodingDefaults(**decoding_raw)
        # The ranges are the decoder's; check them here so a bad default fails at load, not at the first request.
        DecodeParams.from_defaults(decoding, block_size=block_size, max_tokens=0, eos_token_ids=eos).validate(
            f"{where}decoding"
        )
        adapter = parse_adapter(raw, where)
        window_rule = raw.get("window_rule", False)
        if not isinstance(window_rule, bool):
            raise A2DError(f"{where}window_rule must be true or false, got {window_rule!r}; fix config.json")
        if window_rule and adapter is not None:
            raise A2DError(f"{where}window_rule is given beside {adapter.section}; the window rule is the window adapter's "
                           "rule without factors, so a model has one or the other; fix config.json or re-export the model")
        windowed = "window_rule" if window_rule else "window_adapter" if adapter is not None and adapter.rule == "window" else None
        if windowed and not raw["shift_logits"]:
            raise A2DError(f"{where}{windowed} needs shift_logits true (its anchor row predicts the window's first "
                           "position); fix config.json or re-export the model")
        precision = raw.get("precision", "bf16")
        if precision not in PRECISIONS:
            raise A2DError(f"{where}precision must be one of {list(PRECISIONS)}, got {precision!r}; fix config.json or quantize the model again")
        return A2DSection(
            mask_token_id=mask_token_id,
            mask_token=mask_token,
            block_size=block_size,
            shift_logits=raw["shift_logits"],
            eos_token_ids=tuple(eos),
            trained=raw["trained"],
            decoding=decoding,
            adapter=adapter,
            precision=precision,
            window_rule=window_rule,
        )


ADAPTER_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdapterSpec:
    """a2d.mask_adapter or a2d.window_adapter (docs/model-format.md): low-rank factors P.<rule>_a [rank, in]
    and P.<rule>_b [out, rank] on the `targets` projections of every layer, added as B (A x) on the rows the
    rule names: "mask", the rows holding the mask token; "window", every row of the window."""

    rule: str  # one of ADAPTER_RULES
    rank: int
    targets: tuple[str, ...]

    @property
    def section(self) -> str:
        return f"{self.rule}_adapter"

    @property
    def factor_names(self) -> tuple[str, str]:
        """The factors' tensor suffixes after the projection's name (and the module attributes that hold them)."""
        return f"{self.rule}_a", f"{self.rule}_b"


ADAPTER_RULES = ("mask", "window")


def parse_adapter(a2d_raw: dict, where: str) -> AdapterSpec | None:
    """a2d.mask_adapter or a2d.window_adapter {"rank": r, "targets": [...]} -> AdapterSpec; neither -> None."""
    present = [rule for rule in ADAPTER_RULES if f"{rule}_adapter" in a2d_raw]
    if not present:
        return None
    fix = "fix config.json or re-export the model"
    if len(present) > 1:
        raise A2DError(f"{where}mask_adapter and window_adapter are both given; a model has one adapter; {fix}")
    rule = present[0]
    name, raw = f"{rule}_adapter", a2d_raw[f"{rule}_adapter"]
    if not isinstance(raw, dict) or set(raw) != {"rank", "targets"}:
        raise A2DError(f"{where}{name} must be an object with exactly 'rank' and 'targets', got {raw!r}; {fix}")
    rank, targets = raw["rank"], raw["targets"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 256:
        raise A2DError(f"{where}{name}.rank must be an integer in [1, 256], got {rank!r}; {fix}")
    if (not isinstance(targets, list) or not targets or len(set(targets)) != len(targets)
            or not all(t in ADAPTER_TARGETS for t in targets)):
        raise A2DError(f"{where}{name}.targets must be a non-empty list of distinct names from {list(ADAPTER_TARGETS)}, got {targets!r}; {fix}")
    return AdapterSpec(rule, rank, tuple(t for t in ADAPTER_TARGETS if t in targets))


def load_config(model_dir: Path) -> tuple[ModelConfig, A2DSection | None, dict]:
    """Returns the architecture, the a2d section (None for a plain AR base) and the raw JSON."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise A2DError(f"{model_dir}: model folder not found; pass a folder made by `python -m a2d_convert init`")
    path = model_dir / "config.json"
    raw = read_json(path)
    config = ModelConfig.from_dict(raw, path)
    a2d_raw = raw.get("a2d")
    if a2d_raw is None:
        return config, None, raw
    if not isinstance(a2d_raw, dict):
        raise A2DError(f"{path}: the a2d section must be an object; re-create it with `python -m a2d_convert init`")
    return config, A2DSection.from_dict(a2d_raw, config.vocab_size, path), raw
