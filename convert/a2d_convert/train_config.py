"""Every knob of a training run (`TrainConfig`, the flags of `train`, stored in checkpoint.json and the lineage)
and the checks on them that need no data. Below both the objective (objective.py) and the loop (trainer.py);
train.py is the command, and its docstring the objective's design."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .config import ADAPTER_TARGETS
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
    t_max_start: float = field(default=-1.0, metadata={"help": "mask-rate curriculum (d3LLM's progressive mask ratio): the highest rate rises linearly from this to --t-max over --curriculum-steps; -1: none"})
    curriculum_steps: int = field(default=0, metadata={"help": "steps of the mask-rate curriculum's rise; 0: the whole schedule (--max-steps)"})
    loss_weighting: str = field(default="elbo", metadata={"help": "elbo (1/t weights of the NELBO) or none (plain masked-token CE)"})
    complementary: bool = field(default=True, metadata={"help": "second noisy copy with the complementary mask"})
    mask_pattern: str = field(default="random", metadata={"help": "random (each token of a block masked with rate t), full (every block wholly masked: the state of a window's first step; needs --loss-weighting none --no-complementary), decoder (half the blocks random, half as a sliding window meets them: the first position masked, the rest at rate t) or teacher (half the blocks random, half in the order a decoder reveals them: the first position masked and the others the AR base was least sure of, as many as rate t asks; needs self-distilled data, which records the base's probability of each token)"})
    full_share: float = field(default=0.0, metadata={"help": "share of the blocks wholly masked (mask rate 1), over whatever --mask-pattern gave them: the one state a window meets under reveal_order prefix with advance slide (its anchor and B masks), which the other patterns give only at the top of their rates"})
    kl_weight: float = field(default=0.0, metadata={"help": "weight of KL(AR base || model) on masked targets"})
    anchor_weight: float = field(default=1.0, metadata={"help": "weight of the masked-token loss at each block's leftmost masked position, the next token the decoder reveals (its leftmost top-up), against 1 for the others: above 1 holds that prediction closer to the distilled (base's greedy) token"})
    ar_weight: float = field(default=0.0, metadata={"help": "weight of the next-token loss on the clean stream"})
    clean_kl_weight: float = field(default=0.0, metadata={"help": "weight of KL(AR base || model) on every clean-stream row, prompts included (holds the model's plain AR reading to its base)"})
    confidence_weight: float = field(default=0.0, metadata={"help": "weight of the entropy of masked-target predictions whose argmax is already right (certainty forcing: more tokens per step)"})
    confidence_temperature: float = field(default=1.0, metadata={"help": "the certainty term's entropy is of softmax(logits / this) (dParallel: 0.5)"})
    lora_rank: int = field(default=0, metadata={"help": "LoRA rank on every projection; 0: full fine-tune"})
    lora_alpha: float = field(default=0.0, metadata={"help": "LoRA alpha (scale alpha / rank); 0: 2 x rank"})
    lora_train_norms: bool = field(default=True, metadata={"help": "with LoRA, also train the RMSNorm weights (never with --mask-adapter: rows of real tokens keep the base's)"})
    lora_targets: str = field(default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", metadata={"help": "comma-separated projections that get LoRA factors"})
    mask_adapter: bool = field(default=False, metadata={"help": "the LoRA factors only on rows holding the mask token, unmasked rows causal over the unmasked ones, shipped unmerged: every real token runs the exact base (docs/decoding.md, Mask adapter)"})
    window_adapter: bool = field(default=False, metadata={"help": "the LoRA factors on every window row, the window opening with its anchor, real window tokens seeing every real window token and masked ones the whole window, shipped unmerged: the KV cache is the exact base's and every masked position is predicted from a row that sees the whole window (docs/decoding.md, Window adapter)"})
    window_rule: bool = field(default=False, metadata={"help": "the window adapter's window and attention rule without its factors: every row, the committed ones too, trains the model's own weights (a full fine-tune, or a plain LoRA with --lora-rank merged at export), so the shipped model is its base's shape and runs at its base's cost; the committed rows' keys and values are the converted model's (docs/decoding.md, Window rule)"})
    clean_lora: bool = field(default=False, metadata={"help": "with --window-adapter: also a plain LoRA of the same rank on every row, merged into the shipped weights, so that the committed rows' keys and values train too (the KL teacher is then the model with both adapters off)"})
    init_adapter: str = field(default="", metadata={"help": "an earlier run's export (its model folder or its --delta folder) whose row adapter of this rule and rank starts this run's factors and mask embedding row: a warm start across runs, the optimiser and the LR schedule afresh; its weights' sha256 goes into the lineage"})
    lora_train_mask_embedding: bool = field(default=True, metadata={"help": "with LoRA, also train the mask token's embedding row"})
    precision: str = field(default="auto", metadata={"help": "auto (bf16 autocast on CUDA, fp32 on CPU), bf16 or fp32"})
    activation_checkpointing: bool = field(default=True, metadata={"help": "recompute each layer in backward"})
    attention: str = field(default="auto", metadata={"help": "auto (FlexAttention block masks on CUDA, dense boolean masks elsewhere), flex or dense"})
    flex_block: int = field(default=0, metadata={"help": "FlexAttention's forward tile (BLOCK_M = BLOCK_N, a divisor of 128) on CUDA; 0: auto, 64 for heads of up to 64 dimensions (the compiler's default tile ran the 135M's training forward 32x slower, bench/NOTES.md), the compiler's default above"})
    flex_backward_tiles: str = field(default="", metadata={"help": "FlexAttention's backward tiles on CUDA as M1,N1,M2,N2 (the dK/dV pass's query and key tiles, then the dQ pass's; each a power of two from 16 to 128 dividing 128, N1 a multiple of M1 and M2 of N2); empty: the compiler's choice (on Hopper 64,128,128,64 for 64-dimension heads)"})
    grouped_projections: bool = field(default=True, metadata={"help": "one GEMM for q/k/v and one for gate/up, and a row adapter's factors as one A and one block-diagonal B product per group (the same sums in another order); --no-grouped-projections: a GEMM per projection"})
    compile: str = field(default="auto", metadata={"help": "torch.compile each decoder layer and the loss's logits chunks: auto (both, on CUDA), on (both), layers (the layers only) or off"})
    logits_chunk: int = field(default=4096, metadata={"help": "target rows per lm_head chunk (bounds the [rows, vocab] logits)"})
    seed: int = field(default=0, metadata={"help": "masks, row order and LoRA init"})
    log_every: int = field(default=10, metadata={"help": "steps between log lines (the only host syncs)"})
    eval_every: int = field(default=0, metadata={"help": "steps between held-out evaluations; 0: only at the end (needs heldout.safetensors)"})
    save_every: int = field(default=0, metadata={"help": "steps between checkpoints; 0: only at the end"})
    keep_checkpoints: int = field(default=3, metadata={"help": "newest checkpoints kept; 0: all"})
    time_limit_min: float = field(default=0.0, metadata={"help": "stop and save once this many minutes have passed (checked at log steps); 0: none"})
    steps_from_time: bool = field(default=False, metadata={"help": "size the LR schedule (and the mask-rate curriculum) to --time-limit-min: after the first steps, --max-steps becomes as many steps as the time left holds at the measured step time (the --max-steps given is the ceiling); a resumed run keeps the size it was given"})
    profile_steps: str = field(default="", metadata={"help": "A:B profiles optimizer steps A to B-1 (torch.profiler): the kernels' GPU time by name, the GPU's busy share and each phase's wall time go to OUT/profile.txt; empty: no profile"})
    threads: int = field(default=0, metadata={"help": "CPU torch threads; 0: torch's default"})
    peak_tflops: float = field(default=790.0, metadata={"help": "the device's bf16 matrix rate, TFLOP/s, for the logged model FLOPs utilisation (790: an 8192^3 product measured on an H200; 989 is the datasheet's dense peak)"})

    @property
    def row_adapter(self) -> str | None:
        """The rule of the adapter this run trains ("mask" or "window"), or None."""
        return "mask" if self.mask_adapter else "window" if self.window_adapter else None

    @property
    def attention_rule(self) -> str | None:
        """How the noisy rows holding a real token attend ("mask", "window"; docs/decoding.md), or None."""
        return self.row_adapter or ("window" if self.window_rule else None)

    @property
    def clean_trains(self) -> bool:
        """The clean stream's rows carry gradient: every run but a row adapter's without --clean-lora (whose clean
        stream is the frozen base)."""
        return not self.row_adapter or self.clean_lora


def flex_backward_options(tiles: str) -> dict[str, int]:
    """--flex-backward-tiles "M1,N1,M2,N2" -> FlexAttention's kernel options for its backward."""
    fix = "give four tiles M1,N1,M2,N2, each 16, 32, 64 or 128, with N1 a multiple of M1 and M2 a multiple of N2"
    try:
        m1, n1, m2, n2 = (int(v) for v in tiles.split(","))
    except ValueError:
        raise A2DError(f"--flex-backward-tiles {tiles!r}: {fix}") from None
    if not all(v in (16, 32, 64, 128) for v in (m1, n1, m2, n2)) or n1 % m1 or m2 % n2:
        raise A2DError(f"--flex-backward-tiles {tiles!r}: {fix}")
    return {"BLOCK_M1": m1, "BLOCK_N1": n1, "BLOCK_M2": m2, "BLOCK_N2": n2}


