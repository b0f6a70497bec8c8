"""The block-diffusion training objective: batches in the [clean | noisy | noisy] layout, their
attention mask, and the loss module. The design and the equation are in train.py's docstring."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from . import lora as lora_mod
from .train_config import TrainConfig


# --------------------------------------------------------------------------------------------- batches


@dataclass
class Batch:
    """One micro-batch, host side (numpy); trainer.to_device moves it to the GPU."""

    input_ids: np.ndarray  # [b, copies*L] int64
    position_ids: np.ndarray  # [b, copies*L] int64
    segment_ids: np.ndarray  # [b, L] int64
    pred_index: np.ndarray  # [N] rows of the flattened [b*copies*L] hidden states that predict targets
    targets: np.ndarray  # [N]
    weights: np.ndarray  # [N] float32
    teacher_index: np.ndarray  # [N] rows of the flattened clean [b*L] stream (the AR base's predictor)
    ar_index: np.ndarray  # [M] clean-stream predictor rows for the optional AR loss
    ar_targets: np.ndarray  # [M]
    clean_index: np.ndarray  # [C] every in-sample row of the clean stream, flattened [b*copies*L] (clean KL)
    clean_teacher_index: np.ndarray  # [C] the same rows in the flattened clean [b*L] stream
    eligible: int  # target positions in this micro-batch (the normaliser's share)


def segment_positions(segment_ids: np.ndarray) -> np.ndarray:
    """Position ids restarting at 0 at each segment start (unused slots count too, harmlessly)."""
    b, L = segment_ids.shape
    idx = np.broadcast_to(np.arange(L), (b, L))
    starts = np.ones((b, L), dtype=bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    start_index = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return (idx - start_index).astype(np.int32)


class RowSchedule:
    """Which rows each optimizer step uses (epoch permutations of a seed) and the masks of each slot."""

    def __init__(self, arrays: dict[str, np.ndarray], config: TrainConfig, mask_token_id: int):
        self.input_ids = arrays["input_ids"]
        self.loss_mask = arrays["loss_mask"].astype(bool)
        self.segment_ids = arrays["segment_ids"]
        self.positions = segment_positions(self.segment_ids)
        # A target needs a predictor inside its own sample: never the first token of a sample.
        self.eligible = self.loss_mask & (self.segment_ids > 0) & (self.positions > 0)
        self.config = config
        self.mask_token_id = mask_token_id
        self.rows = self.input_ids.shape[0]
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
        cfg = self.config
        B = cfg.block_size
        rows = [self.row_of(step, s) for s in slots]
        ids = self.input_ids[rows].astype(np.int64)
        seg = self.segment_ids[rows].astype(np.int64)
        pos = self.positions[rows].astype(np.int64)
        eligible = self.eligible[rows]
        b, L = ids.shape
        copies = 3 if cfg.complementary else 2
        masked = np.empty((b, L), dtype=bool)
        t = np.empty((b, L), dtype=np.float64)
        for r, slot in enumerate(slots):
            if cfg.mask_pattern == "full":  # every block wholly masked (needs --loss-weighting none)
                masked[r], t[r] = True, 1.0
                continue
            rng = np.random.default_rng([cfg.seed, step, slot, 1])
            t_block = cfg.t_min + (cfg.t_max - cfg.t_min) * rng.random(L // B)
            t[r] = np.repeat(t_block, B)
            masked[r] = rng.random(L) < t[r]
        noisy = [np.where(masked, self.mask_token_id, ids)]
        if cfg.complementary:
            noisy.append(np.where(masked, ids, self.mask_token_id))
        input_ids = np.concatenate([ids, *noisy], axis=1)
        position_ids = np.tile(pos, (1, copies))

        preds, targets, weights, teacher = [], [], [], []
        for c in range(1, copies):
            masked_c = masked if c == 1 else ~masked
            rate = t if c == 1 else 1.0 - t
            r_idx, p_idx = np.nonzero(eligible & masked_c)
            base = r_idx * copies * L
            if cfg.shift_logits:
                first = p_idx % B == 0
                pred = np.where(first, base + p_idx - 1, base + c * L + p_idx - 1)
            else:
                pred = base + c * L + p_idx
            preds.append(pred)
            targets.append(ids[r_idx, p_idx])
            w = 1.0 / rate[r_idx, p_idx] if cfg.loss_weighting == "elbo" else np.ones(len(r_idx))
            weights.append(w.astype(np.float32))
            teacher.append(r_idx * L + p_idx - 1)
        if cfg.ar_weight > 0:
            r_idx, p_idx = np.nonzero(eligible)
            ar_index, ar_targets = r_idx * copies * L + p_idx - 1, ids[r_idx, p_idx]
        else:
            ar_index = ar_targets = np.zeros(0, dtype=np.int64)
        if cfg.clean_kl_weight > 0:
            r_idx, p_idx = np.nonzero(seg > 0)
            clean_index, clean_teacher_index = r_idx * copies * L + p_idx, r_idx * L + p_idx
        else:
            clean_index = clean_teacher_index = np.zeros(0, dtype=np.int64)
        return Batch(
            input_ids=input_ids,
            position_ids=position_ids,
            segment_ids=seg,
            pred_index=np.concatenate(preds),
            targets=np.concatenate(targets),
            weights=np.concatenate(weights),
            teacher_index=np.concatenate(teacher),
            ar_index=ar_index,
            ar_targets=ar_targets,
            clean_index=clean_index,
            clean_teacher_index=clean_teacher_index,
            eligible=int(eligible.sum()),
        )


# --------------------------------------------------------------------------------------------- the objective


def training_attention_mask(segment_ids: torch.Tensor, block: int, copies: int, revealed: torch.Tensor | None = None) -> torch.Tensor:
    """bool [b, copies*L, copies*L] (True = may attend) for the [clean | noisy ...] layout. `revealed`
    [b, copies-1, L] (a mask adapter's rule, model.block_causal_mask): a noisy row whose token is not
    masked sees the clean positions before its block and the unmasked positions of its block at or
    before it."""
    b, L = segment_ids.shape
    idx = torch.arange(L, device=segment_ids.device)
    blk = idx // block
    seg = segment_ids
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
    eye = torch.eye(L, dtype=torch.bool, device=seg.device)[None]
    causal = idx[:, None] >= idx[None, :]
    before_block = idx[None, :] < (blk * block)[:, None]
    same_block = blk[:, None] == blk[None, :]
    clean_clean = (same & causal) | eye
    noisy_clean = same & before_block
    noisy_noisy = (same & same_block) | eye
    mask = torch.zeros(b, copies * L, copies * L, dtype=torch.bool, device=seg.device)
    mask[:, :L, :L] = clean_clean
    for c in range(1, copies):
        rows = slice(c * L, (c + 1) * L)
        mask[:, rows, :L] = noisy_clean
        if revealed is None:
            mask[:, rows, rows] = noisy_noisy
        else:
            rev = revealed[:, c - 1]
            causal_revealed = (same & same_block & causal & rev[:, None, :]) | eye
            mask[:, rows, rows] = torch.where(rev[:, :, None], causal_revealed, noisy_noisy)
    return mask


def objective_mask(model: nn.Module, input_ids: torch.Tensor, segment_ids: torch.Tensor, block: int) -> torch.Tensor:
    """The training mask for this model: with a mask adapter, its rule for the noisy copies' unmasked rows."""
    b, L = segment_ids.shape
    copies = input_ids.shape[1] // L
    token = getattr(model, "mask_rows_token", None)
    revealed = None if token is None else (input_ids[:, L:] != token).view(b, copies - 1, L)
    return training_attention_mask(segment_ids, block, copies, revealed)


def causal_segment_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    L = segment_ids.shape[1]
    idx = torch.arange(L, device=segment_ids.device)
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & (idx[:, None] >= idx[None, :])) | torch.eye(L, dtype=torch.bool, device=segment_ids.device)[None]


