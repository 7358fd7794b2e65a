"""Cut a Mooncake-format trace: records START..START+COUNT of a JSONL trace, arrival times rebased to 0.

A session replay takes any trace in this format (`rltbench e2e --workload session --trace FILE`); a
slice from the middle of the shipped one-hour trace is a different user load than its first
records (the `mooncake-*` presets), with the same record shape.

    python -m rltbench.bench.trace_slice workloads/mooncake/conversation_trace.jsonl \\
        --start 6000 --count 40 --out my_trace.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="a JSONL trace: timestamp (ms), input_length, output_length, hash_ids")
    ap.add_argument("--start", type=int, default=0, help="first record (0-based)")
    ap.add_argument("--count", type=int, required=True, help="records to keep")
    ap.add_argument("--out", required=True, help="the JSONL file to write")
    args = ap.parse_args()
    if args.start < 0 or args.count < 1:
        print("error: --start must be >= 0 and --count >= 1", file=sys.stderr)
        return 2
    with open(args.trace, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()][args.start : args.start + args.count]
    if not rows:
        print(f"error: {args.trace} has no record at index {args.start}", file=sys.stderr)
        return 2
    t0 = rows[0]["timestamp"]
    with open(args.out, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({**r, "timestamp": r["timestamp"] - t0}) + "\n")
    print(f"wrote {len(rows)} records ({rows[-1]['timestamp'] - t0} ms of arrivals) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
