"""engine/decoding-params.json is the one definition of the decoding parameters: the converter's defaults
and validation follow it, and its shared cases hold every language's cross-field rules to the same answers."""

from __future__ import annotations

import dataclasses

import pytest

from a2d_convert.decoding import DECODING_TABLE, DecodeParams, DecodingDefaults
from a2d_convert.errors import A2DError


def test_the_defaults_are_the_table_s():
    with_default = {p["name"]: p["default"] for p in DECODING_TABLE["parameters"] if "default" in p}
    assert {f.name: f.default for f in dataclasses.fields(DecodingDefaults)} == with_default


@pytest.mark.parametrize("case", DECODING_TABLE["cases"], ids=lambda c: repr(c["params"]))
def test_the_shared_cases(case):
    params = DecodeParams(**{**DECODING_TABLE["case_defaults"], **case["params"]})
    if case.get("ok"):
        params.validate()
    else:
        with pytest.raises(A2DError, match=case["error"]):
            params.validate()


def test_a_retired_rule_is_refused_with_the_reason():
    with pytest.raises(A2DError, match="left-to-right decoding with a drafter"):
        DecodeParams(max_tokens=4, remasking="verify").validate()
