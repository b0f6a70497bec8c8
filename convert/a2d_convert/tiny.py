"""`tiny-base`: a tiny random autoregressive HF base model with a real tokenizer, for tests.

The folder is what a real AR checkpoint looks like (no `a2d` section): config.json, bf16
model.safetensors, a byte-level BPE tokenizer.json trained with the `tokenizers` library on a small
built-in English corpus, a ChatML chat template in tokenizer_config.json, generation_config.json.
Everything derives from the arguments alone (numpy's PCG64 for the weights, a deterministic BPE
trainer), so the same arguments write byte-identical files. It imports no torch and takes well under
a second, so other test suites can build models freely.

Weights: projections ~ N(0, init_std); embeddings and lm_head ~ N(0, (logit_scale / sqrt(hidden))^2),
which after the final RMSNorm gives logits with standard deviation ~ logit_scale: peaky enough that
confidence thresholds are crossed some of the time. Norm weights ~ 1 + N(0, 0.1^2) so that a backend
ignoring them fails its comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from .config import write_json
from .errors import A2DError

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"

# A ChatML template in MiniCPM's shape: one `<|im_start|>role\n...<|im_end|>\n` per message; the
# generation prompt opens the assistant turn, and `enable_thinking=false` pre-fills an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model learns the shape of words before it learns
their meaning. Block diffusion writes several tokens at once: each block starts as masks, and the model
reveals the positions it is most sure of, step by step, until the block is done.
What is the capital of France? The capital of France is Paris. What is two plus two? Two plus two is four.
Let me think about this step by step. First, read the question. Then, write the answer. Finally, check it.
The sun rises in the east and sets in the west. Water boils at one hundred degrees at sea level.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024. Math: 3 + 4 = 7, 6 * 7 = 42, 10 / 2 = 5.
def add(a, b):
    return a + b
for i in range(10):
    print(i, add(i, i))
Hello! How are you today? I am fine, thank you. Could you help me with my homework, please?
Sure. The answer is (B). The options are A, B, C and D; only one of them is right.
Once upon a time there was a cat who sat on a mat and watched the rain fall on the garden.
The user asks a question, and the assistant answers it clearly, in short sentences, without rambling.
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape and seed of a tiny base model."""

    arch: str = "llama"  # llama | qwen2 | qwen3
    layers: int = 2
    hidden: int = 64
    intermediate: int = 128
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 0  # 0: hidden / heads (written to config.json either way)
    tie_embeddings: bool = False
    attention_bias: bool = False  # llama/qwen3: q, k, v, o biases (qwen2 always has q, k, v biases)
    bpe_vocab: int = 320  # target size of the trained BPE vocabulary (bytes + merges + specials)
    vocab_multiple: int = 64  # pad the embedding to a multiple of this, as MiniCPM does; 1: no padding
    init_std: float = 0.1
    logit_scale: float = 8.0
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    seed: int = 0


