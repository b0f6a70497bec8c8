"""The training loop behind `train`: one process, or N under torchrun with FSDP2; checkpoints, resume,
logs and lineage. The objective itself is objective.py; the design is in train.py's docstring."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from . import lineage as lin
from . import lora as lora_mod
from .config import load_config, read_json, write_json
from .data import HELDOUT_FILE, MANIFEST_FILE, TRAIN_FILE, load_rows
from .errors import A2DError
from .export import DELTA_JSON, DELTA_WEIGHTS, row_adapter_tensors
from .objective import Batch, Objective, RowSchedule
from .train_config import TrainConfig, flex_backward_options

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
LOG_FILE = "train_log.jsonl"
WEIGHTS = "model.safetensors"
ADAPTER = "adapter.safetensors"


# --------------------------------------------------------------------------------------------- setup


@dataclass
class Runtime:
    rank: int
    world: int
    device: torch.device
    distributed: bool

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_runtime(config: TrainConfig) -> Runtime:
    """One process, or one of N under torchrun (WORLD_SIZE > 1): NCCL on GPUs, gloo on CPUs."""
    import torch.distributed as dist

    if config.threads > 0:
        torch.set_num_threads(config.threads)
    # The reference layer returns its (k, v) as views; nothing here writes to them in place.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    # One process saves and loads checkpoints without a process group, which DCP warns about.
    warnings.filterwarnings("ignore", message=r"torch.distributed is disabled, unavailable or uninitialized")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if world > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
        return Runtime(dist.get_rank(), dist.get_world_size(), device, True)
    return Runtime(0, 1, torch.device("cuda") if cuda else torch.device("cpu"), False)


def close_runtime(finished: bool) -> None:
    """Ends the process group of a distributed run (after a barrier when the run finished): left to the
    interpreter's exit, gloo's threads may be torn down in an order that aborts a rank after it finished."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def barrier(rt: Runtime) -> None:
    if rt.distributed:
        import torch.distributed as dist

        dist.barrier()


def on_main(rt: Runtime, work, *args):
    """Run `work` on rank 0 only; every rank learns whether it failed, so a bad input on rank 0 ends
    all processes with its error instead of leaving the others waiting at the next collective."""
    failure, result = None, None
    if rt.main:
        try:
            result = work(*args)
        except Exception as err:  # re-raised below, after the other ranks have heard of it
            failure = err
    if rt.distributed:
        flag = torch.tensor([1.0 if failure else 0.0], device=rt.device)
        all_reduce_sum(rt, flag)
        if flag.item() and failure is None:
            raise A2DError(f"rank 0 failed (its error is printed by rank 0); rank {rt.rank} stops too")
    if failure is not None:
        raise failure
    return result


def all_reduce_sum(rt: Runtime, tensor: torch.Tensor) -> torch.Tensor:
    if rt.distributed:
        import torch.distributed as dist

        dist.all_reduce(tensor)
    return tensor


def use_bf16(config: TrainConfig, device: torch.device) -> bool:
    if config.precision == "auto":
        return device.type == "cuda"
    return config.precision == "bf16"


