"""The Llama-family transformer in PyTorch: the reference every a2d backend is compared with.

One small implementation covers llama, qwen2 (q/k/v biases) and qwen3 (per-head QK-norm), tied or
untied embeddings and a `head_dim` that differs from hidden/heads (docs/model-format.md, "The math").
Module names equal the HF tensor names, so a checkpoint's state dict loads as it is and training can
save its own back in the same layout.

The core `Transformer.forward(input_ids, position_ids, attn_mask, cache)` takes an explicit boolean
attention mask, so the same code runs plain causal attention (parity with transformers), the
block-causal mask of decoding (docs/decoding.md) and whatever layout training builds.
`BlockForward` wraps it with a KV cache into the (commit, window) forward the decoder calls.
Reference precision: weights upcast to fp32, all math in fp32; an FP8 folder's e4m3 weights become exactly
the fp32 matrices they stand for, value x row scale (weights.load_checked), so its goldens hold every
backend to the same math.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from .config import A2DSection, ModelConfig, load_config
from .errors import A2DError
from .lora import RowGate, add_row_factors, grouped_projections, target_modules
from .weights import load_checked


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [b, T, head_dim] in the rotate-half layout; inv_freq and angles in fp32 as transformers does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=position_ids.device).float() / head_dim))
    angles = position_ids[..., None].float() * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, heads, T, head_dim]; cos/sin [b, T, head_dim] (fp32). The rotation is computed in fp32 and the
    result keeps x's dtype: under bf16 autocast q and k stay bf16, as the engines store them, and attention
    runs on tensor cores (FlexAttention, not on autocast's list, would otherwise run the whole layout in fp32)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.grouped = False  # lora.fuse_projections: the projections by lora.grouped_projections
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, attn_mask, past: tuple[torch.Tensor, torch.Tensor] | None):
        """Returns the output and this call's (k, v) [b, kv_heads, T, head_dim] (k after RoPE)."""
        b, T, _ = x.shape
        if self.grouped:  # training's three GEMMs for q, k and v with their factors (lora.grouped_projections)
            q, k, v = grouped_projections((self.q_proj, self.k_proj, self.v_proj), x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, T, self.heads, self.head_dim)
        k = k.view(b, T, self.kv_heads, self.head_dim)
        v = v.view(b, T, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        if isinstance(past, StaticKV):
            k_all, v_all = past.extend(k, v)
        else:
            k_all, v_all = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        if isinstance(attn_mask, BlockMask):  # training's block-sparse masks (objective.py): the same attention
            out = block_sparse_attention(q.to(k_all.dtype), k_all, v_all, attn_mask, self.heads != self.kv_heads)
        elif T == 1 and isinstance(past, StaticKV):  # a decode step over a static cache (distill.greedy_static)
            out = single_query_attention(q, k_all, v_all, attn_mask)
        else:
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attn_mask[:, None], enable_gqa=self.heads != self.kv_heads)
        out = out.transpose(1, 2).reshape(b, T, -1)
        return (grouped_projections((self.o_proj,), out)[0] if self.grouped else self.o_proj(out)), (k, v)


# The kernels single_query_attention may use. cuDNN is left out: it builds an execution plan for every new
# shape and set of strides, and each batch's cache capacity brings new strides; the memory-efficient kernel
# needs none. (A CPU model runs the CPU flash kernel or the math one, as without this list.)
DECODE_ATTENTION = (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)


def single_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
    """Attention of one query per row, q [b, heads, 1, d], over k/v [b, kv_heads, S, d] with a bool mask [b, 1, S].

    Each KV head's group of query heads becomes that head's query rows, which is the attention enable_gqa computes.
    The memory-efficient kernel takes a mask but not GQA, and SDPA's math fallback for GQA copies the cache once
    per query head: a large batch's decode step would read its whole cache several times over.
    """
    b, heads, _, d = q.shape
    grouped = q.reshape(b, k.shape[1], heads // k.shape[1], d)
    with sdpa_kernel(list(DECODE_ATTENTION)):
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=attn_mask[:, None])
    return out.reshape(b, heads, 1, d)


