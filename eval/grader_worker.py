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
Errors answer {"error": "<message>"}; the worker keeps serving.
"""

import base64
import io
import json
import pickle
import sys
import zlib

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


def handle(request):
    op = request.get("op")
    if op == "math":
        return grade_math(request["gold"], request["answer"])
    if op == "lcb_tests":
        return {"tests": decode_tests(request["data"])}
    raise ValueError(f"unknown op {op!r}")


def main():
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as error:  # one bad item must not stop the run; the caller reports it
            reply = {"error": f"{type(error).__name__}: {error}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