def autocast(config: TrainConfig, device: torch.device):
    if use_bf16(config, device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def checkpoint_layers(model: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of storing its activations. The instance's
    forward is replaced (not wrapped in a new module), so parameter names stay the HF names."""
    from torch.utils.checkpoint import checkpoint

    for layer in model.model.layers:
        inner = layer.forward

        def forward(*args, _inner=inner, **kwargs):
            return checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward


def unrooted_chain(folder: Path) -> str | None:
    """Why `folder`'s lineage cannot root an export that `verify` passes (it must start at an import of the
    base; format 1 chains predate the rule), or None; a folder without lineage.json is a plain checkpoint."""
    chain = lin.read_lineage_or_root(folder)
    stages = chain["stages"]
    if not stages or chain.get("format_version") == 1 or stages[0].get("stage") == "import":
        return None
    return f"its lineage starts at stage {stages[0].get('stage')!r}, not at an import of the base"


def prepare_init(config: TrainConfig, rt: Runtime) -> Path:
    """The a2d starting point: the base itself when it has an `a2d` section, else `init` of it in OUT/init.
    A plain checkpoint (no lineage.json) is imported into OUT/base first, so that the chain of everything
    trained from it starts at an import of its files, as `verify` requires; a folder whose chain starts
    anywhere else is refused before any work."""
    from .import_base import import_base
    from .init_model import init_model

    base = Path(config.base)
    _, a2d, _ = load_config(base)
    problem = unrooted_chain(base)
    if problem is None and a2d is not None and not (base / lin.LINEAGE_FILE).is_file():
        problem = "it has an a2d section but no lineage.json"
    if problem:
        raise A2DError(
            f"--base {base}: {problem}, so `verify` would fail every export trained from it; import the original "
            "checkpoint (`python -m a2d_convert import --source CHECKPOINT --out DIR`) and train with --base DIR "
            "(or pass the checkpoint itself: train imports a plain checkpoint into OUT/base)"
        )
    if a2d is not None:
        return base
    if not (base / lin.LINEAGE_FILE).is_file():
        imported = Path(config.out) / "base"

        def make_import() -> None:
            if (imported / lin.LINEAGE_FILE).is_file():
                recorded = lin.read_lineage(imported)["stages"][0]
                if recorded.get("inputs") != {f.name: lin.file_record(f) for f in sorted(base.iterdir()) if f.is_file()}:
                    raise A2DError(f"{imported} was imported from another checkpoint than {base}; use a new --out")
                return
            import_base(base, imported, force=True)

        on_main(rt, make_import)
        barrier(rt)
        base = imported
    init_dir = Path(config.out) / "init"

    def make_init() -> None:
        if (init_dir / lin.LINEAGE_FILE).is_file():
            recorded = lin.read_lineage(init_dir)["stages"][-1]
            if recorded.get("inputs", {}).get("model.safetensors", {}).get("sha256") != lin.sha256_file(base / WEIGHTS):
                raise A2DError(f"{init_dir} was made from another base than {base}; use a new --out")
            return
        previous = lin.read_lineage_or_root(base)
        init_model(base, init_dir, config.block_size, config.shift_logits, force=True)
        inputs = {name: {**rec, "from_previous": bool(previous["stages"])} for name, rec in lin.hash_folder(base).items()}
        stage = lin.make_stage(
            "init",
            config={"block_size": config.block_size, "shift_logits": config.shift_logits, "base": str(base.resolve())},
            inputs=inputs,
            outputs=lin.hash_folder(init_dir),
        )
        lin.write_lineage(init_dir, lin.append_stage(previous, stage))

    on_main(rt, make_init)
    return init_dir


def build_model(config: TrainConfig, init_dir: Path, rt: Runtime):
    """(objective, trainable params, a2d section); FSDP2-sharded when distributed."""
    from .model import load_transformer

    model, _, a2d = load_transformer(init_dir)
    if a2d is None:
        raise A2DError(f"{init_dir}/config.json: no a2d section; pass an AR base or a folder made by `init`")
    model.train()
    teacher = None
    if config.lora_rank > 0:
        alpha = config.lora_alpha or 2.0 * config.lora_rank
        lora_config = lora_mod.LoraConfig(
            rank=config.lora_rank,
            alpha=alpha,
            targets=tuple(config.lora_targets.split(",")),
            train_norms=config.lora_train_norms,
            train_mask_embedding=config.lora_train_mask_embedding,
        )
        lora_mod.attach(model, lora_config, a2d.mask_token_id, torch.Generator().manual_seed(config.seed), rows=config.row_adapter)
        if config.init_adapter:
            shipped = row_adapter_tensors(Path(config.init_adapter), config.row_adapter, a2d.mask_token_id)
            try:
                lora_mod.load_row_factors(model, shipped, lora_config.scale)
            except ValueError as e:
                raise A2DError(f"--init-adapter {config.init_adapter}: {e}; train with the same --lora-rank, --lora-alpha and --lora-targets") from e
        if config.clean_lora:
            # Registered after the window adapter's, so its hook adds onto every row's output, as the merged weight will.
            clean = dataclasses.replace(lora_config, train_norms=False, train_mask_embedding=False)
            lora_mod.attach(model, clean, a2d.mask_token_id, torch.Generator().manual_seed(config.seed + 1), freeze=False)
        if use_bf16(config, rt.device):
            frozen_bf16(model)
    elif config.kl_weight > 0 or config.clean_kl_weight > 0:
        teacher, _, _ = load_transformer(init_dir)
        teacher.requires_grad_(False)
        if use_bf16(config, rt.device):
            teacher = teacher.to(torch.bfloat16)
    # The run's attention rule: its row adapter's (which lora.attach gave the model already) or the window rule's, the
    # window adapter's window and attention with no factors of its own.
    model.attention_rule = config.attention_rule
    if config.grouped_projections and config.row_adapter:
        lora_mod.fuse_projections(model)
    if config.activation_checkpointing:
        checkpoint_layers(model)
    compiled = config.compile in ("on", "layers") or (config.compile == "auto" and rt.device.type == "cuda")
    if compiled:
        # Every recompile names its cause in the log: one mid-run is a stall of seconds to minutes. (TORCH_LOGS, when
        # set, is the user's choice and stays.)
        if not os.environ.get("TORCH_LOGS"):
            torch._logging.set_logs(recompiles=True)
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    model.to(rt.device)
    if teacher is not None:
        teacher.to(rt.device)
    objective = Objective(model, config, teacher)
    tile = flex_tile(config, model.config.head_dim)
    if tile or config.flex_backward_tiles:
        from . import model as model_mod

        if tile:
            model_mod.FLEX_KERNEL_OPTIONS.update(BLOCK_M=tile, BLOCK_N=tile)
        if config.flex_backward_tiles:
            model_mod.FLEX_KERNEL_OPTIONS.update(flex_backward_options(config.flex_backward_tiles))
    if compiled and config.compile != "layers":
        objective.compile_terms()
    if rt.distributed:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        bf16 = use_bf16(config, rt.device)
        layer_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
        root_policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32, cast_forward_inputs=False
        )
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=layer_policy)
        fully_shard(objective, mp_policy=root_policy)
        if teacher is not None:
            for layer in teacher.model.layers:
                fully_shard(layer)
    trainable = [p for p in objective.parameters() if p.requires_grad]
    return objective, trainable, a2d


def flex_tile(config: TrainConfig, head_dim: int) -> int:
    """The FlexAttention forward tile for --flex-block (0: auto): 64 for heads of up to 64 dimensions, where the
    compiler's default tile is 32x slower on an H200 (a noisy pass of the 135M: 33.6 ms forward with it, 1.05 ms with 64; bench/NOTES.md),
    else 0 (the compiler's default, which the 2B shape's 128-dimension heads run well)."""
    if config.flex_block:
        return config.flex_block
    return 64 if head_dim <= 64 else 0


def frozen_bf16(model: nn.Module) -> None:
    """The frozen projections and lm_head in bf16, which is what autocast multiplies anyway, so that no forward
    casts them again; the embedding (gathered, not multiplied) and the norms stay fp32, so the residual stream
    does too, as in every backend (docs/model-format.md, "The math")."""
    for name, p in model.named_parameters():
        if not p.requires_grad and p.ndim == 2 and ("proj." in name or name.startswith("lm_head.")):
            p.data = p.data.to(torch.bfloat16)


def make_optimizer(config: TrainConfig, params: list[nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=(config.beta1, config.beta2), **extra)


def lr_at(config: TrainConfig, step: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(config.max_steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


# --steps-from-time: the step time is measured over SIZE_STEPS steps that start SIZE_FROM steps into the call (past
# the first steps' compiles), and the schedule sized then, before a warmup of more steps than that ends.
SIZE_FROM, SIZE_STEPS = 3, 10


def steps_that_fit(step: int, step_s: float, left_s: float, log_every: int, ceiling: int) -> int:
    """--steps-from-time: the schedule's length once `step` steps are done, one takes `step_s` seconds and `left_s`
    of the time limit are left: the steps that fit in 95 % of it (later steps may run a little slower) less one log
    interval (the time limit is checked at log lines), at least one more, at most `ceiling` (--max-steps)."""
    fit = int(left_s * 0.95 / max(step_s, 1e-9)) - log_every
    return min(ceiling, step + max(fit, 1))


def to_device(batch: Batch, device: torch.device) -> dict[str, torch.Tensor]:
    def move(a: np.ndarray, dtype) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a)).to(dtype)
        if device.type == "cuda":
            t = t.pin_memory().to(device, non_blocking=True)
        return t

    return {
        "input_ids": move(batch.input_ids, torch.long),
        "position_ids": move(batch.position_ids, torch.long),
        "segment_ids": move(batch.segment_ids, torch.long),
        "row_seg": move(batch.row_seg, torch.long),
        "pred_index": move(batch.pred_index, torch.long),
        "targets": move(batch.targets, torch.long),
        "weights": move(batch.weights, torch.float32),
        "teacher_index": move(batch.teacher_index, torch.long),
        "ar_index": move(batch.ar_index, torch.long),
        "ar_targets": move(batch.ar_targets, torch.long),
        "clean_index": move(batch.clean_index, torch.long),
        "clean_teacher_index": move(batch.clean_teacher_index, torch.long),
    }


def micro_slots(config: TrainConfig, rt: Runtime, micro: int) -> list[int]:
    first = (micro * rt.world + rt.rank) * config.micro_batch_rows
    return list(range(first, first + config.micro_batch_rows))


def accumulation_steps(config: TrainConfig, rt: Runtime) -> int:
    per_pass = rt.world * config.micro_batch_rows
    if config.batch_rows % per_pass:
        raise A2DError(
            f"--batch-rows {config.batch_rows} must be a multiple of processes ({rt.world}) x --micro-batch-rows "
            f"({config.micro_batch_rows})"
        )
    return config.batch_rows // per_pass


# --------------------------------------------------------------------------------------------- checkpoints


def state_options(config: TrainConfig, full: bool = False):
    """With LoRA only the trainable tensors are saved; loading them back must then leave the frozen
    base weights (already loaded from init/) alone, hence strict only for a full fine-tune."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    lora = config.lora_rank > 0
    return StateDictOptions(full_state_dict=full, cpu_offload=full, ignore_frozen_params=lora, strict=not lora)


def save_checkpoint(objective, optimizer, config: TrainConfig, rt: Runtime, step: int, progress: dict[str, Any], init_dir: Path, inputs: dict) -> Path:
    """DCP state (resumable, resharded on load) plus consolidated weights and lineage for `export`.
    `inputs`: the train stage's recorded inputs (init files and data files), hashed once per run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    folder = Path(config.out) / CHECKPOINTS / f"step_{step:06d}"
    on_main(rt, lambda: shutil.rmtree(folder) if folder.exists() else None)
    model_state, optim_state = get_state_dict(objective, optimizer, options=state_options(config))
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder / "state"), no_dist=not rt.distributed)
    full = get_model_state_dict(objective, options=state_options(config, full=True))

    def write_consolidated() -> None:
        tensors = {name.removeprefix("model."): t.detach() for name, t in full.items()}
        if config.lora_rank > 0:
            weights_file = folder / ADAPTER
            lin.save_tensors(weights_file, {k: v.float() for k, v in tensors.items()}, {"format": "pt"})
        else:
            weights_file = folder / WEIGHTS
            lin.save_tensors(weights_file, {k: v.to(torch.bfloat16) for k, v in tensors.items()}, {"format": "pt"})
        record = {
            "step": step,
            "mode": "lora" if config.lora_rank > 0 else "full",
            "init": str(init_dir.resolve()),
            "weights": weights_file.name,
            "config": asdict(config),
            "world_size": rt.world,
            "progress": progress,
        }
        if config.lora_rank > 0:
            record["lora"] = {"rank": config.lora_rank, "alpha": config.lora_alpha or 2.0 * config.lora_rank}
            if config.row_adapter:
                record["lora"][f"{config.row_adapter}_targets"] = config.lora_targets.split(",")
        write_json(folder / "checkpoint.json", record)
        outputs = {name: rec for name, rec in lin.hash_folder(folder).items() if not name.startswith("state/")}
        stage = lin.make_stage(
            "train", config={**asdict(config), "world_size": rt.world, "steps_done": step}, inputs=inputs, outputs=outputs
        )
        lin.write_lineage(folder, lin.append_stage(lin.read_lineage_or_root(init_dir), stage))
        write_json(Path(config.out) / LATEST, {"step": step, "path": f"{CHECKPOINTS}/{folder.name}"})
        prune_checkpoints(Path(config.out) / CHECKPOINTS, config.keep_checkpoints)

    on_main(rt, write_consolidated)
    return folder


def prune_checkpoints(folder: Path, keep: int) -> None:
    if keep <= 0:
        return
    for old in sorted(folder.glob("step_*"))[:-keep]:
        shutil.rmtree(old)


def load_checkpoint(objective, optimizer, config: TrainConfig, rt: Runtime) -> tuple[int, dict[str, Any]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    latest = Path(config.out) / LATEST
    if not latest.is_file():
        raise A2DError(f"--resume: {latest} not found; no checkpoint to resume from in {config.out}")
    pointer = read_json(latest)
    folder = Path(config.out) / pointer["path"]
    record = read_json(folder / "checkpoint.json")
    saved = record["config"]
    for key in ("base", "data", "block_size", "lora_rank", "complementary", "shift_logits", "mask_adapter", "window_adapter", "window_rule", "lora_targets"):
        if saved.get(key, False) != getattr(config, key):
            raise A2DError(f"--resume: {folder} was trained with {key}={saved.get(key)!r}, this run has {getattr(config, key)!r}")
    model_state, optim_state = get_state_dict(objective, optimizer, options=state_options(config))
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(folder / "state"), no_dist=not rt.distributed)
    set_state_dict(objective, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=state_options(config))
    return int(record["step"]), record.get("progress", {})


# --------------------------------------------------------------------------------------------- the loop


def model_flops(objective, config: TrainConfig, rows: int, targets: int, attended: tuple[int, int]) -> float:
    """The model FLOPs of training `rows` packed rows with `targets` target rows and `attended` (clean, noisy)
    (query, key) pairs, counted as the run computes them (recomputation left out): the projections' matrix
    products on every row of the layout, attention's two products (q k and p v) on every attended pair, and
    the lm_head on target rows. A row adapter's clean stream runs forward only (the frozen base, no gradient,
    no adapter) unless --clean-lora trains it; everything else (the window rule's clean stream too) forward and
    backward: the activations' gradients
    (twice the forward), plus the weights' gradients of what trains (a full fine-tune: every matrix, twice the
    forward again). Adapter factors train, so their two products count six times (forward, activations' and
    factors' gradients) on every row that computes them: a row adapter's on the noisy rows (the mask rule computes
    them on every noisy row and gates them), a plain LoRA's (alone, or --clean-lora's) on every row. The KL teacher's
    logits on the target rows are a forward of the lm_head each; where the clean stream trains, the teacher is a
    forward of its own over the clean stream (adapters off, or the frozen copy of a full fine-tune)."""
    model = objective.model
    cfg = model.config
    layout = objective.layout
    body = row_factors = lora_factors = 0
    for name, p in model.model.layers.named_parameters():
        if p.ndim != 2:
            continue
        if "lora_" in name:
            lora_factors += p.numel()
        elif name.endswith(("_a", "_b")):
            row_factors += p.numel()
        else:
            body += p.numel()
    head = cfg.vocab_size * cfg.hidden_size
    per_pair = 4 * cfg.num_heads * cfg.head_dim
    frozen = config.lora_rank > 0
    trained = 4 if frozen else 6  # forward + activations' gradients (+ weights' gradients)
    clean_rows, noisy_rows = rows * layout.L, rows * layout.noisy_copies * layout.copy_rows
    clean_pairs, noisy_pairs = attended
    clean_trains = config.clean_trains
    projections = clean_rows * body * (trained if clean_trains else 2) + noisy_rows * body * trained
    projections += noisy_rows * row_factors * 6 + (clean_rows + noisy_rows) * lora_factors * 6
    attention = per_pair * (clean_pairs * (3 if clean_trains else 1) + noisy_pairs * 3)
    teacher = 0
    if clean_trains and config.kl_weight > 0:
        teacher = clean_rows * body * 2 + per_pair * clean_pairs
    logits = targets * head * (trained + (2 if config.kl_weight > 0 else 0))
    return float(projections + attention + teacher + logits)


class Profile:
    """--profile-steps A:B: torch.profiler over optimizer steps A to B-1, written to OUT/profile.txt as the GPU
    kernels' time by name, the GPU's busy share of the wall time and the host's share spent building batches."""

    def __init__(self, config: TrainConfig, out: Path):
        self.first, self.stop = (int(v) for v in config.profile_steps.split(":")) if config.profile_steps else (-1, -1)
        self.path = out / "profile.txt"
        self.prof = None
        self.host_s = 0.0
        self.started = 0.0
        self.overhead_s = 0.0  # time spent stopping the profiler and writing its table, kept out of the throughput

    def take_overhead(self) -> float:
        spent, self.overhead_s = self.overhead_s, 0.0
        return spent

    def at_step(self, step: int) -> None:
        if step == self.first and self.prof is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize()
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.start()
            self.host_s, self.started = 0.0, time.perf_counter()
        elif step == self.stop and self.prof is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            stopping = time.perf_counter()
            wall = stopping - self.started
            self.prof.stop()
            events = self.prof.key_averages()
            # The kernels' own rows (an operator's row repeats its kernels' time as its device time).
            device_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
            lines = [
                f"steps {self.first}..{self.stop - 1}: wall {wall:.3f} s, host building batches {self.host_s:.3f} s "
                f"({self.host_s / wall:.1%}), GPU kernels {device_us / 1e6:.3f} s ({device_us / 1e6 / wall:.1%} of the wall time)",
                "",
                events.table(sort_by="self_device_time_total" if device_us else "self_cpu_time_total", row_limit=40, max_name_column_width=90),
            ]
            self.path.write_text("\n".join(lines))
            print(json.dumps({"event": "profile", "path": str(self.path), "wall_s": wall, "host_s": self.host_s,
                              "gpu_busy": device_us / 1e6 / wall if wall else 0.0}), flush=True)
            self.prof = None
            self.overhead_s += time.perf_counter() - stopping


