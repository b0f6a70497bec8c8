"""LoRA for the reference Transformer, and the bit-exact merge that defines shipped LoRA weights.

Adapters (Hu et al. 2021, LoRA: W x + (alpha / r) B A x, with B initialised to zero so training starts
from the base) are attached to the projection `nn.Linear`s as extra parameters `lora_A` [r, in] and
`lora_B` [out, r] plus a forward hook, so module and tensor names stay the HF names and FSDP shards
the adapters together with their layer. Optionally the RMSNorm weights and the mask token's
embedding row train too (a few kilobytes): the mask row starts at the mean embedding `init` wrote and
is the one embedding the base never learned.

A *row adapter* has the same factors but adds them only on some rows of a forward (`Transformer.row_gate`),
and ships unmerged (docs/model-format.md): `P.<rule>_a` and `scale x P.<rule>_b` rounded to bf16. Its rule
says which rows, and decoding pairs it with an attention rule (docs/decoding.md):
- a *mask adapter* (`attach(..., rows="mask")`, factors `mask_a` / `mask_b`): the rows holding the mask token;
  a revealed window position attends causally, to the committed tokens and the revealed positions of its
  block at or before it, never to a masked one. Every row of a real token runs the AR base exactly, and a
  masked position whose left neighbours are all known is predicted exactly as the base predicts it.
- a *window adapter* (`attach(..., rows="window")`, factors `window_a` / `window_b`): every window row, the
  window starting at the anchor (the last finished token, which enters the cache one move later); a window
  row of a real token attends to the cache and every real token of the window, on both sides, a masked row
  to the cache and the whole window. The cache is still the base's exactly, and every masked position is
  predicted from a row that sees every revealed token of the window: out-of-order reveals inform the
  positions left of them.

`merge_lora` is what `export` and `rebuild` both call, so the shipped weights are a pure function of
(base bf16 weight, shipped factors, scale) that every IEEE-754 machine computes bit for bit. The
factors ship as int16 with one power-of-two exponent per tensor (`quantize_factor`: 15 bits of the
tensor's peak, finer than bf16's 8 for all but tiny entries). B @ A is then a float64 matrix product
of integers below 2^15 over the rank: every partial sum is an integer below 2^53, hence exact, so
BLAS may block, reorder or fuse it as it likes. After it come one scaling, one addition to the base
weight, and the rounding to fp32 and then bf16 (round to nearest even) — each a single IEEE operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MASK_EMBEDDING = "model.embed_tokens.mask_embedding"


@dataclass(frozen=True)
class LoraConfig:
    rank: int = 16
    alpha: float = 32.0  # scale = alpha / rank
    targets: tuple[str, ...] = TARGETS
    train_norms: bool = True
    train_mask_embedding: bool = True

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _lora_hook(module: nn.Linear, inputs, output):
    if not module.lora_enabled:
        return output
    x = inputs[0]
    return output + module.lora_scale * F.linear(F.linear(x, module.lora_A), module.lora_B)


class RowGate:
    """The rows of a forward that take a row adapter, shared by every hook of a model: a [b, T, 1] fp32 tensor
    of 0 and 1, True for every row (a forward of window rows only), or None for none."""

    def __init__(self) -> None:
        self.rows: torch.Tensor | bool | None = None


def _row_factors_hook(module: nn.Linear, inputs, output):
    rows = module.row_gate.rows
    if not module.lora_enabled or rows is None:
        return output
    a, b = (getattr(module, name) for name in module.row_factors)
    delta = F.linear(F.linear(inputs[0], a), b)
    if module.lora_scale != 1.0:
        delta = delta * module.lora_scale
    return output + (delta if rows is True else delta * rows).to(output.dtype)


def grouped_projections(modules: tuple[nn.Linear, ...], x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of projections that read the same input (q/k/v, gate/up, or one alone), with their row factors
    when they have them, in three GEMMs for the group: the base weights stacked, every A stacked (t = A x, one read
    of x), and B block-diagonal in an addmm onto the base output (the scale folded into B, a row gate applied to t:
    (B t) g = B (t g) for a per-row g). The same sums as one projection at a time with its hook
    (`_row_factors_hook`), in another order; training uses it (`fuse_projections`), the reference decoder does
    not."""
    first = modules[0]
    sizes = [m.weight.shape[0] for m in modules]
    weight = torch.cat([m.weight for m in modules]) if len(modules) > 1 else first.weight
    bias = None
    if first.bias is not None:
        bias = torch.cat([m.bias for m in modules]) if len(modules) > 1 else first.bias
    out = F.linear(x, weight, bias)
    rows = first.row_gate.rows if hasattr(first, "row_gate") else None
    if rows is not None and first.lora_enabled:
        a_name, b_name = first.row_factors
        a = torch.cat([getattr(m, a_name) for m in modules]) if len(modules) > 1 else getattr(first, a_name)
        bs = [getattr(m, b_name) for m in modules]
        b = torch.block_diag(*bs) if len(bs) > 1 else bs[0]
        if first.lora_scale != 1.0:
            b = b * first.lora_scale
        t = F.linear(x, a)
        if rows is not True:
            t = t * rows
        flat = out.reshape(-1, out.shape[-1])
        out = torch.addmm(flat, t.reshape(-1, t.shape[-1]).to(flat.dtype), b.t().to(flat.dtype)).view(out.shape)
    return tuple(out.split(sizes, dim=-1)) if len(modules) > 1 else (out,)


