"""Where the test suite's time goes, by module, from pytest's ``--durations=0`` output.

    CI=true scripts/test --durations=0 > suite.log; python benchmarks/suite_durations.py suite.log

Prints the sum of every test's setup + call + teardown time (what one process would take under
the same load), each module's share, and the wall time pytest reported, whose ratio to the sum
is what the workers bought. Results: docs/benchmarks.md ("Test suite time").

    PORTER_TEST_DURATIONS=times.txt scripts/test; python benchmarks/suite_durations.py times.txt
    python benchmarks/suite_durations.py suite.log --write tests/durations.json

(PORTER_TEST_DURATIONS: tests/conftest.py appends each test phase's line as it ends, so an
interrupted run still tells where its time went)

also writes each module's seconds as JSON: tests/conftest.py starts the longest modules first.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
from pathlib import Path

LINE = re.compile(r"^\s*([\d.]+)s (call|setup|teardown)\s+(tests/[\w/.-]+\.py)")
WALL = re.compile(r" in ([\d.]+)s(?: \(|$)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="pytest output with --durations=0")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--write", type=Path, metavar="JSON", help="write {module: seconds} here")
    args = parser.parse_args()
    seconds: collections.Counter = collections.Counter()
    tests: collections.Counter = collections.Counter()
    wall = None
    with open(args.log, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = LINE.match(line)
            if m:
                seconds[m.group(3)] += float(m.group(1))
                tests[m.group(3)] += m.group(2) == "call"
            elif "passed" in line or "failed" in line:
                w = WALL.search(line)
                wall = float(w.group(1)) if w else wall
    total = sum(seconds.values())
    print(f"sum of test durations {total:.0f} s" + (f"; wall {wall:.0f} s; ratio {total / wall:.2f}" if wall else ""))
    print("| module | tests | s | share |\n| --- | ---: | ---: | ---: |")
    for module, s in seconds.most_common(args.top):
        print(f"| {module} | {tests[module]} | {s:.0f} | {100 * s / total:.1f}% |")
    if args.write:
        table = {module: round(s, 1) for module, s in sorted(seconds.items())}
        args.write.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
