"""`train`: turn an AR base into a block-diffusion model (docs/decoding.md is what it learns to do).

Objective — the block-diffusion NELBO of Arriola et al. 2025 (BD3-LM, arXiv:2503.09573, Sec. 3):

    L_BD(x) = - sum_b  E_{t ~ U[0,1]}  E_{x_t^b ~ q(.|x^b, t)}  [ alpha'_t / (1 - alpha_t) ] log p(x^b | x_t^b, x^{<b})

with the linear schedule alpha_t = 1 - t, i.e. a 1/t weight on the cross-entropy of every masked token
of block b, where each token of the block is masked independently with probability t. t is drawn per
block from the clipped range [t_min, t_max] (BD3-LM's clipped schedules lower the gradient variance);
`--loss-weighting none` drops the 1/t weight (plain masked-token cross-entropy, as Fast-dLLM v2 / SDAR).

Layout of one packed row of L tokens (L a multiple of the block size B), one forward of 3L positions:
    [ clean x (L) | noisy copy 1 (L) | noisy copy 2 (L) ]
- clean: plain causal attention inside its sample (segment) — the keys/values decoding commits;
- noisy copy c: position i of block k attends to every clean position of its sample before the block
  (j < kB) and bidirectionally to its own block in copy c — exactly the window rule of decoding;
- the copies use complementary masks (Fast-dLLM v2, SDAR): copy 2 masks exactly what copy 1 keeps,
  so every target token is learned once per step; copy 2's weight is 1/(1-t);
- prediction of masked position p: with `shift_logits` (the AR shift, default) from the hidden state
  at p-1 — the *clean* stream's for the first position of a block (decoding's anchor row) and the
  noisy copy's for the others; without it from the noisy copy at p.
Samples are packed with position ids restarting at 0 and never attend across samples; the data
builder aligned each response start to a block boundary, as decoding starts its first block right
after the prompt. Loss only where the data's loss mask says (responses of chat samples).
Optional terms: `--kl-weight` adds KL(p_base || p_model) on the masked targets against the frozen AR
base reading the clean prefix (with LoRA the base is the same modules with adapters off);
`--ar-weight` adds the plain next-token loss on the clean stream. The loss is normalised by the number
of target positions of the whole global batch, so one process and N FSDP processes compute the same
gradient, and masks are drawn from (seed, step, row slot), so a run resumes exactly.

Engineering: bf16 autocast on GPU (fp32 master weights), activation checkpointing per layer, logits only
at target rows in checkpointed chunks (large vocabularies), fused AdamW on CUDA, no host sync per step
except at log points. Many GPUs: `torchrun --nproc-per-node N -m a2d_convert train ...` shards every
layer with FSDP2 (`fully_shard`); checkpoints are torch.distributed.checkpoint folders (resharded on
load) plus consolidated safetensors weights for `export`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .errors import A2DError


@dataclass
class TrainConfig:
    """Every knob of a run (the flags of `train`); stored in checkpoint.json and the lineage."""

    base: str = field(default="", metadata={"help": "AR base folder (init runs first) or an a2d folder made by `init`"})
    data: str = field(default="", metadata={"help": "folder written by `data`"})
    out: str = field(default="", metadata={"help": "run folder: init/, checkpoints/, train_log.jsonl"})
    block_size: int = field(default=4, metadata={"help": "must equal the data's; used for `init` when the base is plain AR"})
    shift_logits: bool = field(default=True, metadata={"help": "for `init`: predict position i from hidden state i-1 (an a2d base keeps its own)"})
    max_steps: int = field(default=1000, metadata={"help": "optimizer steps"})
    batch_rows: int = field(default=8, metadata={"help": "packed rows per optimizer step, over all processes"})
    micro_batch_rows: int = field(default=1, metadata={"help": "rows per process per forward; batch_rows / (processes x this) is the accumulation"})
    lr: float = field(default=5e-5, metadata={"help": "peak learning rate"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine decay down to lr x this"})
    warmup_steps: int = field(default=20, metadata={"help": "linear warmup steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay of matrices"})
    beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient norm clip; 0: off"})
    t_min: float = field(default=0.2, metadata={"help": "lowest per-block mask rate (clipped schedule)"})
    t_max: float = field(default=0.8, metadata={"help": "highest per-block mask rate"})
    loss_weighting: str = field(default="elbo", metadata={"help": "elbo (1/t weights of the NELBO) or none (plain masked-token CE)"})
    complementary: bool = field(default=True, metadata={"help": "second noisy copy with the complementary mask"})
    mask_pattern: str = field(default="random", metadata={"help": "random (each token of a block masked with rate t) or full (every block wholly masked: the state of a window's first step; needs --loss-weighting none --no-complementary)"})
    kl_weight: float = field(default=0.0, metadata={"help": "weight of KL(AR base || model) on masked targets"})
    ar_weight: float = field(default=0.0, metadata={"help": "weight of the next-token loss on the clean stream"})
    clean_kl_weight: float = field(default=0.0, metadata={"help": "weight of KL(AR base || model) on every clean-stream row, prompts included (holds the model's plain AR reading to its base)"})
    confidence_weight: float = field(default=0.0, metadata={"help": "weight of the entropy of masked-target predictions whose argmax is already right (certainty forcing: more tokens per step)"})
    lora_rank: int = field(default=0, metadata={"help": "LoRA rank on every projection; 0: full fine-tune"})
    lora_alpha: float = field(default=0.0, metadata={"help": "LoRA alpha (scale alpha / rank); 0: 2 x rank"})
    lora_train_norms: bool = field(default=True, metadata={"help": "with LoRA, also train the RMSNorm weights (never with --mask-adapter: rows of real tokens keep the base's)"})
    lora_targets: str = field(default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", metadata={"help": "comma-separated projections that get LoRA factors"})
    mask_adapter: bool = field(default=False, metadata={"help": "the LoRA factors only on rows holding the mask token, unmasked rows causal over the unmasked ones, shipped unmerged: every real token runs the exact base (docs/decoding.md, Mask adapter)"})
    lora_train_mask_embedding: bool = field(default=True, metadata={"help": "with LoRA, also train the mask token's embedding row"})
    precision: str = field(default="auto", metadata={"help": "auto (bf16 autocast on CUDA, fp32 on CPU), bf16 or fp32"})
    activation_checkpointing: bool = field(default=True, metadata={"help": "recompute each layer in backward"})
    logits_chunk: int = field(default=4096, metadata={"help": "target rows per lm_head chunk (bounds the [rows, vocab] logits)"})
    seed: int = field(default=0, metadata={"help": "masks, row order and LoRA init"})
    log_every: int = field(default=10, metadata={"help": "steps between log lines (the only host syncs)"})
    eval_every: int = field(default=0, metadata={"help": "steps between held-out evaluations; 0: only at the end (needs heldout.safetensors)"})
    save_every: int = field(default=0, metadata={"help": "steps between checkpoints; 0: only at the end"})
    keep_checkpoints: int = field(default=3, metadata={"help": "newest checkpoints kept; 0: all"})
    time_limit_min: float = field(default=0.0, metadata={"help": "stop and save once this many minutes have passed (checked at log steps); 0: none"})
    threads: int = field(default=0, metadata={"help": "CPU torch threads; 0: torch's default"})
    peak_tflops: float = field(default=989.0, metadata={"help": "the device's dense bf16 peak, TFLOP/s, for the logged model FLOPs utilisation (H100/H200 SXM: 989)"})


# --------------------------------------------------------------------------------------------- command


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train",
        help="train the block-diffusion objective (one process, or many under torchrun with FSDP2)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = TrainConfig()
    p.add_argument("--resume", action="store_true", help="continue from OUT/latest.json")
    for f in TrainConfig.__dataclass_fields__.values():
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        if f.name in ("base", "data", "out"):
            p.add_argument(flag, dest=f.name, required=True, help=f.metadata["help"])
        elif isinstance(default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default, help=f.metadata["help"] + f" (default: {default})")
        else:
            p.add_argument(flag, dest=f.name, type=type(default), default=default, help=f.metadata["help"] + " (default: %(default)s)")
    p.set_defaults(run=run)


def run(args) -> int:
    values = {name: getattr(args, name) for name in TrainConfig.__dataclass_fields__}
    config = TrainConfig(**values)
    check_config(config)
    from .trainer import close_runtime, train

    finished = False
    try:
        train(config, resume=args.resume)
        finished = True
    finally:
        close_runtime(finished)
    return 0


def check_config(config: TrainConfig) -> None:
    if not 0.0 < config.t_min <= config.t_max < 1.0 and not (config.loss_weighting == "none" and 0 <= config.t_min <= config.t_max <= 1):
        raise A2DError(f"--t-min {config.t_min} / --t-max {config.t_max}: need 0 < t_min <= t_max < 1 for the 1/t weights")
    for name in ("kl_weight", "ar_weight", "confidence_weight", "clean_kl_weight"):
        if getattr(config, name) < 0:
            raise A2DError(f"--{name.replace('_', '-')} {getattr(config, name)}: must be 0 or more")
    if config.loss_weighting not in ("elbo", "none"):
        raise A2DError(f"--loss-weighting {config.loss_weighting!r}: use elbo or none")
    if config.mask_pattern not in ("random", "full"):
        raise A2DError(f"--mask-pattern {config.mask_pattern!r}: use random or full")
    if config.mask_pattern == "full" and (config.loss_weighting != "none" or config.complementary):
        raise A2DError("--mask-pattern full has no mask rate for the 1/t weights and nothing left for a complementary copy; "
                       "add --loss-weighting none --no-complementary")
    from .config import ADAPTER_TARGETS

    targets = config.lora_targets.split(",")
    if not targets or len(set(targets)) != len(targets) or not all(t in ADAPTER_TARGETS for t in targets):
        raise A2DError(f"--lora-targets {config.lora_targets!r}: a comma-separated list of distinct names from {','.join(ADAPTER_TARGETS)}")
    if config.mask_adapter:
        if config.lora_rank < 1:
            raise A2DError("--mask-adapter needs --lora-rank 1 or more (the adapter is LoRA factors)")
        for name in ("ar_weight", "clean_kl_weight"):
            if getattr(config, name) > 0:
                raise A2DError(f"--{name.replace('_', '-')} acts on the clean stream, which a mask adapter never changes; drop it or --mask-adapter")
    if config.precision not in ("auto", "bf16", "fp32"):
        raise A2DError(f"--precision {config.precision!r}: use auto, bf16 or fp32")
    for name in ("max_steps", "batch_rows", "micro_batch_rows", "log_every", "block_size", "logits_chunk"):
        if getattr(config, name) < 1:
            raise A2DError(f"--{name.replace('_', '-')} must be at least 1")