def evaluate(objective, arrays: dict[str, np.ndarray], config: TrainConfig, rt: Runtime, mask_token_id: int, max_rows: int = 64) -> float:
    """Mean masked-token CE on held-out rows with fixed masks (the same ones every time it runs).

    Every process runs the same number of forwards (FSDP gathers each layer's weights collectively): a
    process whose share of the rows has run out repeats the first micro-batch and does not count it."""
    rows = min(arrays["input_ids"].shape[0], max_rows)
    schedule = RowSchedule(arrays, replace(config, batch_rows=rows, seed=config.seed + 7919), mask_token_id)
    sums = torch.zeros(2, device=rt.device)
    per_pass = rt.world * config.micro_batch_rows
    with torch.no_grad():
        for index in range(-(-rows // per_pass)):
            first = index * per_pass + rt.rank * config.micro_batch_rows
            counted = first < rows
            if not counted:
                first = 0
            batch = schedule.batch(0, list(range(first, min(first + config.micro_batch_rows, rows))))
            with autocast(config, rt.device):
                _, stats = objective(**to_device(batch, rt.device))
            if counted:
                sums[0] += stats[0]
                sums[1] += batch.pred_index.size
    totals = all_reduce_sum(rt, sums).tolist()
    return totals[0] / max(totals[1], 1.0)


def train(config: TrainConfig, resume: bool = False) -> Path:
    """Runs the training; returns the folder of the last checkpoint."""
    from .train_config import check_config

    check_config(config)
    rt = setup_runtime(config)
    out = Path(config.out)
    if not resume and (out / LATEST).exists():
        raise A2DError(f"{out} already holds a run ({LATEST}); pass --resume to continue it or choose a new --out")
    on_main(rt, lambda: out.mkdir(parents=True, exist_ok=True))
    torch.manual_seed(config.seed)
    data_dir = Path(config.data)
    arrays, meta = load_rows(data_dir / TRAIN_FILE, config.block_size)
    init_dir = prepare_init(config, rt)
    objective, trainable, a2d = build_model(config, init_dir, rt)
    if a2d.block_size != config.block_size:
        raise A2DError(f"{init_dir}/config.json: a2d.block_size is {a2d.block_size}, --block-size is {config.block_size}; make them equal")
    seq_len = int(meta["seq_len"])
    max_positions = objective.model.config.max_position_embeddings
    if seq_len > max_positions:
        raise A2DError(f"{data_dir / TRAIN_FILE}: rows of {seq_len} tokens exceed the model's max_position_embeddings {max_positions}; rebuild the data with a smaller --seq-len")
    config = replace(config, shift_logits=a2d.shift_logits)
    objective.config = config
    schedule = RowSchedule(arrays, config, a2d.mask_token_id)
    objective.layout = schedule.layout
    heldout = load_rows(data_dir / HELDOUT_FILE, config.block_size)[0] if (data_dir / HELDOUT_FILE).is_file() else None
    accum = accumulation_steps(config, rt)
    optimizer = make_optimizer(config, trainable, rt.device)

    def stage_inputs() -> dict[str, Any]:
        previous = lin.read_lineage_or_root(init_dir)
        init_files = {
            f"init/{name}": {**rec, "from_previous": bool(previous["stages"])} for name, rec in lin.hash_folder(init_dir).items()
        }
        data_files = {
            f"data/{name}": lin.file_record(data_dir / name) for name in (TRAIN_FILE, MANIFEST_FILE, HELDOUT_FILE) if (data_dir / name).is_file()
        }
        warm = Path(config.init_adapter)
        warm_files = {
            f"init_adapter/{name}": lin.file_record(warm / name)
            for name in (WEIGHTS, DELTA_WEIGHTS, DELTA_JSON, "config.json") if (warm / name).is_file()
        } if config.init_adapter else {}
        return {**init_files, **data_files, **warm_files}

    inputs = on_main(rt, stage_inputs)
    step, progress = 0, {"tokens": 0, "elapsed_s": 0.0}
    if resume and (out / LATEST).is_file():
        step, progress = load_checkpoint(objective, optimizer, config, rt)
    copies = 3 if config.complementary else 2
    tokens_per_step = config.batch_rows * seq_len
    log_path = out / LOG_FILE

    def write_train_config() -> None:
        write_json(out / "train_config.json", {**asdict(config), "world_size": rt.world, "init": str(init_dir)})

    if rt.main:
        write_train_config()
        n_params = sum(p.numel() for p in objective.parameters())
        n_train = sum(p.numel() for p in trainable)
        print(json.dumps({"event": "start", "step": step, "params": n_params, "trainable": n_train, "world_size": rt.world, "device": str(rt.device), "rows": schedule.rows, "seq_len": seq_len, "accumulation": accum}), flush=True)

    started = time.perf_counter() - progress.get("elapsed_s", 0.0)
    window_start, window_tokens, window_steps = time.perf_counter(), 0, 0
    window_excluded = 0.0  # seconds of the log window spent on the profiler, not on training
    stats_sum = torch.zeros(5, device=rt.device)
    counts = np.zeros(5)  # targets, ar targets, clean rows, attended pairs clean / noisy (host: known without a sync)
    loss_sum = torch.zeros((), device=rt.device)
    last_folder = None
    bar = tqdm(total=config.max_steps, initial=step, desc="train", unit="step", disable=not rt.main, dynamic_ncols=True)

    def set_max_steps(n: int) -> None:
        """The schedule's length from here on (--steps-from-time): the LR decay, the curriculum and the stop."""
        nonlocal config
        config = replace(config, max_steps=n)
        objective.config = schedule.config = config
        progress["max_steps"] = n
        bar.total = n
        bar.refresh()
        if rt.main:
            write_train_config()

    size_at = None  # the steps between which --steps-from-time times a step, or None
    if config.steps_from_time and "max_steps" in progress:
        set_max_steps(int(progress["max_steps"]))
    elif config.steps_from_time:
        size_at = (step + SIZE_FROM, step + SIZE_FROM + SIZE_STEPS)
    size_t0 = 0.0
    if rt.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(rt.device)
    stop = False
    profile = Profile(config, out) if rt.main else None
    while step < config.max_steps and not stop:
        if profile is not None:
            profile.at_step(step)
        lr = lr_at(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        normaliser = max(schedule.global_eligible(step), 1) * (copies - 1 if config.loss_weighting == "elbo" else 1)
        for micro in range(accum):
            host_t0 = time.perf_counter()
            batch = schedule.batch(step, micro_slots(config, rt, micro))
            tensors = to_device(batch, rt.device)
            if profile is not None:
                profile.host_s += time.perf_counter() - host_t0
            if rt.distributed:
                objective.set_requires_gradient_sync(micro == accum - 1)
            with autocast(config, rt.device):
                loss, stats = objective(**tensors)
            # FSDP averages gradients over processes; scaling by world makes the result sum / normaliser.
            (loss * (rt.world / normaliser)).backward()
            stats_sum += stats.detach()
            loss_sum += loss.detach() / normaliser
            counts += (batch.pred_index.size, batch.ar_index.size, batch.clean_index.size, *batch.attended)
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, config.grad_clip if config.grad_clip > 0 else float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if profile is not None:
            profile.at_step(step)
            window_excluded += profile.take_overhead()
        window_tokens += tokens_per_step
        window_steps += 1
        progress["tokens"] = progress.get("tokens", 0) + tokens_per_step
        bar.update(1)
        if size_at is not None and step in size_at:
            if rt.device.type == "cuda":
                torch.cuda.synchronize(rt.device)
            now = time.perf_counter()
            if step == size_at[0]:
                size_t0 = now
            else:
                step_s = all_reduce_sum(rt, torch.tensor((now - size_t0) / SIZE_STEPS, device=rt.device)).item() / rt.world
                set_max_steps(steps_that_fit(step, step_s, config.time_limit_min * 60 - (now - started), config.log_every, config.max_steps))
                size_at = None
                if rt.main:
                    tqdm.write(json.dumps({"event": "sized", "step": step, "step_s": step_s, "max_steps": config.max_steps}))
        is_last = step == config.max_steps
        if step % config.log_every == 0 or is_last:
            reduced = all_reduce_sum(rt, torch.cat([stats_sum, loss_sum[None], torch.tensor(counts, device=rt.device, dtype=torch.float32)]))
            values = reduced.tolist()  # the one host sync per log interval
            now = time.perf_counter()
            window_s = max(now - window_start - window_excluded, 1e-9)
            if hasattr(grad_norm, "full_tensor"):
                grad_norm = grad_norm.full_tensor()
            record = {
                "step": step,
                "loss": values[5] / window_steps,
                "ce": values[0] / max(values[6], 1.0),
                "lr": lr,
                "grad_norm": float(grad_norm),
                "tokens": progress["tokens"],
                "tokens_per_s": window_tokens / window_s,
                "model_tflops": model_flops(objective, config, window_steps * config.batch_rows, values[6], (values[9], values[10]))
                / window_s / 1e12,
                "elapsed_s": now - started,
            }
            record["mfu"] = record["model_tflops"] / config.peak_tflops
            if config.kl_weight > 0:
                record["kl"] = values[1] / max(values[6], 1.0)
            if config.ar_weight > 0:
                record["ar_ce"] = values[2] / max(values[7], 1.0)
            if config.confidence_weight > 0:
                record["certainty"] = values[3] / max(values[6], 1.0)
            if config.clean_kl_weight > 0:
                record["clean_kl"] = values[4] / max(values[8], 1.0)
            if rt.device.type == "cuda":
                record["peak_mem_gb"] = torch.cuda.max_memory_allocated(rt.device) / 2**30
            stats_sum.zero_()
            loss_sum.zero_()
            counts[:] = 0
            window_start, window_tokens, window_steps, window_excluded = now, 0, 0, 0.0
            if heldout is not None and config.eval_every and step % config.eval_every == 0:
                record["eval_ce"] = evaluate(objective, heldout, config, rt, a2d.mask_token_id)
            if config.time_limit_min > 0:
                over = torch.tensor(float(now - started > config.time_limit_min * 60), device=rt.device)
                stop = bool(all_reduce_sum(rt, over).item() > 0)
                record["time_limit_reached"] = stop
            if rt.main:
                line = json.dumps(record)
                with open(log_path, "a") as f:
                    f.write(line + "\n")
                tqdm.write(line)
                bar.set_postfix(loss=f"{record['loss']:.3f}", ce=f"{record['ce']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
        progress["elapsed_s"] = time.perf_counter() - started
        if (config.save_every and step % config.save_every == 0) or step == config.max_steps or stop:
            if heldout is not None and (step == config.max_steps or stop):
                progress["eval_ce"] = evaluate(objective, heldout, config, rt, a2d.mask_token_id)
            last_folder = save_checkpoint(objective, optimizer, config, rt, step, dict(progress), init_dir, inputs)
            window_start, window_excluded = time.perf_counter(), 0.0  # throughput counts training, not saving
    bar.close()
    if last_folder is None:
        last_folder = Path(config.out) / read_json(Path(config.out) / LATEST)["path"]
    if rt.main:
        print(json.dumps({"event": "done", "step": step, "checkpoint": str(last_folder), **{k: v for k, v in progress.items()}}), flush=True)
    return last_folder


