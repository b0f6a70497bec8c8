"""Reading and checking the weights of a model folder (docs/model-format.md, "Tensors").

Weights live in `model.safetensors` or in shards listed by `model.safetensors.index.json`. Every
tensor the config implies must be present with its exact shape, and nothing else may be: a bias the
config does not announce is as much an error as a missing layer. torch is imported lazily so that the
torch-free commands (tiny-base) stay fast.

An FP8 folder (`a2d.precision: "fp8-e4m3"`, written by `quantize`) stores every projection and the lm_head
as F8_E4M3 `W` with an F32 `W_scale` [out] beside it (`...q_proj.weight_scale`); the reference reads
them as `W.float() * W_scale[:, None]` in fp32, which is exactly the matrix every backend multiplies.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .config import A2DSection, ModelConfig, read_json
from .errors import A2DError

if TYPE_CHECKING:
    import torch

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ACCEPTED_DTYPES = ("BF16", "F16", "F32")
FP8_DTYPE = "F8_E4M3"
SCALE_SUFFIX = "_scale"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantized_names(cfg: ModelConfig) -> list[str]:
    """The weights an FP8 folder stores as e4m3: every projection of every layer, and an untied lm_head."""
    names = [
        f"model.layers.{i}.{'mlp' if p in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{p}.weight"
        for i in range(cfg.num_layers)
        for p in PROJECTIONS
    ]
    return names + ([] if cfg.tie_word_embeddings else ["lm_head.weight"])


def is_fp8(a2d: A2DSection | None) -> bool:
    return a2d is not None and a2d.precision == "fp8-e4m3"


def tensor_shapes(cfg: ModelConfig, a2d: A2DSection | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor name the config implies, with its shape, in HF order (then the mask adapter's
    factors, when the a2d section announces one: `<projection>.mask_a` [rank, in], `.mask_b` [out, rank])."""
    h, q_dim, kv_dim = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for name, rows in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            shapes[p + f"self_attn.{name}.weight"] = (rows, h)
            if cfg.qkv_bias:
                shapes[p + f"self_attn.{name}.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q_dim)
        if cfg.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (cfg.head_dim,)
            shapes[p + "self_attn.k_norm.weight"] = (cfg.head_dim,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.up_proj.weight"] = (cfg.intermediate_size, h)
        shapes[p + "mlp.down_proj.weight"] = (h, cfg.intermediate_size)
    shapes["model.norm.weight"] = (h,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, h)
    if a2d is not None and a2d.adapter is not None:
        a_name, b_name = a2d.adapter.factor_names
        for i in range(cfg.num_layers):
            for target in a2d.adapter.targets:
                stem = f"model.layers.{i}.{'mlp' if target in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{target}"
                out_features, in_features = shapes[stem + ".weight"]
                shapes[f"{stem}.{a_name}"] = (a2d.adapter.rank, in_features)
                shapes[f"{stem}.{b_name}"] = (out_features, a2d.adapter.rank)
    if is_fp8(a2d):
        for name in quantized_names(cfg):
            shapes[name + SCALE_SUFFIX] = shapes[name][:1]
    return shapes


def weight_files(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (single file or sharded index)."""
    single, index = model_dir / WEIGHTS_FILE, model_dir / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise A2DError(f"{index}: no 'weight_map' object; restore the index written with the shards")
        return {name: model_dir / shard for name, shard in weight_map.items()}
    if single.is_file():
        return {}  # filled by read_tensors from the file's own header
    raise A2DError(f"{model_dir}: no {WEIGHTS_FILE} or {INDEX_FILE}; put the model's weights in the folder")


def read_tensors(model_dir: Path) -> dict[str, "torch.Tensor"]:
    """All tensors of a model folder, in their stored dtype."""
    from safetensors import SafetensorError, safe_open

    by_name = weight_files(model_dir)
    files = sorted(set(by_name.values())) or [model_dir / WEIGHTS_FILE]
    tensors = {}
    for path in files:
        if not path.is_file():
            raise A2DError(f"{path}: weight shard not found (listed in {INDEX_FILE}); restore the shard")
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if by_name and by_name.get(name) != path:
                        continue
                    tensors[name] = f.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError, ValueError) as err:
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise A2DError(f"{path}: not a readable safetensors file ({detail}); re-download or re-export it") from None
    return tensors


def check_tensors(tensors: dict[str, "torch.Tensor"], cfg: ModelConfig, model_dir: Path, a2d: A2DSection | None = None) -> None:
    """Names, shapes and dtypes exactly as the config implies, or an A2DError naming the disagreement."""
    where = f"{model_dir} (config.json vs *.safetensors)"
    expected = tensor_shapes(cfg, a2d)
    fp8 = set(quantized_names(cfg)) if is_fp8(a2d) else set()
    for name, shape in expected.items():
        if name not in tensors:
            raise A2DError(f"{where}: tensor '{name}' is missing; {_which_field(name)}")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise A2DError(f"{where}: tensor '{name}' has shape {list(got)}, the config implies {list(shape)}; {_which_field(name)}")
        dtype = _dtype_name(tensors[name])
        if name in fp8 and dtype != FP8_DTYPE:
            raise A2DError(f"{where}: tensor '{name}' is {dtype}, but a2d.precision 'fp8-e4m3' stores it as {FP8_DTYPE}; quantize the model again")
        if name.endswith(SCALE_SUFFIX) and name.removesuffix(SCALE_SUFFIX) in fp8:
            if dtype != "F32":
                raise A2DError(f"{where}: tensor '{name}' is {dtype}; FP8 scales are F32 (quantize the model again)")
            if not (tensors[name].isfinite() & (tensors[name] >= 0)).all():
                raise A2DError(f"{where}: tensor '{name}' holds a negative or non-finite scale; quantize the model again")
        elif name not in fp8 and dtype == FP8_DTYPE:
            raise A2DError(
                f"{where}: tensor '{name}' is {FP8_DTYPE}, which a2d reads only for the projections and lm_head of a model "
                "whose config.json says a2d.precision 'fp8-e4m3'; make FP8 models with `python -m a2d_convert quantize`"
            )
        elif name not in fp8 and dtype not in ACCEPTED_DTYPES:
            raise A2DError(f"{where}: tensor '{name}' is {dtype}; store weights as bf16, f16 or f32")
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise A2DError(f"{where}: unexpected tensor '{extra[0]}' ({len(extra)} in all); {_which_field(extra[0])}")


def _which_field(name: str) -> str:
    """The config field that decides whether/how a tensor exists, to point the user at the fix."""
    if name.endswith(".bias"):
        return "check 'attention_bias' (and the architecture: qwen2 always has q/k/v biases)"
    if "q_norm" in name or "k_norm" in name:
        return "QK-norm exists only for Qwen3ForCausalLM; check 'architectures'"
    if name.endswith((".mask_a", ".mask_b")):
        return "check the a2d section's 'mask_adapter' (rank and targets)"
    if name.endswith(SCALE_SUFFIX):
        return "FP8 scales belong to a model whose config.json says a2d.precision 'fp8-e4m3'"
    if name.startswith("lm_head"):
        return "check 'tie_word_embeddings' and 'vocab_size'"
    if "embed_tokens" in name:
        return "check 'vocab_size' and 'hidden_size'"
    if ".layers." in name:
        return "check 'num_hidden_layers', 'hidden_size', 'intermediate_size', the head counts and 'head_dim'"
    return "the config.json does not describe these weights"


def _dtype_name(tensor: "torch.Tensor") -> str:
    import torch

    names = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float8_e4m3fn: FP8_DTYPE}
    return names.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))


def dequantize(weight: "torch.Tensor", scale: "torch.Tensor") -> "torch.Tensor":
    """An FP8 weight as the fp32 matrix it stands for: each e4m3 value times its row's scale, one fp32 product."""
    import torch

    return weight.to(torch.float32) * scale.to(torch.float32)[:, None]


def load_checked(model_dir: Path, cfg: ModelConfig, a2d: A2DSection | None = None) -> dict[str, "torch.Tensor"]:
    """The folder's tensors, checked against the config and upcast to fp32 (the reference precision); an FP8
    folder's weights dequantized (its scales consumed)."""
    import torch

    tensors = read_tensors(model_dir)
    check_tensors(tensors, cfg, model_dir, a2d)
    if is_fp8(a2d):
        for name in quantized_names(cfg):
            tensors[name] = dequantize(tensors[name], tensors.pop(name + SCALE_SUFFIX))
    return {name: t.to(torch.float32) for name, t in tensors.items()}
