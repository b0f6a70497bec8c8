"""How well a converted model's window predicts its base's answers, by offset and confidence: the calibration
behind its accuracy under parallelism (docs/conversion.md).

For every answer of the base (evaluate-probes --details, the "base" lines) and every position p of it, the model
reads the prompt and the answer up to p as committed tokens and a window of `block` masks after them (the
decoder's first step of a window there), on the PyTorch reference. Each window offset's prediction is compared
with the base's token at that position. A second pass reveals the window's first position with the base's
token (the decoder's state after a correct leftmost reveal) and reads the others again.

Prints, per offset and state: how often the prediction equals the base's token, and for confidence bins how
many predictions fall there and how many of those are right. A threshold reveals what lies above it, so a
calibrated model's bins above 0.5 are mostly right; bins above the threshold that are often wrong are the
reveals that cost accuracy when several come in one step.

    .venv/bin/python bench/window_calibration.py --model /tmp/c21/model --base-answers /tmp/par21/heldout-base.jsonl
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "convert"))
from a2d_convert.config import load_config  # noqa: E402
from a2d_convert.decode import choose_token  # noqa: E402
from a2d_convert.model import BlockForward, load_transformer  # noqa: E402
from a2d_convert.prompts import load_prompt_codec  # noqa: E402

BINS = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--base-answers", type=Path, required=True, help="evaluate-probes --details lines of kind base")
    parser.add_argument("--block", type=int, default=4)
    parser.add_argument("--max-answers", type=int, default=0, help="0: all")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _, a2d, _ = load_config(args.model)
    if a2d is None or not a2d.anchor_in_window:
        print("this script reads the window adapter's (or the window rule's) layout: the anchor opens the window", file=sys.stderr)
        return 2
    codec = load_prompt_codec(args.model)
    model, _, _ = load_transformer(args.model)
    rows = [json.loads(line) for line in args.base_answers.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("kind") == "base"]
    if args.max_answers:
        rows = rows[: args.max_answers]
    B, mask = args.block, a2d.mask_token_id
    # counts[state][offset][bin] = [predictions, right]
    counts = {state: [[[0, 0] for _ in BINS[:-1]] for _ in range(B)] for state in ("all masked", "first revealed")}
    for n, row in enumerate(rows):
        if codec.chat_template is not None:
            prompt = codec.encode_chat([{"role": "user", "content": row["prompt"]}], None)
        else:
            prompt = codec.encode_plain(row["prompt"])
        answer = row["token_ids"]
        for p in range(len(answer)):
            context = prompt + answer[:p]
            for state, first in (("all masked", 0), ("first revealed", 1)):
                window = [context[-1]] + answer[p : p + first] + [mask] * (B - first)
                offsets = [j for j in range(first, B) if p + j < len(answer)]
                if not offsets:
                    continue
                with torch.no_grad():
                    logits = BlockForward(model)(context[:-1], window, [len(context) - 1 + j for j in offsets]).numpy()
                for i, j in enumerate(offsets):
                    # The decoder's own choice and confidence at temperature 0 (what its threshold compares).
                    token, c = choose_token(logits[i], mask, 0.0, 1.0, None)
                    b = next(k for k in range(len(BINS) - 1) if c < BINS[k + 1])
                    cell = counts[state][j][b]
                    cell[0] += 1
                    cell[1] += int(token == answer[p + j])
        print(f"\r{n + 1}/{len(rows)} answers", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    labels = [f"{BINS[k]:.1f}-{min(BINS[k + 1], 1.0):.1f}" for k in range(len(BINS) - 1)]
    print(f"{args.model}: {len(rows)} base answers of {args.base_answers}, block {B}")
    print("| state | offset | right | " + " | ".join(f"conf {label}: n / right" for label in labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for state, offsets in counts.items():
        for j, bins in enumerate(offsets):
            total = sum(c[0] for c in bins)
            if total == 0:
                continue
            right = sum(c[1] for c in bins)
            cells = [f"{c[0]} / {c[1] / c[0]:.2f}" if c[0] else "0" for c in bins]
            print(f"| {state} | {j} | {right / total:.2f} of {total} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "bins": BINS, "counts": counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
