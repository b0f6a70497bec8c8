"""Where a profiled span's GPU time goes, kernel by kernel, from Nsight Compute's raw CSV of kernel durations: each
kernel (its name without the argument list, and its grid, which tells the GEMMs of one template apart) with its
launches, total and mean time and share of the sum, largest first. ncu runs each kernel alone, so the sum is the
span's kernel time without overlap or launch gaps.

    ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv --page raw \\
        build/device/a2d_prefill_check --profile-prompt 1024 > prompt.csv
    python3 bench/ncu_kernel_times.py prompt.csv
"""
import csv
import re
import sys
from collections import defaultdict

METRIC = "gpu__time_duration.sum"
SCALE_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def short_name(full):
    """A kernel's name without its return type, namespaces and argument list, template arguments kept."""
    name = re.sub(r"^void ", "", full).replace("(anonymous namespace)", "<unnamed>")
    name = name.split("(")[0]
    return re.sub(r"^([\w]+::|<unnamed>::)+", "", name)


def kernel_times(path):
    """{(name, grid): [launches, microseconds]} of the CSV's kernel rows."""
    times = defaultdict(lambda: [0, 0.0])
    header, scale = None, None
    with open(path, newline="") as fh:
        for row in csv.reader(fh):
            if header is None:
                if "Kernel Name" in row and METRIC in row:
                    header = row
                continue
            if len(row) != len(header):
                continue
            value = row[header.index(METRIC)].replace(",", "")
            if scale is None and value in SCALE_TO_US:  # the units row
                scale = SCALE_TO_US[value]
                continue
            try:
                duration = float(value)
            except ValueError:
                continue
            name = short_name(row[header.index("Kernel Name")])
            grid = row[header.index("Grid Size")] if "Grid Size" in header else ""
            entry = times[(name, grid)]
            entry[0] += 1
            entry[1] += duration * (scale if scale is not None else 1e-3)
    return times


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/ncu_kernel_times.py NCU_RAW.csv")
    times = kernel_times(sys.argv[1])
    if not times:
        sys.exit(f"{sys.argv[1]}: no kernel rows with {METRIC} (run ncu with --metrics {METRIC} --csv --page raw)")
    total = sum(us for _, us in times.values())
    print(f"{'us':>10} {'launches':>8} {'us each':>9} {'share':>6}  kernel [grid]")
    for (name, grid), (launches, us) in sorted(times.items(), key=lambda item: -item[1][1]):
        print(f"{us:10.1f} {launches:8d} {us / launches:9.2f} {100 * us / total:5.1f}%  {name}{' ' + grid if grid else ''}")
    print(f"{total:10.1f} us in all, {sum(n for n, _ in times.values())} launches")


if __name__ == "__main__":
    main()
