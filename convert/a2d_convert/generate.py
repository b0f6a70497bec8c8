"""`generate`: the reference decoder on the command line.

`python -m a2d_convert generate --model DIR --prompt TEXT [--chat] [--no-think] ... --json` prints one
JSON object with token_ids, text, completion_tokens, forward_passes, tokens_per_forward, ms (decode
wall time, model load excluded), finish_reason and prompt_tokens. `npx a2d generate` takes the same
flags and prints the same fields, so the two can be compared token for token. Decoding flags left out
take the model's `a2d.block_size` / `a2d.decoding` / `a2d.eos_token_ids`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import load_config
from .decoding import add_decoding_flags, decoding_flags
from .errors import A2DError

DEFAULT_MAX_TOKENS = 128


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate a completion with the PyTorch reference decoder")
    p.add_argument("--model", type=Path, required=True, help="a2d model folder (docs/model-format.md)")
    p.add_argument("--prompt", required=True, help="prompt text (a user message with --chat)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--no-think", action="store_true", help="render the chat template with enable_thinking=false")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--block-size", type=int)
    add_decoding_flags(p)
    p.add_argument("--seed", type=int, default=0)
    # One thread: the reference exists to be exact, and tiny models run fastest on one core.
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--trace", action="store_true", help="include every denoising step in the JSON")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .decoding import DecodeParams

    cfg, a2d, _ = load_config(args.model)
    if a2d is None:
        raise A2DError(
            f"{args.model / 'config.json'}: no 'a2d' section, so this is an AR base, not an a2d model; "
            "make one with `python -m a2d_convert init --base DIR --out DIR`"
        )
    if args.no_think and not args.chat:
        raise A2DError("--no-think only applies to a chat prompt; add --chat")
    params = DecodeParams.from_defaults(
        a2d.decoding,
        block_size=args.block_size if args.block_size is not None else a2d.block_size,
        max_tokens=args.max_tokens,
        eos_token_ids=a2d.eos_token_ids,
        seed=args.seed,
        **decoding_flags(args),
    ).validate("generate flags")

    from .prompts import load_prompt_codec

    codec = load_prompt_codec(args.model)
    if args.chat:
        prompt_ids = codec.encode_chat([{"role": "user", "content": args.prompt}], False if args.no_think else None)
    else:
        prompt_ids = codec.encode_plain(args.prompt)
    if not prompt_ids:
        raise A2DError("--prompt encodes to no tokens; give a non-empty prompt")
    if len(prompt_ids) + params.max_tokens > cfg.max_position_embeddings:
        raise A2DError(
            f"prompt ({len(prompt_ids)} tokens) + --max-tokens {params.max_tokens} exceeds the model's "
            f"max_position_embeddings {cfg.max_position_embeddings}; lower --max-tokens"
        )

    import torch

    from .decode import decode
    from .model import BlockForward, load_transformer

    if args.threads < 1:
        raise A2DError(f"--threads {args.threads} must be at least 1")
    torch.set_num_threads(args.threads)
    model, _, _ = load_transformer(args.model)
    result = decode(
        BlockForward(model),
        prompt_ids,
        params,
        mask_token_id=a2d.mask_token_id,
        shift_logits=a2d.shift_logits,
        anchor_in_window=a2d.anchor_in_window,
        trace=args.trace,
    )
    text = codec.decode(result.token_ids)
    if not args.json:
        print(text)
        return 0
    out = {
        "token_ids": result.token_ids,
        "text": text,
        "completion_tokens": result.completion_tokens,
        "forward_passes": result.forward_passes,
        "tokens_per_forward": result.tokens_per_forward,
        "steps": result.steps,
        "revealed": result.revealed,
        "topped_up": result.topped_up,
        "ms": result.ms,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
    }
    if args.trace:
        out["trace"] = result.trace
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    return 0
