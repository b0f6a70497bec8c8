"""`init`: an untrained a2d model from an AR checkpoint (docs/model-format.md).

Nothing is trained: the weights are the base's, plus a mask token. The mask goes into the first
embedding row the tokenizer never emits when the base pads its vocabulary (MiniCPM5 does), otherwise
into a new row appended to the embedding (and a zero row to an untied lm_head), growing vocab_size by
one. Its embedding is the mean of the embedding rows of the tokens the tokenizer can emit, in fp32,
rounded to bf16: padding rows were never trained, so they are left out of the mean. Decoders never
produce the mask (its logit is -inf), so its lm_head row does not matter.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from .config import A2DSection, load_config, read_json, write_json
from .decoding import DecodingDefaults
from .errors import A2DError
from .tiny import check_out_dir, staged_out_dir

MAX_BLOCK_SIZE = 64

COPIED_FILES = ("generation_config.json", "special_tokens_map.json", "chat_template.jinja", "chat_template.json")


def token_ids_of(tokenizer_json: dict) -> dict[str, int]:
    """Every token text -> id in a tokenizer.json (model vocab and added tokens)."""
    vocab = dict(tokenizer_json.get("model", {}).get("vocab") or {})
    if isinstance(tokenizer_json.get("model", {}).get("vocab"), list):  # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(tokenizer_json["model"]["vocab"])}
    for added in tokenizer_json.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    return vocab


def eos_token_ids(base: Path, raw_config: dict, tok_config: dict, ids: dict[str, int]) -> list[int]:
    """EOS ids: generation_config.json's eos_token_id, then the tokenizer's eos token, then config.json's."""
    found: list[int] = []

    def add(value) -> None:
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool) and v not in found:
                found.append(v)

    gen_path = base / "generation_config.json"
    if gen_path.is_file():
        add(read_json(gen_path).get("eos_token_id"))
    eos = tok_config.get("eos_token")
    eos_text = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos_text, str) and eos_text in ids:
        add(ids[eos_text])
    if not found:
        add(raw_config.get("eos_token_id"))
    if not found:
        raise A2DError(
            f"{base}: no EOS token in generation_config.json, tokenizer_config.json or config.json; "
            "set eos_token_id in generation_config.json"
        )
    return found


