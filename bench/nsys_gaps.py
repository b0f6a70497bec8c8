"""Where a GPU sat idle between its work, from Nsight Systems' GPU trace (`nsys stats --report cuda_gpu_trace
--format csv`): the span from the first activity's start to the last one's end, the GPU's busy time in it (kernels,
graphs and copies, overlaps merged), and the idle gaps between them by size. Under a decode loop the gaps are the
host's share of each step: what the forward does not hide.

    python3 bench/nsys_gaps.py TRACE.csv
"""
import csv
import statistics
import sys


def intervals(path):
    """(start, end) in ns of every GPU activity of the trace, by start."""
    spans = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            start, duration = row.get("Start (ns)"), row.get("Duration (ns)")
            if start and duration:
                spans.append((int(start), int(start) + int(duration)))
    return sorted(spans)


def gaps(spans):
    """The idle gaps (ns) between merged busy intervals, and the busy time."""
    found, busy = [], 0
    cur_start, cur_end = spans[0]
    for start, end in spans[1:]:
        if start > cur_end:
            found.append(start - cur_end)
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return found, busy


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/nsys_gaps.py TRACE.csv")
    spans = intervals(sys.argv[1])
    if not spans:
        sys.exit(f"{sys.argv[1]}: no GPU activity with a start and a duration")
    found, busy = gaps(spans)
    span = spans[-1][1] - spans[0][0]
    print(f"activities {len(spans)}, span {span / 1e6:.1f} ms, busy {busy / 1e6:.1f} ms ({100 * busy / span:.1f} %), "
          f"idle {(span - busy) / 1e6:.1f} ms in {len(found)} gaps")
    for low, high in ((0, 5e3), (5e3, 50e3), (50e3, 500e3), (500e3, 5e6), (5e6, float("inf"))):
        within = [g for g in found if low <= g < high]
        if within:
            print(f"  gaps {low / 1e3:g}-{high / 1e3:g} us: {len(within)}, {sum(within) / 1e6:.2f} ms, "
                  f"median {statistics.median(within) / 1e3:.1f} us")


if __name__ == "__main__":
    main()