def _chunk_terms(head, hidden, targets, weights, teacher_hidden, teacher_head, confidence: bool):
    """Sums over a chunk of target rows: weighted CE, plain CE, KL(teacher || model), and the entropy of
    the rows whose argmax is already the target (the certainty term; 0 unless `confidence`)."""
    logp = F.log_softmax(head(hidden).float(), dim=-1)
    ce = -logp.gather(1, targets[:, None])[:, 0]
    kl = torch.zeros((), device=hidden.device)
    if teacher_hidden is not None:
        with torch.no_grad():
            t_logp = F.log_softmax(teacher_head(teacher_hidden).float(), dim=-1)
        kl = (t_logp.exp() * (t_logp - logp)).sum()
    certainty = torch.zeros((), device=hidden.device)
    if confidence:
        entropy = -(logp.exp() * logp).sum(-1)
        certainty = (entropy * (logp.detach().argmax(-1) == targets)).sum()
    return (weights * ce).sum(), ce.detach().sum(), kl, certainty


def chunked_terms(head, hidden, index, targets, weights, teacher_hidden=None, teacher_index=None, teacher_head=None, chunk=4096, confidence=False):
    """Sums of `_chunk_terms` over chunks of target rows; each chunk is checkpointed so its [rows, vocab]
    logits live only while that chunk is computed (forward and backward)."""
    totals = [torch.zeros((), device=hidden.device) for _ in range(4)]
    for start in range(0, index.numel(), chunk):
        sl = slice(start, start + chunk)
        t_rows = None if teacher_hidden is None else teacher_hidden[teacher_index[sl]]
        terms = torch.utils.checkpoint.checkpoint(
            _chunk_terms, head, hidden[index[sl]], targets[sl], weights[sl], t_rows, teacher_head, confidence, use_reentrant=False
        )
        totals = [a + b for a, b in zip(totals, terms)]
    return totals


