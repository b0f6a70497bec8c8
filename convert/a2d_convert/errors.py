"""The one error type a2d_convert raises for bad input.

Its message is a single line that names the file at fault and the fix; `python -m a2d_convert` prints
it without a traceback and exits with status 2.
"""


class A2DError(Exception):
    """Bad input (a file, a config field, a flag): the message names it and says how to fix it."""
