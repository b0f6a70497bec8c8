"""One LiveCodeBench program against one problem's tests, the way lcb_runner's testing_util.py grades it;
the reference for bench/reference_grader.py. Written apart from eval/sandbox_driver.py (which runs inside
a2d's sandbox and never sees expected outputs) so that the two can be checked against each other.

It runs TRUSTED code only (the fixed answers under eval/fixtures), in this process, with SIGALRM per
test as lcb_runner does. Input on stdin, one JSON object:
  {"code": str, "inputs": [str], "outputs": [str], "fn_name": str | null, "timeout": int}
Output on stdout: {"passed": bool, "failed_test": int | null, "why": str | null}
"""

import ast
import builtins
import io
import json
import os
import signal
import sys
import types
from decimal import Decimal
from unittest import mock

# lcb_runner's import_string, one statement per entry.
RUNNER_PRELUDE = "\n".join(
    [f"from {m} import *" for m in "string re datetime collections heapq bisect copy math random statistics itertools "
     "functools operator io sys json builtins typing".split()]
    + [f"import {m}" for m in "string re datetime collections heapq bisect copy math random statistics itertools "
       "functools operator io sys json".split()]
    + ["sys.setrecursionlimit(50000)"]
) + "\n"


class Alarm(Exception):
    pass


def on_alarm(signum, frame):
    raise Alarm()


def disable_like_reliability_guard():
    os.environ["OMP_NUM_THREADS"] = "1"  # before os.putenv goes, as in the guard
    for name in ("kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames "
                 "truncate replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir").split():
        setattr(os, name, None)
    builtins.quit = None
    builtins.help = None
    import shutil
    import subprocess

    for name in ("rmtree", "move", "chown"):
        setattr(shutil, name, None)
    subprocess.Popen = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def stdin_program(code):
    """testing_util's clean_if_name + make_function, reimplemented."""
    try:
        body = ast.parse(code).body
        if body and isinstance(body[-1], ast.If) and ast.unparse(body[-1].test) == "__name__ == '__main__'":
            code = ast.unparse(body[:-1]) + "\n" + ast.unparse(body[-1].body)
    except Exception:
        pass
    try:
        body = ast.parse(code).body
    except Exception:
        return code
    hoisted = [s for s in body if type(s) in (ast.Import, ast.ImportFrom)]
    inner = [s for s in body if type(s) not in (ast.Import, ast.ImportFrom)]
    func = ast.FunctionDef("wrapped_function", ast.arguments([], [], None, [], [], None, []), inner, [], lineno=-1)
    try:
        return RUNNER_PRELUDE + "\n" + ast.unparse(hoisted) + "\n" + ast.unparse(func)
    except Exception:
        return code


class FakeStdin:
    def __init__(self, data):
        self.data = data
        self.reader = io.StringIO(data)
        self.buffer = types.SimpleNamespace(read=lambda *a: data.encode(), readline=lambda *a: data.encode().split(b"\n")[0] + b"\n")

    def read(self, *a):
        return self.data

    def readline(self, *a):
        return self.reader.readline(*a)

    def readlines(self, *a):
        return self.data.split("\n")

    def __getattr__(self, attribute):
        return getattr(self.reader, attribute)


def call_with_input(function, data):
    real = sys.stdin
    pieces = iter(data.split("\n"))
    overridden = {"read": lambda *a: data, "readlines": lambda *a: data.split("\n"), "readline": lambda *a: next(pieces)}
    for name, value in overridden.items():
        setattr(real, name, value)
    sys.stdin = FakeStdin(data)
    out = io.StringIO()
    out.close = lambda *a: None
    saved_out = sys.stdout
    sys.stdout = out
    try:
        with mock.patch("builtins.open", mock.mock_open(read_data=data)):
            try:
                function()
            except SystemExit:
                pass
    finally:
        sys.stdout = saved_out
        sys.stdin = real
        for name in overridden:
            delattr(real, name)
    return out.getvalue()


def lines_of(text):
    return [piece.strip() for piece in text.strip().split("\n")]


def same_stdout(got, want):
    a, b = lines_of(got), lines_of(want)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
                return False
        except Exception:
            return False
    return True


def grade(job):
    signal.signal(signal.SIGALRM, on_alarm)
    disable_like_reliability_guard()
    timeout = job["timeout"]
    fn_name = job["fn_name"]
    code = RUNNER_PRELUDE + "\n\n" + job["code"] if fn_name else stdin_program(job["code"])
    module = types.ModuleType("tmp_sol")
    signal.alarm(timeout)
    try:
        exec(code, module.__dict__)
        holder = module.Solution() if "class Solution" in code else module
        target = getattr(holder, fn_name or "wrapped_function")
        arguments = [[json.loads(line) for line in text.split("\n")] for text in job["inputs"]] if fn_name else None
        wanted = [json.loads(text) for text in job["outputs"]] if fn_name else job["outputs"]
    except BaseException as error:
        return {"passed": False, "failed_test": None, "why": f"compile: {type(error).__name__}: {error}"}
    finally:
        signal.alarm(0)
    for number in range(len(job["inputs"])):
        signal.alarm(timeout)
        try:
            if fn_name:
                got = target(*arguments[number])
                if isinstance(got, tuple):
                    got = list(got)
                ok = got == wanted[number]
            else:
                ok = same_stdout(call_with_input(target, job["inputs"][number]), wanted[number])
        except Alarm:
            return {"passed": False, "failed_test": number + 1, "why": "timeout"}
        except BaseException as error:
            return {"passed": False, "failed_test": number + 1, "why": f"{type(error).__name__}: {error}"}
        finally:
            signal.alarm(0)
        if not ok:
            return {"passed": False, "failed_test": number + 1, "why": "wrong answer"}
    return {"passed": True, "failed_test": None, "why": None}


if __name__ == "__main__":
    sys.set_int_max_str_digits(50000)
    job = json.loads(sys.stdin.read())
    result = grade(job)
    sys.__stdout__.write(json.dumps(result) + "\n")
