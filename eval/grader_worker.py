"""The Python side of `a2d eval`: a long-lived worker answering one JSON request per stdin line with one
JSON line on stdout, in order. It runs in the project venv (math-verify, sympy) and never executes
model-written code; that happens in the sandbox (eval/sandbox.ts, eval/sandbox_driver.py).

Requests:
  {"op": "math", "gold": "<MATH answer>", "answer": "<final answer text>"}
      -> {"correct": bool, "extracted": str | null}
     math-verify parses the gold answer as if boxed and the response with \\boxed{} matched first (the
     prompt asks for it; a plain final expression is the fallback), then checks mathematical
     equivalence (fractions, decimals, intervals, sets...).
  {"op": "lcb_tests", "data": "<private_test_cases field>"}
      -> {"tests": [{"input", "output", "testtype"}, ...]}
     The field is either a JSON list or, as published for LiveCodeBench, base64(zlib(pickle(json str))).
  {"op": "lcb_stdout", "got": "<captured stdout>", "expected": "<test output>"}
  {"op": "lcb_call", "got": <tagged value from eval/sandbox_driver.py>, "expected": "<JSON text>"}
      -> {"pass": bool, "reason": str | null}
     LiveCodeBench's rules (lcb_runner testing_util.py): stdout and expected are stripped, split on
     newlines and each line stripped; the line counts must match and every line must be equal as text or,
     split on whitespace, equal as a list of Decimals. A functional result (a tuple counted as a list)
     must == json.loads(expected).
  {"op": "gpqa_permutations", "count": n}
      -> {"permutations": [[...4 ints], ...]}
     simple-evals' GPQA shuffles: random.Random(0), then rng.sample(range(4), 4) for each row in order.
Errors answer {"error": "<message>"}; the worker keeps serving.
"""

import base64
import io
import json
import pickle
import random
import sys
import zlib
from decimal import Decimal

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify


class _StringsOnlyUnpickler(pickle.Unpickler):
    """The published payload is a pickled str; refusing every global makes loading it inert."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"private_test_cases may only hold plain data, found {module}.{name}")


def decode_tests(data):
    text = data.strip()
    if not text.startswith("["):
        raw = zlib.decompress(base64.b64decode(text))
        text = _StringsOnlyUnpickler(io.BytesIO(raw)).load()
        if isinstance(text, bytes):
            text = text.decode("utf-8")
    tests = json.loads(text)
    if not isinstance(tests, list):
        raise ValueError("private_test_cases must decode to a JSON list of test cases")
    return tests


_GOLD_CONFIG = [LatexExtractionConfig()]
_ANSWER_CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def grade_math(gold, answer):
    gold_parsed = parse("\\boxed{" + gold + "}", extraction_config=_GOLD_CONFIG)
    if not gold_parsed:
        raise ValueError(f"math-verify cannot parse the gold answer {gold!r}")
    answer_parsed = parse(answer, extraction_config=_ANSWER_CONFIG)
    extracted = str(answer_parsed[-1]) if answer_parsed else None
    return {"correct": bool(answer_parsed) and bool(verify(gold_parsed, answer_parsed)), "extracted": extracted}


def _stripped_lines(text):
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line):
    try:
        return [Decimal(token) for token in line.split()]
    except Exception:
        return None


def stdout_matches(got, expected):
    got_lines, expected_lines = _stripped_lines(got), _stripped_lines(expected)
    if len(got_lines) != len(expected_lines):
        return {"pass": False, "reason": f"{len(got_lines)} lines, expected {len(expected_lines)}"}
    for number, (line, want) in enumerate(zip(got_lines, expected_lines), start=1):
        if line == want:
            continue
        got_numbers, want_numbers = _decimals(line), _decimals(want)
        try:
            same = got_numbers is not None and want_numbers is not None and got_numbers == want_numbers
        except Exception:  # a signalling NaN refuses comparison
            same = False
        if not same:
            return {"pass": False, "reason": f"line {number} differs"}
    return {"pass": True, "reason": None}


_TAGGED_SCALARS = {
    "none": lambda payload: None,
    "bool": bool,
    "int": lambda payload: int(payload, 16),
    "float": float,
    "str": str,
}


def untagged(node):
    """Builds the plain value eval/sandbox_driver.py tagged; nothing but builtins can come out."""
    kind = node[0]
    if kind in _TAGGED_SCALARS:
        payload = node[1] if len(node) > 1 else None
        wanted = bool if kind == "bool" else str if kind in ("int", "float", "str") else type(None)
        if not isinstance(payload, wanted):
            raise ValueError(f"malformed {kind} in a functional result")
        return _TAGGED_SCALARS[kind](payload)
    if kind in ("list", "tuple", "set", "frozenset"):
        items = [untagged(item) for item in node[1]]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[kind](items)
    if kind == "dict":
        return {untagged(key): untagged(item) for key, item in node[1]}
    raise ValueError(f"unknown tag {kind!r} in a functional result")


def call_result_matches(got, expected):
    try:
        value = untagged(got)
    except (ValueError, TypeError, IndexError, RecursionError) as error:
        return {"pass": False, "reason": f"unreadable result: {error}"}
    if isinstance(value, tuple):
        value = list(value)
    try:
        same = value == json.loads(expected)
    except RecursionError:
        same = False
    return {"pass": bool(same), "reason": None if same else f"got {repr(value)[:200]}"}


def gpqa_permutations(count):
    rng = random.Random(0)
    return [rng.sample(range(4), 4) for _ in range(count)]


def handle(request):
    op = request.get("op")
    if op == "math":
        return grade_math(request["gold"], request["answer"])
    if op == "lcb_tests":
        return {"tests": decode_tests(request["data"])}
    if op == "lcb_stdout":
        return stdout_matches(request["got"], request["expected"])
    if op == "lcb_call":
        return call_result_matches(request["got"], request["expected"])
    if op == "gpqa_permutations":
        return {"permutations": gpqa_permutations(int(request["count"]))}
    raise ValueError(f"unknown op {op!r}")


def main():
    # As the LiveCodeBench runner allows, for expected outputs with huge integers.
    sys.set_int_max_str_digits(50000)
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as error:  # one bad item must not stop the run; the caller reports it
            reply = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
