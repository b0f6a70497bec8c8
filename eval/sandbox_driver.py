"""Runs a model-written LiveCodeBench program against the inputs of every test of one problem, inside
the sandbox (eval/sandbox.ts), with the standard library only. It never sees an expected output: it
reports what the program produced, one test at a time, and the grader outside compares.

  python sandbox_driver.py stdin              the program reads each test's input from a mocked stdin
  python sandbox_driver.py call FUNC_NAME     each test's input lines are JSON arguments of FUNC_NAME

/work/inputs.json holds the list of raw test inputs. The channel: this process writes JSON lines on
fd 3 ({"compiled": true} or {"compiled": false, "error"}, then one {"output"} / {"value"} / {"error"}
per test) and reads one line on fd 4 before each test ("next"; anything else or EOF ends the run).

The rules are LiveCodeBench's lcb_runner (evaluation/testing_util.py, July 2025), reproduced because
they decide which programs pass:
- the program is prefixed with the runner's imports (`from string/re/datetime/collections/heapq/
  bisect/copy/math/random/statistics/itertools/functools/operator/io/sys/json/builtins/typing import
  *`, the same modules imported by name, `sys.setrecursionlimit(50000)`);
- stdin programs: a trailing `if __name__ == '__main__':` block is unwrapped, the top-level imports are
  hoisted and every other top-level statement becomes the body of one function, called once per test
  with sys.stdin replaced by a stand-in (read() gives the whole input, readline() one line,
  readlines() the input split on newlines, buffer.read() the bytes, buffer.readline() the first line),
  the original stdin object's read/readline/readlines answering from the input too (readline without
  the newline), open() answering with the input, and sys.stdout captured; SystemExit ends a test
  normally;
- functional programs: `Solution()` (when the code says `class Solution`) or the module itself holds
  FUNC_NAME; one instance serves every test; each input line is parsed with json.loads; a tuple result
  counts as a list;
- the runner's reliability guard is applied before the program is compiled (os.kill, os.system,
  os.remove, os.getcwd, os.chdir and the other functions it disables are None, subprocess.Popen and
  shutil.rmtree/move/chown are None, `resource`, `psutil`, `joblib`, `ipdb` and `tkinter` cannot be
  imported), since programs that touch them fail there;
- int <-> str conversion allows 50,000 digits, as the runner sets.

Results cross the channel in a tagged form that only builds plain values on the other side: no pickle.
"""

import ast
import builtins
import io
import json
import os
import sys
import types
from unittest import mock

IMPORTS = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

ENTRY = "wrapped_function"

DISABLED_OS = (
    "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames truncate "
    "replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
).split()
UNIMPORTABLE = ("ipdb", "joblib", "resource", "psutil", "tkinter")


def unwrap_main_guard(code):
    """A trailing `if __name__ == '__main__':` block becomes plain top-level code."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            return ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    return code


def as_entry_function(code):
    """The runner's imports, the program's own imports, then the rest of it as the body of ENTRY()."""
    try:
        tree = ast.parse(code)
        imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
        rest = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
        entry = ast.FunctionDef(
            name=ENTRY,
            args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
            body=rest,
            decorator_list=[],
            lineno=-1,
        )
        return IMPORTS + "\n" + ast.unparse(imports) + "\n" + ast.unparse(entry)
    except Exception:
        return code


def guard_like_the_runner():
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in DISABLED_OS:
        setattr(os, name, None)
    import shutil
    import subprocess

    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in UNIMPORTABLE:
        sys.modules[name] = None


def load(code):
    """Executes the program as a module; returns what holds the entry point."""
    module = types.ModuleType("tmp_sol", "")
    exec(code, module.__dict__)
    return module.Solution() if "class Solution" in code else module


class StdinStandIn:
    """What sys.stdin is while a stdin test runs."""

    def __init__(self, text):
        self._text = text
        self._lines = io.StringIO(text)
        self.buffer = _BufferStandIn(text.encode("utf-8"))

    def read(self, *args):
        return self._text

    def readline(self, *args):
        return self._lines.readline(*args)

    def readlines(self, *args):
        return self._text.split("\n")

    def __getattr__(self, name):
        return getattr(self._lines, name)


class _BufferStandIn:
    def __init__(self, data):
        self._data = data

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


class _Captured(io.StringIO):
    def close(self):
        pass


def run_stdin_test(entry, text):
    lines = iter(text.split("\n"))
    captured = _Captured()
    saved_stdout = sys.stdout
    with mock.patch("sys.stdin.read", lambda *args: text), mock.patch(
        "sys.stdin.readlines", lambda *args: text.split("\n")
    ), mock.patch("sys.stdin.readline", lambda *args: next(lines)), mock.patch(
        "sys.stdin", StdinStandIn(text)
    ), mock.patch("builtins.open", mock.mock_open(read_data=text)):
        sys.stdout = captured
        try:
            entry()
        except SystemExit:
            pass
        finally:
            sys.stdout = saved_stdout
    return captured.getvalue()


def tagged(value):
    """A JSON-safe, type-tagged copy of a plain result; anything else cannot be compared outside."""
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        value = value.tolist()
    if value is None:
        return ["none"]
    if isinstance(value, bool):
        return ["bool", bool(value)]
    if isinstance(value, int):
        return ["int", hex(value)]
    if isinstance(value, float):
        return ["float", repr(float(value))]
    if isinstance(value, str):
        return ["str", str(value)]
    if isinstance(value, (list, tuple, set, frozenset)):
        kind = next(name for name, cls in (("list", list), ("tuple", tuple), ("set", set), ("frozenset", frozenset)) if isinstance(value, cls))
        return [kind, [tagged(item) for item in value]]
    if isinstance(value, dict):
        return ["dict", [[tagged(key), tagged(item)] for key, item in value.items()]]
    raise TypeError(f"the result is a {type(value).__name__}, which is not a plain value")


def describe(error):
    return f"{type(error).__name__}: {error}"[:500]


def main():
    mode = sys.argv[1]
    func_name = sys.argv[2] if mode == "call" else None
    sys.set_int_max_str_digits(50000)
    report = os.fdopen(3, "w", encoding="utf-8")
    control = os.fdopen(4, "r", encoding="utf-8")
    with open("inputs.json", encoding="utf-8") as handle:
        inputs = json.load(handle)
    with open("solution.py", encoding="utf-8") as handle:
        code = handle.read()

    def send(message):
        report.write(json.dumps(message) + "\n")
        report.flush()

    guard_like_the_runner()
    try:
        if mode == "stdin":
            holder = load(as_entry_function(unwrap_main_guard(code)))
            target = getattr(holder, ENTRY)
        else:
            holder = load(IMPORTS + "\n\n" + code)
            target = getattr(holder, func_name)
            arguments = [[json.loads(line) for line in text.split("\n")] for text in inputs]
    except BaseException as error:
        send({"compiled": False, "error": describe(error)})
        return
    send({"compiled": True})

    for index, text in enumerate(inputs):
        if control.readline().strip() != "next":
            return
        try:
            if mode == "stdin":
                send({"output": run_stdin_test(target, text)})
            else:
                result = target(*arguments[index])
                send({"value": tagged(result)})
        except BaseException as error:
            send({"error": describe(error)})
            return


if __name__ == "__main__":
    main()
