"""Runs one LiveCodeBench test of a model-written program, inside the sandbox (eval/sandbox.ts), with
the standard library only.

  python sandbox_driver.py stdin              the program reads the test input on stdin and writes its
                                              answer on stdout (compared by the caller)
  python sandbox_driver.py call FUNC_NAME     args.json holds the argument list; the result of
                                              Solution().FUNC_NAME(*args) (or a top-level FUNC_NAME) is
                                              compared with expected.json here, with Python's ==

The program is compiled on its own (so its `from __future__` lines stay valid) and executed in a
namespace pre-filled with the standard-library imports the LiveCodeBench runner provides, since
LeetCode-style starter code uses `List[int]` and friends without importing them.

In call mode the verdict is one line `A2D-VERDICT <nonce> <json>`; the nonce is read from nonce.txt,
which is deleted before the program runs, so text the program prints cannot pass for a verdict.
"""

import json
import os
import sys

PRELUDE = """
import bisect, collections, copy, datetime, functools, heapq, io, itertools, json, math, operator
import random, re, statistics, string, sys
from bisect import *
from collections import *
from copy import *
from datetime import *
from functools import *
from heapq import *
from itertools import *
from math import *
from operator import *
from random import *
from statistics import *
from string import *
from typing import *
sys.setrecursionlimit(50000)
"""


def load_program(run_as_main):
    namespace = {"__name__": "__main__" if run_as_main else "solution", "__builtins__": __builtins__}
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    with open("solution.py", encoding="utf-8") as source:
        code = compile(source.read(), "solution.py", "exec")
    exec(code, namespace)
    return namespace


def run_call(func_name):
    with open("nonce.txt", encoding="utf-8") as nonce_file:
        nonce = nonce_file.read().strip()
    os.remove("nonce.txt")
    with open("args.json", encoding="utf-8") as args_file:
        args = json.load(args_file)
    with open("expected.json", encoding="utf-8") as expected_file:
        expected = json.load(expected_file)
    verdict_out = os.fdopen(os.dup(1), "w")
    namespace = load_program(run_as_main=False)
    if "Solution" in namespace:
        target = getattr(namespace["Solution"](), func_name)
    else:
        target = namespace[func_name]
    got = target(*args)
    # LeetCode answers are JSON: a tuple where a list is expected is the same answer.
    if isinstance(got, tuple):
        got = list(got)
    verdict = {"pass": got == expected, "got": repr(got)[:200]}
    verdict_out.write(f"A2D-VERDICT {nonce} {json.dumps(verdict)}\n")
    verdict_out.flush()


def main():
    mode = sys.argv[1]
    if mode == "stdin":
        load_program(run_as_main=True)
    elif mode == "call":
        run_call(sys.argv[2])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