_compiled_flex = None
# FlexAttention's kernel options on a GPU (e.g. {"BLOCK_M": 64, "BLOCK_N": 64}: the forward's tile), set by the
# trainer from --flex-block; empty: the compiler's defaults.
FLEX_KERNEL_OPTIONS: dict[str, int] = {}


def block_sparse_attention(q, k, v, block_mask: BlockMask, gqa: bool) -> torch.Tensor:
    """FlexAttention over the tiles `block_mask` keeps: compiled into one fused kernel on a GPU (the only place
    it is fast and has a backward), the unfused reference elsewhere."""
    global _compiled_flex
    if q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask, enable_gqa=gqa)
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options=FLEX_KERNEL_OPTIONS or None)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.grouped = False  # lora.fuse_projections

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grouped:
            gate, up = grouped_projections((self.gate_proj, self.up_proj), x)
            return grouped_projections((self.down_proj,), F.silu(gate) * up)[0]
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, attn_mask, past):
        attended, kv = self.self_attn(self.input_layernorm(x), cos, sin, attn_mask, past)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), kv


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # An explicit (empty) weight skips nn.Embedding's random init: models are always loaded from a
        # checkpoint, and normal_ on the meta device imports torch._dynamo, seconds per process.
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, _weight=torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class KVCache:
    """Keys/values of committed tokens, per layer [b, kv_heads, length, head_dim]."""

    def __init__(self, num_layers: int) -> None:
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.length = 0

    def append(self, new: list[tuple[torch.Tensor, torch.Tensor]], count: int) -> None:
        """Keep the first `count` positions of a forward's keys/values (its commit part)."""
        if count == 0:
            return
        for i, (k, v) in enumerate(new):
            k, v = k[:, :, :count], v[:, :, :count]
            past = self.layers[i]
            self.layers[i] = (k, v) if past is None else (torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2))
        self.length += count


