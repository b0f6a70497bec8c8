"""bench/nsys_gaps.py on a hand-made GPU trace: overlapping activities merge into one busy interval, and the idle
time is exactly the span less the busy time, split into gaps by size."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path, rows):
    trace = tmp_path / "trace.csv"
    trace.write_text('"Start (ns)","Duration (ns)","Name"\n' + "".join(f"{s},{d},k\n" for s, d in rows))
    return subprocess.run([sys.executable, str(REPO / "bench" / "nsys_gaps.py"), str(trace)], capture_output=True,
                          text=True)


def test_overlaps_merge_and_gaps_are_sized(tmp_path):
    # Busy 0-100 (two overlapping kernels), 120-220, then 1,220-1,320 and 101,320-101,420: gaps of 20 ns, 1 us
    # and 100 us.
    result = run(tmp_path, [(0, 60), (40, 60), (120, 100), (1_220, 100), (101_320, 100)])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("activities 5, span 0.1 ms, busy 0.0 ms (0.4 %), idle 0.1 ms in 3 gaps")
    assert lines[1] == "  gaps 0-5 us: 2, 0.00 ms, median 0.5 us"
    assert lines[2] == "  gaps 50-500 us: 1, 0.10 ms, median 100.0 us"
    assert len(lines) == 3


def test_a_trace_without_activities_is_refused(tmp_path):
    result = run(tmp_path, [])
    assert result.returncode != 0
    assert "no GPU activity" in result.stderr