class Objective(nn.Module):
    """The student model and the block-diffusion loss in one module, so that under FSDP2 the root unit
    owns the embedding/lm_head used by the loss (gathered once per forward, not once per chunk)."""

    def __init__(self, model: nn.Module, config: TrainConfig, teacher: nn.Module | None):
        super().__init__()
        self.model = model
        self.config = config
        # A list hides the frozen teacher from .parameters()/state_dict(): it is neither trained nor saved.
        self._teacher = [teacher]

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

    def adapter_pass(self, input_ids, position_ids, segment_ids):
        """The hidden states of the [clean | noisy ...] layout for a mask adapter model, in two forwards: the
        clean stream under no_grad (it runs the frozen base: no adapter on its rows, so nothing in it needs a
        gradient), its keys and values then the noisy copies' cache. The same numbers as one forward of the
        whole layout, without the clean stream's backward and its stored activations."""
        from .model import KVCache

        L = segment_ids.shape[1]
        mask = objective_mask(self.model, input_ids, segment_ids, self.config.block_size)
        with torch.no_grad():
            clean, clean_kv = self.model(input_ids[:, :L], position_ids[:, :L], mask[:, :L, :L])
        cache = KVCache(len(clean_kv))
        cache.append(clean_kv, L)
        noisy, _ = self.model(input_ids[:, L:], position_ids[:, L:], mask[:, L:, :], cache)
        return torch.cat([clean, noisy], dim=1)

    def forward(self, input_ids, position_ids, segment_ids, pred_index, targets, weights, teacher_index, ar_index, ar_targets,
                clean_index, clean_teacher_index):
        cfg = self.config
        L = segment_ids.shape[1]
        copies = input_ids.shape[1] // L
        if cfg.mask_adapter:
            hidden = self.adapter_pass(input_ids, position_ids, segment_ids)
        else:
            hidden, _ = self.model(input_ids, position_ids, objective_mask(self.model, input_ids, segment_ids, cfg.block_size))
        if cfg.mask_adapter:
            # The clean stream runs the base exactly (no adapter on its rows, the norms frozen, no mask
            # tokens in it), so it is the KL teacher's own forward: no second pass.
            t_hidden = hidden[:, :L].detach().reshape(-1, hidden.shape[-1]) if cfg.kl_weight > 0 else None
            t_head = self.model.logits
        else:
            t_hidden, t_head = self.teacher_pass(input_ids[:, :L], segment_ids, position_ids[:, :L])
        flat = hidden.reshape(-1, hidden.shape[-1])
        weighted, ce_sum, kl_sum, certainty = chunked_terms(
            self.model.logits, flat, pred_index, targets, weights, t_hidden if cfg.kl_weight > 0 else None, teacher_index,
            t_head, cfg.logits_chunk, confidence=cfg.confidence_weight > 0,
        )
        loss = weighted + cfg.kl_weight * kl_sum + cfg.confidence_weight * certainty
        if pred_index.numel() == 0:
            # Every process must run a backward through every parameter (FSDP reduces gradients
            # collectively), even when its rows happen to hold no target.
            loss = loss + 0.0 * self.model.logits(flat[:1]).sum()
        ar_sum = torch.zeros((), device=flat.device)
        if cfg.ar_weight > 0:
            ones = torch.ones(ar_targets.shape, device=flat.device)
            ar_loss, ar_sum, _, _ = chunked_terms(self.model.logits, flat, ar_index, ar_targets, ones, chunk=cfg.logits_chunk)
            loss = loss + cfg.ar_weight * ar_loss
        clean_kl = torch.zeros((), device=flat.device)
        if cfg.clean_kl_weight > 0:
            # KL(base || model) on every row of the clean stream, prompts included: the plain AR reading of
            # the model held to its base's, so that training on one prompt distribution moves it less.
            none = torch.zeros(clean_index.shape, device=flat.device)
            _, _, clean_kl, _ = chunked_terms(self.model.logits, flat, clean_index, none.long(), none, t_hidden,
                                              clean_teacher_index, t_head, cfg.logits_chunk)
            loss = loss + cfg.clean_kl_weight * clean_kl
        return loss, torch.stack([ce_sum, kl_sum.detach(), ar_sum, certainty.detach(), clean_kl.detach()])