class StaticKV:
    """One layer's keys/values in preallocated buffers [b, kv_heads, capacity, head_dim]: a forward writes its
    tokens' keys/values after the `length` kept ones and attends to all of them, without copying the past
    (KVCache concatenates, which costs a copy of the whole cache per forward).

    With the owner's `write_slots` set (a device tensor of T slot indices), a forward writes its T tokens' keys
    and values at those slots and attends to the cache's first `span` slots, whatever they hold: the caller's
    mask says which count. Nothing then depends on a host-side length, so a decode step keeps its shapes and
    addresses from one token to the next and can be replayed from a CUDA graph (distill.greedy_static)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, owner: "StaticCache") -> None:
        # The owner by a weak proxy: a strong one would make a cycle (owner.layers -> self -> owner) that only
        # the cyclic collector frees, so a loop of large batches (distill) held every earlier batch's cache.
        self.k, self.v, self.owner = k, v, weakref.proxy(owner)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = self.owner.write_slots
        if slots is not None:
            self.k.index_copy_(2, slots, k.to(self.k.dtype))
            self.v.index_copy_(2, slots, v.to(self.v.dtype))
            span = self.owner.span
            return self.k[:, :, :span], self.v[:, :, :span]
        n, T = self.owner.length, k.shape[2]
        if n + T > self.k.shape[2]:
            raise A2DError(f"static KV cache: {n + T} positions exceed its capacity of {self.k.shape[2]}")
        self.k[:, :, n : n + T] = k
        self.v[:, :, n : n + T] = v
        return self.k[:, :, : n + T], self.v[:, :, : n + T]


class StaticCache:
    """KVCache's interface over StaticKV buffers: `append` keeps a forward's first `count` positions; `write_slots`
    and `span` switch its layers to writing at device-tensor slots (StaticKV)."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device, dtype) -> None:
        shape = (batch, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.length = 0
        self.write_slots: torch.Tensor | None = None
        self.span = capacity
        # Zeros, not empty: a forward at write_slots reads every slot of its span, and a masked-out slot adds
        # nothing only when its key and value are finite (an unwritten NaN would survive the mask: NaN x 0 = NaN).
        self.layers = [StaticKV(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype), self)
                       for _ in range(cfg.num_layers)]

    def append(self, new, count: int) -> None:
        self.length += count


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.row_gate = RowGate()  # read by a row adapter's hooks (lora.py), when it has one
        # How a window row holding a real token attends ("mask", "window"; docs/decoding.md): the row adapter's rule,
        # or the window rule's (a model without factors); None: like every window row.
        self.attention_rule: str | None = None
        self.mask_token_id: int | None = None  # the mask token (the mask adapter's rows, the window rule's masked rows)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attn_mask: torch.Tensor,
        cache: KVCache | None = None,
        hidden_states_out: list[torch.Tensor] | None = None,
        window_rows: torch.Tensor | bool | None = None,
        adapter: bool = True,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """input_ids/position_ids [b, T]; attn_mask bool [b, T, S] (True = may attend), S = cached + T, or a
        FlexAttention BlockMask of the same shape.

        Returns the final-normed hidden states [b, T, hidden] and each layer's (k, v) for the T tokens.
        `hidden_states_out`, when given, receives the residual stream entering each layer and leaving the
        last one (num_layers + 1 tensors), for golden files and debugging. With a row adapter, its rows take
        it: the rows holding the mask token (mask adapter), or `window_rows` (window adapter: a bool [b, T],
        True for every row, or None for none); `adapter` False: no row takes it (training's clean stream, which runs
        the base and holds no mask token: the same numbers without the adapter's products on its rows). The gate
        keeps them until the next forward, so a checkpointed layer recomputes the same rows in backward.
        """
        cfg = self.config
        if not adapter:
            self.row_gate.rows = None
        elif self.attention_rule == "mask":
            self.row_gate.rows = (input_ids == self.mask_token_id)[..., None].float()
        elif self.attention_rule == "window":
            self.row_gate.rows = window_rows[..., None].float() if isinstance(window_rows, torch.Tensor) else (window_rows or None)
        else:
            self.row_gate.rows = None
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta)
        new_kv = []
        for i, layer in enumerate(self.model.layers):
            if hidden_states_out is not None:
                hidden_states_out.append(x)
            x, kv = layer(x, cos, sin, attn_mask, None if cache is None else cache.layers[i])
            new_kv.append(kv)
        if hidden_states_out is not None:
            hidden_states_out.append(x)
        return self.model.norm(x), new_kv

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight)


def causal_mask(length: int, cached: int = 0, device=None) -> torch.Tensor:
    """[length, cached + length]: token i attends to every cached token and to current tokens <= i."""
    cols = torch.arange(cached + length, device=device)
    return cols[None, :] <= cached + torch.arange(length, device=device)[:, None]


def block_causal_mask(cached: int, commit: int, window: int, device=None, revealed: Sequence[bool] | None = None,
                      rule: str = "mask") -> torch.Tensor:
    """[commit + window, cached + commit + window] for one decoding forward (docs/decoding.md).

    Commit rows are plain causal; window rows see every cached and committed position and the whole
    window (bidirectional inside the current block). An attention `rule` (a row adapter's or the window rule's), given `revealed` (one flag per
    window position: it holds a real token), changes what the window rows holding a real token see:
    "mask", the cached and committed positions and the revealed window positions at or before it;
    "window", the cached and committed positions and every revealed window position, on both sides.
    """
    mask = causal_mask(commit + window, cached, device)
    mask[commit:, :] = True
    if revealed is not None:
        rev = torch.tensor(list(revealed), dtype=torch.bool, device=device)
        j = torch.arange(window, device=device)
        seen = rev[None, :] & (j[None, :] <= j[:, None]) if rule == "mask" else rev[None, :].expand(window, window)
        mask[commit:, cached + commit :] = torch.where(rev[:, None], seen | torch.eye(window, dtype=torch.bool, device=device), True)
    return mask