def build_tokenizer(bpe_vocab: int):
    """A byte-level BPE tokenizer with ChatML specials; `<think>`/`</think>` are added but not special."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab,
        special_tokens=[END_OF_TEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in (THINK, END_THINK)])
    return tokenizer


def tokenizer_size(tokenizer) -> int:
    """Rows the tokenizer can emit: one past its largest id."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def random_weights(spec: TinySpec, vocab_size: int) -> dict[str, np.ndarray]:
    """fp32 weights in HF names, drawn in a fixed order from PCG64(seed)."""
    rng = np.random.default_rng(spec.seed)
    head_dim = spec.head_dim or spec.hidden // spec.heads
    q_dim, kv_dim, h = spec.heads * head_dim, spec.kv_heads * head_dim, spec.hidden
    qkv_bias = spec.attention_bias or spec.arch == "qwen2"
    o_bias = spec.attention_bias and spec.arch != "qwen2"
    emb_std = spec.logit_scale / np.sqrt(h)

    def normal(shape, std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    def norm_weight(n):
        return (1.0 + rng.normal(0.0, 0.1, size=n)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((vocab_size, h), emb_std)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight(h)
        for name, rows in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
            w[p + f"self_attn.{name}.weight"] = normal((rows, h), spec.init_std)
            if qkv_bias:
                w[p + f"self_attn.{name}.bias"] = normal((rows,), spec.init_std)
        w[p + "self_attn.o_proj.weight"] = normal((h, q_dim), spec.init_std)
        if o_bias:
            w[p + "self_attn.o_proj.bias"] = normal((h,), spec.init_std)
        if spec.arch == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm_weight(head_dim)
            w[p + "self_attn.k_norm.weight"] = norm_weight(head_dim)
        w[p + "post_attention_layernorm.weight"] = norm_weight(h)
        w[p + "mlp.gate_proj.weight"] = normal((spec.intermediate, h), spec.init_std)
        w[p + "mlp.up_proj.weight"] = normal((spec.intermediate, h), spec.init_std)
        w[p + "mlp.down_proj.weight"] = normal((h, spec.intermediate), spec.init_std)
    w["model.norm.weight"] = norm_weight(h)
    if not spec.tie_embeddings:
        w["lm_head.weight"] = normal((vocab_size, h), emb_std)
    return w


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even (what torch's .to(bfloat16) does for finite values)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    from safetensors import TensorSpec, serialize_file

    # serialize_file reads raw memory: `encoded` keeps every buffer alive until it returns.
    encoded = {name: bf16_bits(t) for name, t in tensors.items()}
    specs = {
        name: TensorSpec(dtype="bfloat16", shape=list(a.shape), data_ptr=a.ctypes.data, data_len=a.nbytes)
        for name, a in encoded.items()
    }
    serialize_file(specs, str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # the writer creates 0600 files; model folders are meant to be shared and packed


def config_json(spec: TinySpec, vocab_size: int, ids: dict[str, int]) -> dict:
    head_dim = spec.head_dim or spec.hidden // spec.heads
    config = {
        "architectures": [ARCHITECTURES[spec.arch]],
        "model_type": spec.arch,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_theta": spec.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": spec.tie_embeddings,
        "vocab_size": vocab_size,
        "bos_token_id": None,
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[END_OF_TEXT],
        "attention_dropout": 0.0,
        "dtype": "bfloat16",
        "use_cache": True,
    }
    if spec.arch != "qwen2":
        config["attention_bias"] = spec.attention_bias
    if spec.arch == "llama":
        config["mlp_bias"] = False
    else:
        config["use_sliding_window"] = False
    return config


def tokenizer_config_json(tokenizer) -> dict:
    decoder = {}
    for token in (END_OF_TEXT, IM_START, IM_END, THINK, END_THINK):
        decoder[str(tokenizer.token_to_id(token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token not in (THINK, END_THINK),
        }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }


def check_spec(spec: TinySpec) -> None:
    if spec.arch not in ARCHITECTURES:
        raise A2DError(f"--arch {spec.arch!r}: unknown architecture; use one of {', '.join(ARCHITECTURES)}")
    for name in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab_multiple"):
        if getattr(spec, name) < 1:
            raise A2DError(f"--{name.replace('_', '-')} must be at least 1")
    if spec.heads % spec.kv_heads:
        raise A2DError(f"--kv-heads {spec.kv_heads} must divide --heads {spec.heads}")
    head_dim = spec.head_dim or spec.hidden // spec.heads
    if not spec.head_dim and spec.hidden % spec.heads:
        raise A2DError(f"--hidden {spec.hidden} is not a multiple of --heads {spec.heads}; pass --head-dim")
    if head_dim % 2:
        raise A2DError(f"head dim {head_dim} must be even (rotary embeddings); pass an even --head-dim")
    if spec.bpe_vocab < 280:
        raise A2DError(f"--bpe-vocab {spec.bpe_vocab} is too small: 256 byte tokens + 3 specials need at least 280")


def make_tiny_base(out: Path, spec: TinySpec = TinySpec(), force: bool = False) -> Path:
    """Write a tiny random AR base model folder to `out` and return it."""
    check_spec(spec)
    with staged_out_dir(out, force) as work:
        tokenizer = build_tokenizer(spec.bpe_vocab)
        ids = {t: tokenizer.token_to_id(t) for t in (END_OF_TEXT, IM_START, IM_END, THINK, END_THINK)}
        size = tokenizer_size(tokenizer)
        vocab_size = -(-size // spec.vocab_multiple) * spec.vocab_multiple
        write_bf16_safetensors(work / "model.safetensors", random_weights(spec, vocab_size))
        tokenizer.save(str(work / "tokenizer.json"))
        write_json(work / "config.json", config_json(spec, vocab_size, ids))
        write_json(work / "tokenizer_config.json", tokenizer_config_json(tokenizer))
        write_json(work / "generation_config.json", {"eos_token_id": [ids[END_OF_TEXT], ids[IM_END]], "pad_token_id": ids[END_OF_TEXT]})
    return out


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse a non-folder `out`, and a non-empty one unless `force`."""
    if out.exists() and not out.is_dir():
        raise A2DError(f"{out}: exists and is not a folder; choose another --out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise A2DError(f"{out}: folder is not empty; choose an empty --out or pass --force to overwrite it")


@contextlib.contextmanager
def staged_out_dir(out: Path, force: bool) -> Iterator[Path]:
    """An empty folder beside `out` (`.NAME.partial`) for a stage to write its output into. When the block
    completes it takes `out`'s place (a non-empty `out` only with `force`; the old one is moved aside, then
    deleted). When the block fails it is deleted and `out` is left as it was; after a kill the next run
    with the same `out` deletes it. So no interrupted stage leaves a half-written `out`."""
    out = Path(out)
    check_out_dir(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging, old = out.parent / f".{out.name}.partial", out.parent / f".{out.name}.old"
    for leftover in (staging, old):
        if leftover.exists():
            shutil.rmtree(leftover)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("tiny-base", help="write a tiny random AR base model (HF folder) for tests")
    defaults = TinySpec()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arch", choices=sorted(ARCHITECTURES), default=defaults.arch)
    p.add_argument("--layers", type=int, default=defaults.layers)
    p.add_argument("--hidden", type=int, default=defaults.hidden)
    p.add_argument("--intermediate", type=int, default=defaults.intermediate)
    p.add_argument("--heads", type=int, default=defaults.heads)
    p.add_argument("--kv-heads", type=int, default=defaults.kv_heads)
    p.add_argument("--head-dim", type=int, default=defaults.head_dim, help="0: hidden / heads")
    p.add_argument("--tie-embeddings", "--tied", action="store_true")
    p.add_argument("--attention-bias", action="store_true", help="llama/qwen3: q, k, v, o biases")
    p.add_argument("--bpe-vocab", type=int, default=defaults.bpe_vocab)
    p.add_argument("--vocab-multiple", type=int, default=defaults.vocab_multiple, help="1: no padding rows")
    p.add_argument("--init-std", type=float, default=defaults.init_std)
    p.add_argument("--logit-scale", type=float, default=defaults.logit_scale)
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    spec = TinySpec(
        arch=args.arch,
        layers=args.layers,
        hidden=args.hidden,
        intermediate=args.intermediate,
        heads=args.heads,
        kv_heads=args.kv_heads,
        head_dim=args.head_dim,
        tie_embeddings=args.tie_embeddings,
        attention_bias=args.attention_bias,
        bpe_vocab=args.bpe_vocab,
        vocab_multiple=args.vocab_multiple,
        init_std=args.init_std,
        logit_scale=args.logit_scale,
        seed=args.seed,
    )
    out = make_tiny_base(args.out, spec, force=args.force)
    print(out)


def add_random_adapter(model_dir: Path, rule: str, rank: int, seed: int, b_std: float = 0.05) -> None:
    """Give an a2d model folder a random row adapter of `rule` ("mask" or "window") on every projection
    (docs/model-format.md) for parity tests: A [rank, in] ~ N(0, 1/in), B [out, rank] ~ N(0, b_std^2), bf16,
    written beside the existing weights, and the config's a2d.<rule>_adapter."""
    from safetensors.torch import load_file

    from .config import ADAPTER_TARGETS, AdapterSpec, read_json

    spec = AdapterSpec(rule, rank, ADAPTER_TARGETS)
    a_name, b_name = spec.factor_names
    path = model_dir / "model.safetensors"
    tensors = {name: t.float().numpy() for name, t in load_file(str(path)).items()}
    rng = np.random.default_rng(seed)
    for name in sorted(tensors):
        stem, _, leaf = name.rpartition(".")
        target = stem.rsplit(".", 1)[-1]
        if leaf != "weight" or target not in ADAPTER_TARGETS or ".layers." not in name:
            continue
        out_features, in_features = tensors[name].shape
        tensors[f"{stem}.{a_name}"] = rng.normal(0.0, 1.0 / np.sqrt(in_features), size=(rank, in_features)).astype(np.float32)
        tensors[f"{stem}.{b_name}"] = rng.normal(0.0, b_std, size=(out_features, rank)).astype(np.float32)
    write_bf16_safetensors(path, tensors)
    config = read_json(model_dir / "config.json")
    config["a2d"][spec.section] = {"rank": rank, "targets": list(ADAPTER_TARGETS)}
    write_json(model_dir / "config.json", config)
