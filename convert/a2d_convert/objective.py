"""The block-diffusion training objective: batches in the [clean | noisy ...] layout, their attention mask,
and the loss module. The design and the equation are in train.py's docstring.

The attention mask is one function of per-row facts (`layout_mask`): each row's segment, its noisy block
(or none: a clean row) and how many clean rows it may see. It is evaluated densely (a boolean tensor, the
reference path every test compares with) or handed to FlexAttention as a block-sparse `BlockMask`, which
skips the tiles no row sees: the same mask either way (a test holds the two to each other).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import lora as lora_mod
from .errors import A2DError
from .train_config import TrainConfig


# --------------------------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """Where every row of one packed row's forward sits: the clean stream's L rows, then each noisy copy's
    blocks. A noisy block is the block's B positions, preceded by its anchor (the position before it) when
    `anchor_rows` (the window adapter's window, docs/decoding.md). Rows of a block are in position order."""

    L: int
    B: int
    noisy_copies: int
    anchor_rows: bool

    @property
    def block_rows(self) -> int:
        return self.B + (1 if self.anchor_rows else 0)

    @property
    def copy_rows(self) -> int:
        return self.L // self.B * self.block_rows

    @property
    def rows(self) -> int:
        return self.L + self.noisy_copies * self.copy_rows

    def noisy_row(self, copy: int, position: np.ndarray) -> np.ndarray:
        """The row (of the R rows) of `position`'s slot in noisy copy `copy` (1-based)."""
        block, j = np.divmod(position, self.B)
        return self.L + (copy - 1) * self.copy_rows + block * self.block_rows + j + (1 if self.anchor_rows else 0)

    def predictor_row(self, copy: int, position: np.ndarray, shift: bool) -> np.ndarray:
        """The row whose hidden state predicts `position` in copy `copy`: without the shift its own slot; with
        it the row before: the anchor row (`anchor_rows`), the clean row p-1 for a block's first position, or
        the previous slot."""
        if not shift:
            return self.noisy_row(copy, position)
        if self.anchor_rows:
            return self.noisy_row(copy, position) - 1
        first = position % self.B == 0
        return np.where(first, position - 1, self.noisy_row(copy, position) - 1)

    def static_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: the position it holds, its block id (-1 for clean rows; one id per copy and block) and the
        clean rows it may see (rows below that index): clean row i sees up to itself, a noisy block the clean
        rows before its first position, or before its anchor (whose clean row decoding has not committed yet)."""
        L, B, n = self.L, self.B, self.block_rows
        position = np.arange(L)
        block_id = np.full(L, -1)
        limit = np.arange(1, L + 1)
        for copy in range(self.noisy_copies):
            blocks = np.repeat(np.arange(L // B), n)
            slot = np.tile(np.arange(n), L // B) - (1 if self.anchor_rows else 0)
            position = np.concatenate([position, blocks * B + slot])
            block_id = np.concatenate([block_id, copy * (L // B) + blocks])
            limit = np.concatenate([limit, blocks * B - (1 if self.anchor_rows else 0)])
        return position, block_id, limit


def layout_mask(row_seg, row_block, row_limit, real, rule, b, q, k):
    """May row q attend to row k (both indices into the layout's rows, broadcastable tensors), in packed row
    b? Rows of one segment only (segment 0 and -1, an unused slot or an anchor the block has not got, see only
    themselves). A clean row: the clean rows of its segment up to itself. A noisy row: the clean rows before
    its limit and the rows of its own block, all of them, or under a row adapter's `rule` (docs/decoding.md)
    for a row holding a real token: "mask", the real rows at or before it; "window", every real row."""
    seg_q, seg_k = row_seg[b, q], row_seg[b, k]
    same = (seg_q == seg_k) & (seg_q > 0)
    key_clean = row_block[k] < 0
    clean = key_clean & same & (k < row_limit[q])
    block = ~key_clean & (row_block[k] == row_block[q]) & same
    if rule == "mask":
        block = block & (~real[b, q] | (real[b, k] & (k <= q)))
    elif rule == "window":
        block = block & (~real[b, q] | real[b, k])
    return clean | block | (q == k)


@dataclass
class Batch:
    """One micro-batch, host side (numpy); trainer.to_device moves it to the GPU."""

    input_ids: np.ndarray  # [b, R] int64, R = layout rows
    position_ids: np.ndarray  # [b, R] int64
    segment_ids: np.ndarray  # [b, L] int64
    row_seg: np.ndarray  # [b, R] int64: each row's segment (layout_mask)
    pred_index: np.ndarray  # [N] rows of the flattened [b*R] hidden states that predict targets
    targets: np.ndarray  # [N]
    weights: np.ndarray  # [N] float32
    teacher_index: np.ndarray  # [N] rows of the flattened clean [b*L] stream (the AR base's predictor)
    ar_index: np.ndarray  # [M] clean-stream predictor rows for the optional AR loss
    ar_targets: np.ndarray  # [M]
    clean_index: np.ndarray  # [C] every in-sample row of the clean stream, flattened [b*R] (clean KL)
    clean_teacher_index: np.ndarray  # [C] the same rows in the flattened clean [b*L] stream
    eligible: int  # target positions in this micro-batch (the normaliser's share)
    attended: tuple[int, int]  # (query, key) pairs the mask allows, the clean rows' and the noisy rows' (for the FLOPs)


def segment_positions(segment_ids: np.ndarray) -> np.ndarray:
    """Position ids restarting at 0 at each segment start (unused slots count too, harmlessly)."""
    b, L = segment_ids.shape
    idx = np.broadcast_to(np.arange(L), (b, L))
    starts = np.ones((b, L), dtype=bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_index = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return (idx - start_index).astype(np.int32)


def block_masks(cfg: TrainConfig, rng: np.random.Generator, L: int, confidence: np.ndarray | None = None,
                t_max: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(masked [L] bool, t [L]: the block's mask rate) of one packed row, by `cfg.mask_pattern`: "random", each
    position of a block masked with the block's rate t ~ U[t_min, t_max]; "full", every position; "decoder",
    half the blocks as "random" and half in the state a sliding window meets (its first position masked, the
    others masked with the block's rate), the complementary copy then giving the revealed-prefix states of a
    block that moves only when finished; "teacher", half the blocks as "random" and half in the state a decoder
    reaches by revealing what it is surest of first (d3LLM's teacher-order masking, with the AR base's probability
    of each distilled token, `confidence`, as the order): the first position masked as a sliding window's is, and
    of the others the round(t B) - 1 the base was least sure of (ties at random); blocks without the base's
    probabilities (other corpora, prompts) stay "random". Then cfg.full_share of the blocks are wholly masked
    (rate 1), the state reveal_order prefix meets at every step. `t_max` (the curriculum's current top) replaces
    cfg.t_max."""
    B = cfg.block_size
    if cfg.mask_pattern == "full":
        return np.ones(L, dtype=bool), np.ones(L)
    top = cfg.t_max if t_max is None else t_max
    t_block = cfg.t_min + (top - cfg.t_min) * rng.random(L // B)
    t = np.repeat(t_block, B)
    masked = rng.random(L) < t
    if cfg.mask_pattern == "decoder":
        sliding = np.repeat(rng.random(L // B) < 0.5, B) & (np.arange(L) % B == 0)
        masked |= sliding
    elif cfg.mask_pattern == "teacher" and confidence is not None:
        conf = confidence.astype(np.float64).reshape(L // B, B)
        ordered = (rng.random(L // B) < 0.5) & np.isfinite(conf).all(axis=1)
        # Rank each block's later positions by the base's probability, lowest first (a random key breaks ties).
        rest = np.lexsort((rng.random((L // B, B - 1)), conf[:, 1:]), axis=1)
        count = np.clip(np.rint(t_block * B).astype(np.int64) - 1, 0, B - 1)
        teacher = np.zeros((L // B, B), dtype=bool)
        teacher[:, 0] = True
        block, rank = np.nonzero(np.arange(B - 1)[None, :] < count[:, None])  # each block's `count` least sure
        teacher[block, 1 + rest[block, rank]] = True
        masked = np.where(np.repeat(ordered, B), teacher.reshape(L), masked)
    if cfg.full_share > 0:
        full = np.repeat(rng.random(L // B) < cfg.full_share, B)
        masked = masked | full
        t = np.where(full, 1.0, t)
    return masked, t


def curriculum_t_max(cfg: TrainConfig, step: int) -> float:
    """The mask-rate curriculum's top at optimizer step `step` (d3LLM's progressive mask ratio): from
    cfg.t_max_start up to cfg.t_max, linearly over cfg.curriculum_steps (0: the whole schedule); without a
    curriculum (t_max_start < 0), cfg.t_max."""
    if cfg.t_max_start < 0:
        return cfg.t_max
    span = cfg.curriculum_steps or cfg.max_steps
    return cfg.t_max_start + (cfg.t_max - cfg.t_max_start) * min(1.0, step / max(1, span))


class RowSchedule:
    """Which rows each optimizer step uses (epoch permutations of a seed) and the masks of each slot."""

    def __init__(self, arrays: dict[str, np.ndarray], config: TrainConfig, mask_token_id: int):
        self.input_ids = arrays["input_ids"]
        self.loss_mask = arrays["loss_mask"].astype(bool)
        self.segment_ids = arrays["segment_ids"]
        self.positions = segment_positions(self.segment_ids)
        # A target needs a predictor inside its own sample: never the first token of a sample.
        self.eligible = self.loss_mask & (self.segment_ids > 0) & (self.positions > 0)
        self.confidence = arrays.get("confidence")
        if config.mask_pattern == "teacher" and self.confidence is None:
            raise A2DError("--mask-pattern teacher orders masks by the base's probability of each distilled token, and "
                           "this data has none: build it with a self-distillation source (`data --source "
                           "PROMPTS,kind=distill,...`, greedy), or use --mask-pattern decoder")
        self.config = config
        self.mask_token_id = mask_token_id
        self.rows = self.input_ids.shape[0]
        L = self.input_ids.shape[1]
        self.layout = Layout(L, config.block_size, 2 if config.complementary else 1, config.attention_rule == "window")
        self.row_position, self.row_block, self.row_limit = self.layout.static_rows()
        self._perms: dict[int, np.ndarray] = {}

    def row_of(self, step: int, slot: int) -> int:
        k = step * self.config.batch_rows + slot
        epoch, offset = divmod(k, self.rows)
        if epoch not in self._perms:
            # A step can straddle two epochs: keep the latest two permutations.
            self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = np.random.default_rng([self.config.seed, epoch]).permutation(self.rows)
        return int(self._perms[epoch][offset])

    def global_eligible(self, step: int) -> int:
        rows = [self.row_of(step, s) for s in range(self.config.batch_rows)]
        return int(self.eligible[rows].sum())

    def batch(self, step: int, slots: list[int]) -> Batch:
        cfg, layout = self.config, self.layout
        rows = [self.row_of(step, s) for s in slots]
        ids = self.input_ids[rows].astype(np.int64)
        seg = self.segment_ids[rows].astype(np.int64)
        pos = self.positions[rows].astype(np.int64)
        eligible = self.eligible[rows]
        b, L = ids.shape
        R = layout.rows
        masked = np.empty((b, L), dtype=bool)
        t = np.empty((b, L), dtype=np.float64)
        top = curriculum_t_max(cfg, step)
        for r, slot in enumerate(slots):
            confidence = None if self.confidence is None else self.confidence[rows[r]]
            masked[r], t[r] = block_masks(cfg, np.random.default_rng([cfg.seed, step, slot, 1]), L, confidence, top)

        # Every row's token, position and segment: a noisy slot reads its position's, an anchor row the
        # position before its block (-1 as its segment when that position lies in another sample).
        at = np.clip(self.row_position, 0, L - 1)
        input_ids = ids[:, at].copy()
        position_ids = pos[:, at].copy()
        row_seg = seg[:, at].copy()
        for c in range(1, layout.noisy_copies + 1):
            masked_c = masked if c == 1 else ~masked
            slots_c = layout.noisy_row(c, np.arange(L))
            input_ids[:, slots_c] = np.where(masked_c, self.mask_token_id, ids)
        if layout.anchor_rows:
            anchors = np.flatnonzero(self.row_block >= 0)[:: layout.block_rows]
            first = self.row_position[anchors] + 1  # the block's first position
            own = (self.row_position[anchors] >= 0)[None, :] & (seg[:, at[anchors]] == seg[:, first])
            row_seg[:, anchors] = np.where(own, row_seg[:, anchors], -1)

        preds, targets, weights, teacher = [], [], [], []
        for c in range(1, layout.noisy_copies + 1):
            masked_c = masked if c == 1 else ~masked
            rate = t if c == 1 else 1.0 - t
            r_idx, p_idx = np.nonzero(eligible & masked_c)
            preds.append(r_idx * R + layout.predictor_row(c, p_idx, cfg.shift_logits))
            targets.append(ids[r_idx, p_idx])
            w = 1.0 / rate[r_idx, p_idx] if cfg.loss_weighting == "elbo" else np.ones(len(r_idx))
            if cfg.anchor_weight != 1.0:
                w = w * np.where(leftmost_masked(masked_c, cfg.block_size)[r_idx, p_idx], cfg.anchor_weight, 1.0)
            weights.append(w.astype(np.float32))
            teacher.append(r_idx * L + p_idx - 1)
        if cfg.ar_weight > 0:
            r_idx, p_idx = np.nonzero(eligible)
            ar_index, ar_targets = r_idx * R + p_idx - 1, ids[r_idx, p_idx]
        else:
            ar_index = ar_targets = np.zeros(0, dtype=np.int64)
        if cfg.clean_kl_weight > 0:
            r_idx, p_idx = np.nonzero(seg > 0)
            clean_index, clean_teacher_index = r_idx * R + p_idx, r_idx * L + p_idx
        else:
            clean_index = clean_teacher_index = np.zeros(0, dtype=np.int64)
        return Batch(
            input_ids=input_ids,
            position_ids=position_ids,
            segment_ids=seg,
            row_seg=row_seg,
            pred_index=np.concatenate(preds),
            targets=np.concatenate(targets),
            weights=np.concatenate(weights),
            teacher_index=np.concatenate(teacher),
            ar_index=ar_index,
            ar_targets=ar_targets,
            clean_index=clean_index,
            clean_teacher_index=clean_teacher_index,
            eligible=int(eligible.sum()),
            attended=attended_pairs(row_seg, self.row_limit, layout),
        )


def leftmost_masked(masked: np.ndarray, block_size: int) -> np.ndarray:
    """[rows, L] masks (L a multiple of the block size, as the data's rows are) -> where each block's first masked
    position lies (the position a decoder that tops up from the left reveals next, when nothing else is sure)."""
    in_block = masked.reshape(masked.shape[0], -1, block_size)
    return (in_block & (np.cumsum(in_block, axis=2) == 1)).reshape(masked.shape)


def attended_pairs(row_seg: np.ndarray, row_limit: np.ndarray, layout: Layout) -> tuple[int, int]:
    """The (query, key) pairs layout_mask allows, (the clean rows', the noisy rows'), with every block counted
    whole (the rule hides a few of a block's keys from its real rows): the clean rows causally inside their
    segments (an unused slot: itself), every noisy row the clean rows of its segment before its limit, and
    every block's rows each other."""
    L = layout.L
    limits = np.clip(row_limit[L:], 0, L)
    clean_pairs = noisy_pairs = 0
    for clean, noisy in zip(row_seg[:, :L], row_seg[:, L:]):
        _, counts = np.unique(clean[clean > 0], return_counts=True)
        clean_pairs += int((counts * (counts + 1) // 2).sum()) + int((clean <= 0).sum())
        for s in np.unique(noisy[noisy > 0]):
            before = np.concatenate([[0], np.cumsum(clean == s)])
            noisy_pairs += int(before[limits[noisy == s]].sum())
    noisy_pairs += row_seg.shape[0] * layout.noisy_copies * (L // layout.B) * layout.block_rows**2
    return clean_pairs, noisy_pairs


# --------------------------------------------------------------------------------------------- the objective


def causal_segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    L = segment_ids.shape[1]
    idx = torch.arange(L, device=segment_ids.device)
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & (idx[:, None] >= idx[None, :])) | torch.eye(L, dtype=torch.bool, device=segment_ids.device)[None]


def _chunk_terms(head, hidden, targets, weights, valid, teacher_hidden, teacher_head, confidence: bool, temperature: float):
    """Sums over a chunk of target rows: weighted CE, plain CE, KL(teacher || model), and the entropy of
    softmax(logits / temperature) on the rows whose argmax is already the target (the certainty term; 0
    unless `confidence`). `valid` (1 or 0 per row, or None: every row) leaves padding rows out of every sum."""
    logits = head(hidden).float()
    logp = F.log_softmax(logits, dim=-1)
    ce = -logp.gather(1, targets[:, None])[:, 0]
    kl = torch.zeros((), device=hidden.device)
    if teacher_hidden is not None:
        with torch.no_grad():
            t_logp = F.log_softmax(teacher_head(teacher_hidden).float(), dim=-1)
        row_kl = (t_logp.exp() * (t_logp - logp)).sum(-1)
        kl = (row_kl if valid is None else row_kl * valid).sum()
    certainty = torch.zeros((), device=hidden.device)
    if confidence:
        soft = logp if temperature == 1.0 else F.log_softmax(logits / temperature, dim=-1)
        entropy = -(soft.exp() * soft).sum(-1) * (logp.detach().argmax(-1) == targets)
        certainty = (entropy if valid is None else entropy * valid).sum()
    plain = ce.detach()
    return (weights * ce).sum(), (plain if valid is None else plain * valid).sum(), kl, certainty


def chunked_terms(head, hidden, index, targets, weights, teacher_hidden=None, teacher_index=None, teacher_head=None, chunk=4096,
                  confidence=False, temperature=1.0, terms=None):
    """Sums of `_chunk_terms` (or `terms`, its compiled form) over chunks of target rows; each chunk is
    checkpointed so its [rows, vocab] logits live only while that chunk is computed (forward and backward).
    With `terms` every chunk is `chunk` rows, the last one padded with rows of weight 0 left out of every sum:
    one shape, so the compiled function never recompiles mid-run. (It did once per new row count: a last chunk
    of one row is a shape of its own, and its compile stalled a run for ten minutes, bench/NOTES.md run 117.)"""
    terms_fn = terms or _chunk_terms
    totals = [torch.zeros((), device=hidden.device) for _ in range(4)]
    for start in range(0, index.numel(), chunk):
        sl = slice(start, start + chunk)
        rows, t_idx, tgt, w, valid = index[sl], None if teacher_index is None else teacher_index[sl], targets[sl], weights[sl], None
        if terms is not None:
            n = rows.numel()
            pad = chunk - n
            valid = torch.ones(chunk, device=hidden.device)
            if pad:
                valid[n:] = 0
                rows, tgt = F.pad(rows, (0, pad)), F.pad(tgt, (0, pad))
                w = F.pad(w, (0, pad))
                t_idx = None if t_idx is None else F.pad(t_idx, (0, pad))
        t_rows = None if teacher_hidden is None else teacher_hidden[t_idx]
        terms_out = torch.utils.checkpoint.checkpoint(
            terms_fn, head, hidden[rows], tgt, w, valid, t_rows, teacher_head, confidence, temperature,
            use_reentrant=False,
        )
        totals = [a + b for a, b in zip(totals, terms_out)]
    return totals


def use_flex(config: TrainConfig, device: torch.device) -> bool:
    return config.attention == "flex" or (config.attention == "auto" and device.type == "cuda")


class Objective(nn.Module):
    """The student model and the block-diffusion loss in one module, so that under FSDP2 the root unit
    owns the embedding/lm_head used by the loss (gathered once per forward, not once per chunk)."""

    def __init__(self, model: nn.Module, config: TrainConfig, teacher: nn.Module | None, layout: Layout | None = None):
        super().__init__()
        self.model = model
        self.config = config
        self.layout = layout
        # A list hides the frozen teacher from .parameters()/state_dict(): it is neither trained nor saved.
        self._teacher = [teacher]
        self._rows: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._mask_mods: dict[tuple, tuple] = {}
        self.terms = None  # the loss chunks' function: None for `_chunk_terms` as it is; compile_terms() fuses it

    def compile_terms(self) -> None:
        """The loss chunks through torch.compile: the log-softmaxes, the KL and the certainty entropy over a
        chunk's [rows, vocab] logits fused into a few passes instead of one kernel (and one fp32 tensor) each.
        Every chunk it sees has the same number of rows (chunked_terms pads the last), so it compiles once.
        The compiler's stride padding is off: with a2d's mask token the vocabulary is odd (49,152 + 1), and the
        padded logits' stride (49,216) then differed between the checkpointed chunk's forward and its recompute,
        which failed the backward's stride check on the GPU (bench/terms_padding_check.py, bench/NOTES.md)."""
        self.terms = torch.compile(_chunk_terms, options={"comprehensive_padding": False})

    def static_rows(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The layout's per-row block ids and clean limits on `device`, made once."""
        if device not in self._rows:
            _, block, limit = self.layout.static_rows()
            # int32: a FlexAttention mask_mod loads them for every element of a partial tile.
            self._rows[device] = (torch.as_tensor(block, dtype=torch.int32, device=device),
                                  torch.as_tensor(limit, dtype=torch.int32, device=device))
        return self._rows[device]

    @property
    def rule(self) -> str | None:
        """The attention rule of the noisy rows holding a real token ("mask", "window"; a row adapter's or the
        window rule's) or None."""
        return getattr(self.model, "attention_rule", None)

    def attention_mask(self, input_ids, row_seg, q_rows: slice, k_rows: int):
        """The layout's mask for queries `q_rows` over keys 0..k_rows-1: a boolean [b, Q, K], or a FlexAttention
        BlockMask on CUDA (TrainConfig.attention)."""
        block, limit = self.static_rows(input_ids.device)
        real = input_ids != self.model.mask_token_id if self.model.mask_token_id is not None else torch.ones_like(input_ids, dtype=torch.bool)
        rule = self.rule
        offset = q_rows.start
        b, Q = input_ids.shape[0], q_rows.stop - q_rows.start
        if use_flex(self.config, input_ids.device):
            from torch.nn.attention.flex_attention import create_block_mask

            mask_mod = self.flex_mask_mod(input_ids, row_seg, real, offset)
            return create_block_mask(mask_mod, b, None, Q, k_rows, device=input_ids.device, _compile=input_ids.is_cuda)
        bi = torch.arange(b, device=input_ids.device)[:, None, None]
        q = torch.arange(offset, q_rows.stop, device=input_ids.device)[None, :, None]
        k = torch.arange(k_rows, device=input_ids.device)[None, None, :]
        return layout_mask(row_seg, block, limit, real, rule, bi, q, k)

    def flex_mask_mod(self, input_ids, row_seg, real, offset: int):
        """layout_mask as a FlexAttention mask_mod for queries from row `offset` on. One function object per (shape,
        offset), reading this micro-batch's row facts from buffers it owns, refilled in place: a compiled flex
        kernel guards on its mask_mod, so a new closure every micro-batch would recompile it each time (and, past
        the recompile limit, fall back to the unfused kernel)."""
        key = (tuple(input_ids.shape), offset, input_ids.device)
        if key not in self._mask_mods:
            block, limit = self.static_rows(input_ids.device)
            seg_buf, real_buf = torch.empty_like(row_seg, dtype=torch.int32), torch.empty_like(real)
            rule = self.rule

            def mask_mod(bi, h, q, k):
                return layout_mask(seg_buf, block, limit, real_buf, rule, bi, q + offset, k)

            self._mask_mods[key] = (mask_mod, seg_buf, real_buf)
        mask_mod, seg_buf, real_buf = self._mask_mods[key]
        seg_buf.copy_(row_seg)
        real_buf.copy_(real)
        return mask_mod

    def teacher_pass(self, ids, seg, pos):
        """(hidden rows, head) of the frozen AR base on the clean stream, or (None, None) without KL.
        With LoRA the base is the student with its adapters off: the lm_head is never adapted."""
        if self.config.kl_weight <= 0 and self.config.clean_kl_weight <= 0:
            return None, None
        teacher = self._teacher[0]
        with torch.no_grad():
            if teacher is None:
                lora_mod.set_enabled(self.model, False)
                try:
                    hidden, _ = self.model(ids, pos, causal_segment_mask(seg))
                finally:
                    lora_mod.set_enabled(self.model, True)
                head = self.model.logits
            else:
                hidden, _ = teacher(ids, pos, causal_segment_mask(seg))
                head = teacher.logits
        return hidden.reshape(-1, hidden.shape[-1]), head

    def split_pass(self, input_ids, position_ids, row_seg):
        """The hidden states of the [clean | noisy ...] layout under an attention rule, in two forwards: the clean
        stream (causal), its keys and values then the noisy copies' cache. The same numbers as one forward of the
        whole layout. For a row adapter without --clean-lora the clean stream runs under no_grad (it is the frozen
        base: no adapter on its rows, so nothing in it needs a gradient), without its backward, its stored
        activations or the adapter's products on its rows (under the mask rule it has no mask token, so they would
        be multiplied by a zero gate). Under the window adapter every noisy row is a window row."""
        from .model import KVCache

        L, R = self.layout.L, self.layout.rows
        # Where the clean stream trains (--clean-lora's all-row LoRA, the window rule's weights), it keeps its graph.
        with contextlib.nullcontext() if self.config.clean_trains else torch.no_grad():
            clean_mask = self.attention_mask(input_ids, row_seg, slice(0, L), L)
            clean, clean_kv = self.model(input_ids[:, :L], position_ids[:, :L], clean_mask, adapter=False)
        cache = KVCache(len(clean_kv))
        cache.append(clean_kv, L)
        noisy_mask = self.attention_mask(input_ids, row_seg, slice(L, R), R)
        noisy, _ = self.model(input_ids[:, L:], position_ids[:, L:], noisy_mask, cache, window_rows=True)
        return torch.cat([clean, noisy], dim=1)

    def forward(self, input_ids, position_ids, segment_ids, row_seg, pred_index, targets, weights, teacher_index, ar_index, ar_targets,
                clean_index, clean_teacher_index):
        cfg = self.config
        L = self.layout.L
        if self.rule is not None:
            hidden = self.split_pass(input_ids, position_ids, row_seg)
        else:
            R = self.layout.rows
            hidden, _ = self.model(input_ids, position_ids, self.attention_mask(input_ids, row_seg, slice(0, R), R))
        if not cfg.clean_trains:
            # The clean stream runs the base exactly (no adapter on its rows, the norms frozen, no mask
            # tokens in it), so it is the KL teacher's own forward: no second pass.
            t_hidden = hidden[:, :L].detach().reshape(-1, hidden.shape[-1]) if cfg.kl_weight > 0 else None
            t_head = self.model.logits
        else:
            t_hidden, t_head = self.teacher_pass(input_ids[:, :L], segment_ids, position_ids[:, :L])
        flat = hidden.reshape(-1, hidden.shape[-1])
        weighted, ce_sum, kl_sum, certainty = chunked_terms(
            self.model.logits, flat, pred_index, targets, weights, t_hidden if cfg.kl_weight > 0 else None, teacher_index,
            t_head, cfg.logits_chunk, confidence=cfg.confidence_weight > 0, temperature=cfg.confidence_temperature,
            terms=self.terms,
        )
        loss = weighted + cfg.kl_weight * kl_sum + cfg.confidence_weight * certainty
        if pred_index.numel() == 0:
            # Every process must run a backward through every parameter (FSDP reduces gradients
            # collectively), even when its rows happen to hold no target.
            loss = loss + 0.0 * self.model.logits(flat[:1]).sum()
        ar_sum = torch.zeros((), device=flat.device)
        if cfg.ar_weight > 0:
            ones = torch.ones(ar_targets.shape, device=flat.device)
            ar_loss, ar_sum, _, _ = chunked_terms(self.model.logits, flat, ar_index, ar_targets, ones, chunk=cfg.logits_chunk,
                                                  terms=self.terms)
            loss = loss + cfg.ar_weight * ar_loss
        clean_kl = torch.zeros((), device=flat.device)
        if cfg.clean_kl_weight > 0:
            # KL(base || model) on every row of the clean stream, prompts included: the plain AR reading of
            # the model held to its base's, so that training on one prompt distribution moves it less.
            none = torch.zeros(clean_index.shape, device=flat.device)
            _, _, clean_kl, _ = chunked_terms(self.model.logits, flat, clean_index, none.long(), none, t_hidden,
                                              clean_teacher_index, t_head, cfg.logits_chunk, terms=self.terms)
            loss = loss + cfg.clean_kl_weight * clean_kl
        return loss, torch.stack([ce_sum, kl_sum.detach(), ar_sum, certainty.detach(), clean_kl.detach()])
