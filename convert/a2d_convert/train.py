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
from .train_config import TrainConfig, check_config


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