def check_config(config: TrainConfig) -> None:
    if not 0.0 < config.t_min <= config.t_max < 1.0 and not (config.loss_weighting == "none" and 0 <= config.t_min <= config.t_max <= 1):
        raise A2DError(f"--t-min {config.t_min} / --t-max {config.t_max}: need 0 < t_min <= t_max < 1 for the 1/t weights")
    for name in ("kl_weight", "ar_weight", "confidence_weight", "clean_kl_weight"):
        if getattr(config, name) < 0:
            raise A2DError(f"--{name.replace('_', '-')} {getattr(config, name)}: must be 0 or more")
    if config.loss_weighting not in ("elbo", "none"):
        raise A2DError(f"--loss-weighting {config.loss_weighting!r}: use elbo or none")
    if config.anchor_weight <= 0:
        raise A2DError(f"--anchor-weight {config.anchor_weight}: must be above 0 (1: every masked token alike)")
    if config.mask_pattern not in ("random", "full", "decoder", "teacher"):
        raise A2DError(f"--mask-pattern {config.mask_pattern!r}: use random, full, decoder or teacher")
    if not 0.0 <= config.full_share <= 1.0:
        raise A2DError(f"--full-share {config.full_share}: a share of the blocks, from 0 to 1")
    if config.t_max_start >= 0 and not config.t_min <= config.t_max_start <= config.t_max:
        raise A2DError(f"--t-max-start {config.t_max_start}: the curriculum rises from it to --t-max {config.t_max}, so it must lie "
                       f"between --t-min {config.t_min} and --t-max (or -1: no curriculum)")
    if config.steps_from_time and config.time_limit_min <= 0:
        raise A2DError("--steps-from-time sizes the schedule to --time-limit-min; give a time limit above 0")
    if config.curriculum_steps < 0:
        raise A2DError(f"--curriculum-steps {config.curriculum_steps}: must be 0 (the whole schedule) or more")
    if config.attention not in ("auto", "flex", "dense"):
        raise A2DError(f"--attention {config.attention!r}: use auto, flex or dense")
    if config.flex_block not in (0, 16, 32, 64, 128):
        raise A2DError(f"--flex-block {config.flex_block}: use 0 (the default tile) or 16, 32, 64 or 128")
    if config.flex_backward_tiles:
        flex_backward_options(config.flex_backward_tiles)  # raises on a bad value
    if config.compile not in ("auto", "on", "layers", "off"):
        raise A2DError(f"--compile {config.compile!r}: use auto, on, layers or off")
    if config.confidence_temperature <= 0:
        raise A2DError(f"--confidence-temperature {config.confidence_temperature}: must be above 0")
    if config.mask_pattern == "full" and (config.loss_weighting != "none" or config.complementary):
        raise A2DError("--mask-pattern full has no mask rate for the 1/t weights and nothing left for a complementary copy; "
                       "add --loss-weighting none --no-complementary")
    targets = config.lora_targets.split(",")
    if not targets or len(set(targets)) != len(targets) or not all(t in ADAPTER_TARGETS for t in targets):
        raise A2DError(f"--lora-targets {config.lora_targets!r}: a comma-separated list of distinct names from {','.join(ADAPTER_TARGETS)}")
    if config.mask_adapter and config.window_adapter:
        raise A2DError("--mask-adapter and --window-adapter are two rules for one adapter; choose one")
    if config.row_adapter:
        flag = "--mask-adapter" if config.mask_adapter else "--window-adapter"
        if config.lora_rank < 1:
            raise A2DError(f"{flag} needs --lora-rank 1 or more (the adapter is LoRA factors)")
        for name in ("ar_weight", "clean_kl_weight"):
            if getattr(config, name) > 0:
                raise A2DError(f"--{name.replace('_', '-')} acts on the clean stream, which a row adapter never changes; drop it or {flag}")
    if config.init_adapter and not config.row_adapter:
        raise A2DError("--init-adapter starts a row adapter from an earlier run's; add --window-adapter or --mask-adapter")
    if config.init_adapter and not Path(config.init_adapter).is_dir():
        raise A2DError(f"--init-adapter {config.init_adapter}: no such folder (an earlier run's `export` output or its --delta)")
    if config.clean_lora and not config.window_adapter:
        raise A2DError("--clean-lora is the all-row LoRA beside a window adapter; add --window-adapter (plain LoRA is --lora-rank alone)")
    if config.window_adapter and not config.shift_logits:
        raise A2DError("--window-adapter predicts each position from the row before it (its anchor row opens the window); drop --no-shift-logits")
    if config.window_rule and config.row_adapter:
        raise A2DError("--window-rule is the window adapter's rule without its factors (every row trains the model's own weights); "
                       "drop --window-rule or the row adapter")
    if config.window_rule and not config.shift_logits:
        raise A2DError("--window-rule predicts each position from the row before it (its anchor row opens the window); drop --no-shift-logits")
    if config.precision not in ("auto", "bf16", "fp32"):
        raise A2DError(f"--precision {config.precision!r}: use auto, bf16 or fp32")
    if config.profile_steps:
        try:
            first, stop = (int(v) for v in config.profile_steps.split(":"))
        except ValueError:
            first, stop = 0, -1
        if not 0 <= first < stop:
            raise A2DError(f"--profile-steps {config.profile_steps!r}: use A:B with 0 <= A < B (optimizer steps A to B-1)")
    for name in ("max_steps", "batch_rows", "micro_batch_rows", "log_every", "block_size", "logits_chunk"):
        if getattr(config, name) < 1:
            raise A2DError(f"--{name.replace('_', '-')} must be at least 1")
