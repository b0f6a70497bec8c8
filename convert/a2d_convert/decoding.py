"""The decoding parameters, defined once for every part of a2d (engine/decoding-params.json, linked here as
decoding_params.json): names, ranges, choices and defaults come from the table. `DecodingDefaults` is a model's
default decoding (config.json a2d.decoding: every table parameter that has a default; a test holds the two
together), `DecodeParams` every parameter of one generation, checked by the table's ranges and its cross-field
rules. Below both the model config (config.py) and the decode loop (decode.py), which read them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .errors import A2DError
from .rng import MASK64

DECODING_TABLE_PATH = Path(__file__).with_name("decoding_params.json")  # a link to engine/decoding-params.json
DECODING_TABLE = json.loads(DECODING_TABLE_PATH.read_text(encoding="utf-8"))
DECODING_PARAMETERS = {p["name"]: p for p in DECODING_TABLE["parameters"] + DECODING_TABLE["request_parameters"]}
REMASKING = tuple(DECODING_PARAMETERS["remasking"]["choices"])
ADVANCE = tuple(DECODING_PARAMETERS["advance"]["choices"])
COMMIT = tuple(DECODING_PARAMETERS["commit"]["choices"])


# What earlier a2d versions had and this one refuses with a reason: drafts confirmed by a causal reading of
# the tokens before them are speculative (left-to-right) decoding, not denoising.
RETIRED_REMASKING = ("verify", "tree")
RETIRED_DECODING_FIELDS = ("tree_width", "lookup_ngram")
RETIRED_RULES_NOTE = ("remasking 'verify' and 'tree' and their lookup drafts are gone: they kept a token only when a causal "
                      "reading of the tokens before it chose it too, which is left-to-right decoding with a drafter; "
                      "decode by the denoiser's own confidence instead (remasking low_confidence, random or leftmost; "
                      "`python -m a2d_convert redecode` changes a model's default)")


@dataclass(frozen=True)
class DecodingDefaults:
    """A model's default decoding (config.json a2d.decoding): every table parameter that has a default."""

    threshold: float = DECODING_PARAMETERS["threshold"]["default"]
    min_per_step: int = DECODING_PARAMETERS["min_per_step"]["default"]
    steps: int = DECODING_PARAMETERS["steps"]["default"]
    temperature: float = DECODING_PARAMETERS["temperature"]["default"]
    top_p: float = DECODING_PARAMETERS["top_p"]["default"]
    remasking: str = DECODING_PARAMETERS["remasking"]["default"]
    advance: str = DECODING_PARAMETERS["advance"]["default"]
    commit: str = DECODING_PARAMETERS["commit"]["default"]
    reveal_order: str = DECODING_PARAMETERS["reveal_order"]["default"]


# Fields a model's files hold only where they differ from the default, so that the files of models that keep the
# default stay as they were before the field existed (a rebuilt model is the same bytes).
WRITTEN_WHEN_SET = ("reveal_order",)


def written_decoding(values: dict) -> dict:
    """A decoding as config.json, decoder_config.json and probe reports write it: WRITTEN_WHEN_SET fields only
    where they are not the default."""
    return {k: v for k, v in values.items() if k not in WRITTEN_WHEN_SET or v != DECODING_PARAMETERS[k]["default"]}


def add_decoding_flags(parser) -> None:
    """One flag per DecodingDefaults field, for the commands that override a model's defaults."""
    for name in DecodingDefaults.__dataclass_fields__:
        spec = DECODING_PARAMETERS[name]
        flag = "--" + name.replace("_", "-")
        if spec["type"] == "choice":
            parser.add_argument(flag, choices=spec["choices"], help=spec["doc"])
        else:
            parser.add_argument(flag, type=int if spec["type"] == "integer" else float, help=spec["doc"])


def decoding_flags(args) -> dict:
    """The add_decoding_flags values by field name; None where the flag was left out (the default holds)."""
    return {name: getattr(args, name) for name in DecodingDefaults.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True)
class DecodeParams(DecodingDefaults):
    """Every parameter of docs/decoding.md "Parameters": the ones a model sets defaults for (inherited)
    and the per-request ones; nothing is left to model defaults here."""

    max_tokens: int
    block_size: int = 4
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()

    @staticmethod
    def from_defaults(defaults: DecodingDefaults, *, block_size: int, max_tokens: int, eos_token_ids: Sequence[int], **overrides) -> "DecodeParams":
        """The model's `a2d` defaults, with request overrides (None means: keep the default)."""
        fields = {name: getattr(defaults, name) for name in DecodingDefaults.__dataclass_fields__}
        fields.update(block_size=block_size, max_tokens=max_tokens, eos_token_ids=tuple(eos_token_ids))
        fields.update({k: (tuple(v) if k == "eos_token_ids" else v) for k, v in overrides.items() if v is not None})
        return DecodeParams(**fields)

    def validate(self, where: str = "decode parameters") -> "DecodeParams":
        """The ranges and choices of engine/decoding-params.json, then its cross-field rules; raises
        A2DError naming `where`, the field (or rule) and what it must be."""
        for spec in DECODING_PARAMETERS.values():
            problem = table_problem(spec, getattr(self, spec["name"]), self.block_size)
            if problem:
                raise A2DError(f"{where}: {spec['name']} is {getattr(self, spec['name'])!r}, it must be {problem}")
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in self.eos_token_ids):
            raise A2DError(f"{where}: eos_token_ids is {self.eos_token_ids!r}, it must be a list of token ids")
        broken = broken_rule(self)
        if broken:
            raise A2DError(f"{where}: {broken}: {RULES[broken]}")
        return self


RULES = {rule["id"]: rule["message"] for rule in DECODING_TABLE["rules"]}


def table_problem(spec: dict, value, block_size) -> str | None:
    """What `value` must be by its table entry (engine/decoding-params.json), or None when it is fine."""
    if spec["type"] == "choice":
        if value in spec["choices"]:
            return None
        retired = f" ({RETIRED_RULES_NOTE})" if spec["name"] == "remasking" and value in RETIRED_REMASKING else ""
        return f"one of {', '.join(spec['choices'])}{retired}"
    integer = isinstance(value, int) and not isinstance(value, bool)
    if spec["type"] == "integer" and not integer:
        return "an integer"
    if spec["type"] == "number" and not ((integer or isinstance(value, float)) and math.isfinite(value)):
        return "a finite number"
    low = spec["min"]
    high = {"block_size": block_size, "2^64-1": MASK64, None: math.inf}.get(spec.get("max"), spec.get("max"))
    above_low = value > low if spec.get("min_exclusive") else value >= low
    if above_low and value <= high:
        return None
    if high == math.inf:
        return f">= {low}"
    bound = {"block_size": f"block_size ({block_size})"}.get(spec.get("max"), spec.get("max"))
    return f"in {'(' if spec.get('min_exclusive') else '['}{low}, {bound}]"


def broken_rule(p: "DecodeParams") -> str | None:
    """The id of the first cross-field rule of the table these (in-range) parameters break, or None."""
    one_by_one = p.min_per_step == 1 and (p.steps == 0 or p.steps >= p.block_size)
    if (p.remasking == "leftmost" or p.reveal_order == "prefix") and p.threshold >= 1 and one_by_one:
        return "left_to_right"
    if p.advance == "slide" and p.steps > 0:
        return "schedule_needs_blocks"
    return None
