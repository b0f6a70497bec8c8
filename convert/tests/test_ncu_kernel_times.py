"""bench/ncu_kernel_times.py on a hand-made Nsight Compute raw CSV: kernels group by name and grid, the units row
scales the durations, lines the profiled program printed are skipped, and a CSV without the metric is refused."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADER = '"ID","Kernel Name","Block Size","Grid Size","gpu__time_duration.sum"\n'


def run(tmp_path, text):
    path = tmp_path / "ncu.csv"
    path.write_text(text)
    return subprocess.run([sys.executable, str(REPO / "bench" / "ncu_kernel_times.py"), str(path)], capture_output=True,
                          text=True)


def test_kernels_group_by_name_and_grid_in_microseconds(tmp_path):
    rows = [
        '"0","void (anonymous namespace)::gemm<3, 128>(Params, CUtensorMap_st)","(384, 1, 1)","(8, 20, 1)","80,000"',
        '"1","void (anonymous namespace)::gemm<3, 128>(Params, CUtensorMap_st)","(384, 1, 1)","(8, 16, 1)","40,000"',
        '"2","void (anonymous namespace)::gemm<3, 128>(Params, CUtensorMap_st)","(384, 1, 1)","(8, 20, 1)","84,000"',
        '"3","void norm(float*)","(256, 1, 1)","(1023, 1, 1)","6,000"',
    ]
    text = "profiled one prompt: 1.0 ms\n" + HEADER + '"","","","","ns"\n' + "\n".join(rows) + "\n"
    result = run(tmp_path, text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1].split() == ["164.0", "2", "82.00", "78.1%", "gemm<3,", "128>", "(8,", "20,", "1)"]
    assert lines[2].split()[:4] == ["40.0", "1", "40.00", "19.0%"]
    assert lines[3].split()[:5] == ["6.0", "1", "6.00", "2.9%", "norm"]
    assert lines[4] == "     210.0 us in all, 4 launches"


def test_a_csv_without_the_metric_is_refused(tmp_path):
    result = run(tmp_path, '"ID","Kernel Name"\n"0","k"\n')
    assert result.returncode != 0
    assert "no kernel rows" in result.stderr