def add_mask_to_tokenizer(tokenizer_json: dict, tok_config: dict, mask_token: str, mask_id: int) -> None:
    entry = {
        "id": mask_id,
        "content": mask_token,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    tokenizer_json.setdefault("added_tokens", []).append(entry)
    decoder = tok_config.setdefault("added_tokens_decoder", {})
    decoder[str(mask_id)] = {k: v for k, v in entry.items() if k != "id"}
    tok_config["mask_token"] = mask_token


def check_mask_encoding(tokenizer_json: dict, mask_token: str, mask_id: int, path: Path) -> None:
    """The edited tokenizer must load and map the mask text to exactly the mask id."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(json.dumps(tokenizer_json))
    got = tokenizer.encode(mask_token, add_special_tokens=False).ids
    if got != [mask_id]:
        raise A2DError(f"{path}: adding {mask_token!r} as id {mask_id} encodes it as {got}; pass another --mask-token")


def init_model(base: Path, out: Path, block_size: int = 4, shift_logits: bool = True, mask_token: str = "<|mask|>", force: bool = False) -> Path:
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise A2DError(f"--block-size {block_size} must be in 1..{MAX_BLOCK_SIZE}")
    cfg, a2d, raw = load_config(base)
    if a2d is not None:
        raise A2DError(f"{base / 'config.json'}: already an a2d model (it has an 'a2d' section); pass the AR base as --base")
    if out.resolve() == base.resolve() or base.resolve().is_relative_to(out.resolve()):
        raise A2DError(f"--out {out} would overwrite the base {base}; choose another --out")
    check_out_dir(out, force)
    tokenizer_json = read_json(base / "tokenizer.json")
    tok_config = read_json(base / "tokenizer_config.json")
    ids = token_ids_of(tokenizer_json)
    if mask_token in ids:
        raise A2DError(f"{base / 'tokenizer.json'}: already has a token {mask_token!r}; pass another --mask-token")
    emitted_rows = max(ids.values()) + 1
    if emitted_rows > cfg.vocab_size:
        raise A2DError(
            f"{base}: tokenizer.json has ids up to {emitted_rows - 1} but config.json vocab_size is {cfg.vocab_size}; "
            "the tokenizer does not belong to these weights"
        )
    eos_ids = eos_token_ids(base, raw, tok_config, ids)

    # torch only now: a bad config or tokenizer is reported without paying for its import.
    import torch
    from safetensors.torch import save_file

    from .weights import check_tensors, read_tensors

    tensors = read_tensors(base)
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        # Some tied checkpoints also store the (identical) lm_head; the format says it is absent.
        if not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"]):
            raise A2DError(f"{base}: tie_word_embeddings is true but lm_head.weight differs from the embeddings; fix config.json")
        del tensors["lm_head.weight"]
    check_tensors(tensors, cfg, base)

    embed = tensors["model.embed_tokens.weight"]
    mask_row = embed[:emitted_rows].to(torch.float32).mean(dim=0).to(torch.bfloat16)
    tensors = {name: t.to(torch.bfloat16) for name, t in tensors.items()}
    vocab_size = cfg.vocab_size
    if emitted_rows < cfg.vocab_size:
        mask_id = emitted_rows
        tensors["model.embed_tokens.weight"][mask_id] = mask_row
    else:
        mask_id, vocab_size = cfg.vocab_size, cfg.vocab_size + 1
        tensors["model.embed_tokens.weight"] = torch.cat([tensors["model.embed_tokens.weight"], mask_row[None]])
        if not cfg.tie_word_embeddings:
            head = tensors["lm_head.weight"]
            tensors["lm_head.weight"] = torch.cat([head, head.new_zeros(1, head.shape[1])])

    add_mask_to_tokenizer(tokenizer_json, tok_config, mask_token, mask_id)
    check_mask_encoding(tokenizer_json, mask_token, mask_id, base / "tokenizer.json")
    section = A2DSection(
        mask_token_id=mask_id,
        mask_token=mask_token,
        block_size=block_size,
        shift_logits=shift_logits,
        eos_token_ids=tuple(eos_ids),
        trained=False,
        decoding=DecodingDefaults(),
    )
    raw = {k: v for k, v in raw.items() if k != "torch_dtype"}
    raw.update(vocab_size=vocab_size, dtype="bfloat16", a2d=section.to_dict())

    with staged_out_dir(out, force) as work:
        save_file({name: t.contiguous() for name, t in tensors.items()}, str(work / "model.safetensors"), metadata={"format": "pt"})
        (work / "model.safetensors").chmod(0o644)  # the writer creates 0600 files; model folders are shared and packed
        write_json(work / "config.json", raw)
        write_json(work / "tokenizer.json", tokenizer_json)
        write_json(work / "tokenizer_config.json", tok_config)
        for name in COPIED_FILES:
            if (base / name).is_file():
                shutil.copyfile(base / name, work / name)
    return out


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("init", help="make an untrained a2d model from an AR checkpoint (adds the mask token)")
    p.add_argument("--base", type=Path, required=True, help="HF folder of the AR base model")
    p.add_argument("--out", type=Path, required=True, help="new a2d model folder (must be empty unless --force)")
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--no-shift-logits", dest="shift_logits", action="store_false", help="predict position i from hidden state i, not i-1")
    p.add_argument("--mask-token", default="<|mask|>")
    p.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    out = init_model(args.base, args.out, args.block_size, args.shift_logits, args.mask_token, args.force)
    print(out)
