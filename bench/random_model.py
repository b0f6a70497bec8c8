"""A plain AR checkpoint of a known shape with random bf16 weights (N(0, 0.02), norms 1) and the tiny base's
tokenizer, plus a JSONL of synthetic text to train on: what the trainer's speed is measured on where the real
checkpoint is not at hand (the MiniCPM5-2B shape on one GPU, bench/device-train-speed.sh). The weights are drawn on
the GPU when there is one (seconds for 2.5 B values).

    python3 bench/random_model.py --shape minicpm5-2b --out DIR [--text-rows 512] [--set num_hidden_layers=2 ...]

`--set FIELD=VALUE` changes one architecture field (VALUE read as JSON): a CPU rehearsal of a 2B-shape run keeps
the vocabulary and heads and cuts the layers and widths.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))

SHAPES = {  # architecture fields of config.json
    "minicpm5-2b": dict(num_hidden_layers=42, hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
                        num_key_value_heads=2, head_dim=128, vocab_size=130560, rope_theta=5e6, tie_word_embeddings=False),
    "smollm2-135m": dict(num_hidden_layers=30, hidden_size=576, intermediate_size=1536, num_attention_heads=9,
                         num_key_value_heads=3, head_dim=64, vocab_size=49152, rope_theta=1e5, tie_word_embeddings=True),
}
WORDS = ("the a of to and in is it that was for on are as with his they at be this from have or by one had not but what "
         "all were when we there can an your which their said if do will each about how up out them then she many some so "
         "these would other into has more her two like him see time could no make than first been its who now people my "
         "made over did down only way find use may water long little very after words called just where most know").split()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--text-rows", type=int, default=512, help="lines of synthetic text written to OUT/text.jsonl")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change one of the shape's architecture fields (VALUE as JSON); repeatable")
    args = parser.parse_args()

    import torch
    from safetensors.torch import save_file

    from a2d_convert.tiny import make_tiny_base

    shape = dict(SHAPES[args.shape])
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep or field not in shape:
            parser.error(f"--set {item!r}: give FIELD=VALUE with FIELD one of {', '.join(sorted(shape))}")
        shape[field] = json.loads(value)
    out = args.out
    tokenizer_base = make_tiny_base(out.parent / f".{out.name}-tokenizer", force=True)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tokenizer_base / name).read_bytes())
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **shape, "rms_norm_eps": 1e-6,
              "max_position_embeddings": 8192, "attention_bias": False, "hidden_act": "silu", "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2}
    (out / "config.json").write_text(json.dumps(config, indent=1))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device).manual_seed(0)
    H, I, V = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    q, kv = shape["num_attention_heads"] * shape["head_dim"], shape["num_key_value_heads"] * shape["head_dim"]
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not shape["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, H)
    for l in range(shape["num_hidden_layers"]):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                       p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)})
    tensors = {}
    for name, dims in shapes.items():
        if len(dims) == 1:
            tensors[name] = torch.ones(dims, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(dims, generator=generator, device=device) * 0.02).to(torch.bfloat16).cpu()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    rng = random.Random(0)
    if args.text_rows:
        with open(out / "text.jsonl", "w") as f:
            for _ in range(args.text_rows):
                f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(300, 900)))}) + "\n")
    params = sum(t.numel() for t in tensors.values())
    print(json.dumps({"out": str(out), "shape": args.shape, "params": params, "device": device}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