class BlockForward:
    """The decoder's ForwardFn over a Transformer: (commit, window, rows) -> fp32 logits rows, with a KV cache."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.cache = KVCache(model.config.num_layers)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def __call__(self, commit_ids: Sequence[int], window_ids: Sequence[int], rows: Sequence[int]) -> torch.Tensor:
        n, C, W = self.cache.length, len(commit_ids), len(window_ids)
        ids = torch.tensor([list(commit_ids) + list(window_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(n, n + C + W, device=self.device)[None]
        rule = self.model.attention_rule
        revealed = None if rule is None else [t != self.model.mask_token_id for t in window_ids]
        mask = block_causal_mask(n, C, W, self.device, revealed, rule or "mask")[None]
        window_rows = torch.arange(C + W, device=self.device)[None] >= C
        hidden, new_kv = self.model(ids, positions, mask, self.cache, window_rows=window_rows)
        self.cache.append(new_kv, C)
        return self.model.logits(hidden[0, list(rows)]).float()


class BatchBlockForward:
    """BlockForward for many sequences at once (decode.BatchForwardFn): one call takes every sequence's
    (commit, window, rows) request (None for a finished one) and returns each its fp32 logits rows as a
    numpy array, from one forward of the whole batch.

    Each sequence keeps its own logical KV cache and positions; they share one padded cache. A call lays
    row r out as [its commit, padded to the batch's longest commit | its window, padded likewise]; the
    commit part (pads included) is appended to the cache, and `valid` records which cache slots hold a
    real token of that row. The attention mask is the block-causal mask of docs/decoding.md over the
    row's valid slots: a row never sees another row's tokens or its own pads, so its logits are those of
    decoding it alone, up to fp32 summation order. Pad queries attend to themselves only (finite values,
    never read). Finished rows are dropped from the batch when they are a quarter of it or more, and
    cache slots no remaining row uses are trimmed then.
    """

    def __init__(self, model: Transformer, batch: int, pad_id: int = 0) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.pad_id = pad_id
        self.cache = KVCache(model.config.num_layers)
        self.valid = np.zeros((batch, 0), dtype=bool)  # [rows, cache slots]
        self.lengths = np.zeros(batch, dtype=np.int64)  # each row's logical cache length (its next position)
        self.row_of = list(range(batch))  # sequence index -> row in the batch tensors (-1: dropped)
        self.forwards = 0

    def _compact(self, active: list[int]) -> None:
        keep = [self.row_of[i] for i in active]
        used = self.valid[keep].any(axis=0)
        rows = torch.tensor(keep, device=self.device)
        cols = torch.tensor(np.flatnonzero(used), device=self.device)
        self.cache.layers = [
            None if layer is None else (layer[0][rows][:, :, cols], layer[1][rows][:, :, cols]) for layer in self.cache.layers
        ]
        self.cache.length = int(used.sum())
        self.valid = self.valid[keep][:, used]
        self.lengths = self.lengths[keep]
        self.row_of = [-1] * len(self.row_of)
        for r, i in enumerate(active):
            self.row_of[i] = r

    @torch.no_grad()
    def __call__(self, requests: Sequence) -> list:
        active = [i for i, request in enumerate(requests) if request is not None]
        if not active:
            return [None] * len(requests)
        rows_now = self.valid.shape[0]
        if rows_now - len(active) >= max(1, rows_now // 4):
            self._compact(active)
        R, S = self.valid.shape
        C = np.zeros(R, dtype=np.int64)
        W = np.zeros(R, dtype=np.int64)
        for i in active:
            commit, window = requests[i][:2]
            C[self.row_of[i]], W[self.row_of[i]] = len(commit), len(window)
        Cm, Wm = int(C.max()), int(W.max())
        T = Cm + Wm
        ids = np.full((R, T), self.pad_id, dtype=np.int64)
        positions = np.zeros((R, T), dtype=np.int64)
        for i in active:
            commit, window = requests[i][:2]
            r, c, w = self.row_of[i], len(commit), len(window)
            ids[r, :c], ids[r, Cm : Cm + w] = commit, window
            positions[r, :c] = self.lengths[r] + np.arange(c)
            positions[r, Cm : Cm + w] = self.lengths[r] + c + np.arange(w)
        q = np.arange(T)
        commit_q = q[None, :] < C[:, None]  # [R, T]: query (and key) slot t is a real commit token
        window_q = (q[None, :] >= Cm) & (q[None, :] - Cm < W[:, None])
        real = commit_q | window_q
        mask = np.zeros((R, T, S + T), dtype=bool)
        mask[:, :, :S] = self.valid[:, None, :] & real[:, :, None]
        causal = q[None, :] <= q[:, None]  # [T(query), T(key)]
        new = mask[:, :, S:]
        new |= commit_q[:, :, None] & commit_q[:, None, :] & causal[None]  # commit rows: plain causal
        rule = self.model.attention_rule
        if rule is None:
            new |= window_q[:, :, None] & real[:, None, :]  # window rows: every commit token and the whole window
        else:  # the model's attention rule: masked rows as above; revealed rows over the revealed ones (mask: causally)
            masked_q = window_q & (ids == self.model.mask_token_id)
            revealed_q = window_q & ~masked_q
            new |= masked_q[:, :, None] & real[:, None, :]
            seen = revealed_q[:, None, :] & causal[None] if rule == "mask" else revealed_q[:, None, :]
            new |= revealed_q[:, :, None] & (commit_q[:, None, :] | seen)
        new |= ~real[:, :, None] & np.eye(T, dtype=bool)[None]  # pads: themselves only
        hidden, new_kv = self.model(
            torch.from_numpy(ids).to(self.device),
            torch.from_numpy(positions).to(self.device),
            torch.from_numpy(mask).to(self.device),
            self.cache,
            window_rows=torch.from_numpy(window_q).to(self.device),
        )
        self.cache.append(new_kv, Cm)
        self.valid = np.concatenate([self.valid, commit_q[:, :Cm]], axis=1)
        self.lengths = self.lengths + C
        self.forwards += 1
        pick_rows, pick_slots, counts = [], [], []
        for i in active:
            commit, _, wanted = requests[i][:3]
            c = len(commit)
            pick_rows += [self.row_of[i]] * len(wanted)
            pick_slots += [j if j < c else Cm + j - c for j in wanted]
            counts.append(len(wanted))
        # (A forward may want no logits at all: every sequence only commits its last block.)
        index = [torch.tensor(v, dtype=torch.long, device=self.device) for v in (pick_rows, pick_slots)]
        picked = hidden[index[0], index[1]]
        logits = self.model.logits(picked).float().cpu().numpy()
        out: list = [None] * len(requests)
        start = 0
        for i, n in zip(active, counts):
            out[i] = logits[start : start + n]
            start += n
        return out


def load_transformer(model_dir: Path | str, device: str = "cpu") -> tuple[Transformer, ModelConfig, A2DSection | None]:
    """A model folder (a2d or plain AR base) as an fp32 Transformer in eval mode, checked against its config
    (FP8 weights dequantized)."""
    model_dir = Path(model_dir)
    cfg, a2d, _ = load_config(model_dir)
    state = load_checked(model_dir, cfg, a2d)
    with torch.device("meta"):
        model = Transformer(cfg)
        if a2d is not None and a2d.adapter is not None:
            for _, module in target_modules(model, a2d.adapter.targets):
                add_row_factors(module, a2d.adapter.factor_names, a2d.adapter.rank, model.row_gate, 1.0)
        if a2d is not None:
            model.attention_rule = a2d.attention_rule
            model.mask_token_id = a2d.mask_token_id
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(device).eval(), cfg, a2d