def fuse_projections(model: nn.Module) -> int:
    """Switch every decoder layer whose seven projections all carry row factors (or none does) to
    `grouped_projections`; returns how many layers switched. Full LoRA (merged factors) keeps its hooks."""
    switched = 0
    for layer in model.model.layers:
        projections = [getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        projections += [getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        factors = {getattr(m, "row_factors", None) for m in projections}
        if len(factors) != 1 or any(hasattr(m, "lora_A") for m in projections):
            continue
        layer.self_attn.grouped = layer.mlp.grouped = True
        switched += 1
    return switched


def add_row_factors(module: nn.Linear, names: tuple[str, str], rank: int, gate: RowGate, scale: float) -> None:
    """Zero factors `names` (A [rank, in], B [out, rank]) on one projection, filled by training or by loading a
    model folder, and the hook that adds them on the gate's rows."""
    out_features, in_features = module.weight.shape
    device = module.weight.device
    a_name, b_name = names
    setattr(module, a_name, nn.Parameter(torch.zeros(rank, in_features, device=device), requires_grad=False))
    setattr(module, b_name, nn.Parameter(torch.zeros(out_features, rank, device=device), requires_grad=False))
    module.row_factors = names
    module.row_gate = gate
    module.lora_scale = scale
    module.lora_enabled = True
    module.register_forward_hook(_row_factors_hook)


def target_modules(model: nn.Module, targets: tuple[str, ...]):
    """(name, nn.Linear) of every projection named in `targets` inside the decoder layers."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in targets and ".layers." in f".{name}":
            yield name, module


def _mask_embedding_hook(module: nn.Embedding, inputs, output):
    if not module.lora_enabled:
        return output
    is_mask = (inputs[0] == module.mask_token_id)[..., None]
    return torch.where(is_mask, module.mask_embedding.to(output.dtype), output)


def attach(model: nn.Module, config: LoraConfig, mask_token_id: int, generator: torch.Generator | None = None,
           rows: str | None = None, freeze: bool = True) -> None:
    """Freeze the model and add trainable adapters (and norms / the mask row when configured). With `rows`
    "mask" or "window", a row adapter of that rule (module docstring): the norms stay the base's, whatever the
    config says, since the rows the adapter leaves alone must run the base exactly. `freeze=False` adds the
    adapters to a model that has some already (a plain LoRA beside a window adapter: train --clean-lora), whose
    factors stay trainable."""
    if rows not in (None, "mask", "window"):
        raise ValueError(f"attach: rows must be None, 'mask' or 'window', not {rows!r}")
    if freeze:
        for p in model.parameters():
            p.requires_grad_(False)
    for name, module in target_modules(model, config.targets):
        out_features, in_features = module.weight.shape
        a = torch.empty(config.rank, in_features, device=module.weight.device)
        # kaiming-uniform like nn.Linear's own init, so A x has unit scale; B = 0 keeps W unchanged.
        bound = 1.0 / math.sqrt(in_features)
        a.uniform_(-bound, bound, generator=generator)
        if rows is not None:
            names = (f"{rows}_a", f"{rows}_b")
            add_row_factors(module, names, config.rank, model.row_gate, config.scale)
            setattr(module, names[0], nn.Parameter(a))
            getattr(module, names[1]).requires_grad_(True)
            continue
        module.lora_A = nn.Parameter(a)
        module.lora_B = nn.Parameter(torch.zeros(out_features, config.rank, device=module.weight.device))
        module.lora_scale = config.scale
        module.lora_enabled = True
        module.register_forward_hook(_lora_hook)
    if rows is not None:
        model.attention_rule = rows
    if config.train_norms and rows is None:
        for name, module in model.named_modules():
            if name.endswith(("layernorm", "norm")) and hasattr(module, "weight"):
                module.weight.requires_grad_(True)
    if config.train_mask_embedding:
        embed = model.model.embed_tokens
        embed.mask_embedding = nn.Parameter(embed.weight[mask_token_id].detach().clone().float())
        embed.mask_token_id = mask_token_id
        embed.lora_enabled = True
        embed.register_forward_hook(_mask_embedding_hook)


def load_row_factors(model: nn.Module, shipped: dict, scale: float) -> None:
    """Fills the row adapter `attach(..., rows=...)` added from a shipped one of the same rule and rank
    (export.row_adapter_tensors: A, scale x B in bf16, the mask embedding row): A as shipped, B divided by the
    scale, so the run starts where the shipped model decodes."""
    for name, module in model.named_modules():
        if not hasattr(module, "row_factors"):
            continue
        for factor, divide in zip(module.row_factors, (1.0, scale)):
            key = f"{name}.{factor}"
            if key not in shipped:
                raise ValueError(f"{key}: missing from the adapter to start from (another rule or other targets)")
            param = getattr(module, factor)
            value = shipped[key]
            if tuple(value.shape) != tuple(param.shape):
                raise ValueError(f"{key}: shape {tuple(value.shape)} there, {tuple(param.shape)} here (another rank?)")
            with torch.no_grad():
                param.copy_(value.to(torch.float64).div(divide).to(param.dtype))
    embed = model.model.embed_tokens
    if "mask_embedding" in shipped and hasattr(embed, "mask_embedding"):
        with torch.no_grad():
            embed.mask_embedding.copy_(shipped["mask_embedding"].to(embed.mask_embedding.dtype))


def set_enabled(model: nn.Module, enabled: bool) -> None:
    """Switch every adapter off to run the frozen base (the KL teacher) through the same modules."""
    for module in model.modules():
        if hasattr(module, "lora_enabled"):
            module.lora_enabled = enabled


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    """float64 -> fp32 -> bf16, both steps round to nearest even; the bf16 step on the integer bits so
    no library version can change it."""
    bits = x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    signed = torch.where(rounded >= 0x8000, rounded - 0x10000, rounded)  # int16 holds the same 16 bits
    return signed.to(torch.int16).view(torch.bfloat16)


def quantize_factor(factor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(int16 q, exponent e) with factor ~= q * 2^-e, |q| <= 32767, e chosen from the tensor's peak."""
    peak = float(factor.abs().max())
    if peak == 0.0:
        return torch.zeros(factor.shape, dtype=torch.int16), 0
    _, peak_exp = math.frexp(peak)  # peak = m * 2^peak_exp, 0.5 <= m < 1
    exponent = 15 - peak_exp
    q = torch.round(factor.to(torch.float64) * 2.0**exponent).clamp(-32767, 32767)
    return q.to(torch.int16), exponent


def merge_lora(weight: torch.Tensor, qa: torch.Tensor, a_exp: int, qb: torch.Tensor, b_exp: int, scale: float) -> torch.Tensor:
    """bf16(W + scale * B @ A) from the shipped int16 factors, bit-reproducible (module docstring)."""
    if qa.dtype != torch.int16 or qb.dtype != torch.int16:
        raise ValueError("merge_lora takes the int16 factors that are shipped (see quantize_factor)")
    product = qb.to(torch.float64) @ qa.to(torch.float64)  # exact integers: order-independent
    delta = product * (scale * 2.0 ** -(a_exp + b_exp))
    return round_to_bf16(weight.to(torch.float64) + delta)


def ship_adapters(adapters: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, int] | torch.Tensor]:
    """Trained adapters in the form that ships: LoRA factors quantized, other tensors as trained (fp32)."""
    return {name: quantize_factor(t) if name.endswith((".lora_A", ".lora_B")) else t for name, t in adapters.items()}


def merged_state(base: dict[str, torch.Tensor], shipped: dict, scale: float, mask_token_id: int) -> dict[str, torch.Tensor]:
    """The shipped bf16 weights: base tensors with adapters merged, trained norms and the mask row set."""
    out = dict(base)
    for name, value in shipped.items():
        if name.endswith((".mask_a", ".window_a")):
            out[name] = round_to_bf16(value.to(torch.float64))
        elif name.endswith((".mask_b", ".window_b")):
            out[name] = round_to_bf16(value.to(torch.float64) * scale)  # the scale folds into B: the engines add B (A x)
        elif name.endswith(".lora_A"):
            stem = name[: -len(".lora_A")]
            (qa, a_exp), (qb, b_exp) = value, shipped[stem + ".lora_B"]
            out[stem + ".weight"] = merge_lora(base[stem + ".weight"], qa, a_exp, qb, b_exp, scale)
        elif name.endswith(".lora_B"):
            continue
        elif name == MASK_EMBEDDING:
            embed = base["model.embed_tokens.weight"].clone()
            embed[mask_token_id] = round_to_bf16(value.to(torch.float64))
            out["model.embed_tokens.weight"] = embed
        elif name in base:
            out[name] = round_to_bf16(value.to(torch.float64))
        else:
            raise KeyError(f"adapter tensor {name!r} matches no base tensor")
    return out
