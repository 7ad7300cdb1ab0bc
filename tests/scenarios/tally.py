"""The totals of scenario reports (``XASINK_SCENARIO_REPORT`` files): schedules and violations per database and kind,
then each violation with its replay line.

    python -m tests.scenarios.tally long-pg.jsonl long-mariadb.jsonl long-multi.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import Counter


def main(paths: list[str]) -> int:
    runs: Counter[tuple[str, str]] = Counter()
    broken: Counter[tuple[str, str]] = Counter()
    failures = []
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                entry = json.loads(line)
                key = (entry["db"], entry.get("kind") or "core")
                runs[key] += 1
                if entry["violations"]:
                    broken[key] += 1
                    failures.append(entry)
    print(f"{'database':<12} {'kind':<16} {'schedules':>9} {'broken':>7}")
    for key in sorted(runs):
        print(f"{key[0]:<12} {key[1]:<16} {runs[key]:>9} {broken[key]:>7}")
    print(f"{'total':<29} {sum(runs.values()):>9} {sum(broken.values()):>7}")
    for entry in failures:
        print(
            f"\n--- {entry['db']} {entry.get('kind') or 'core'} seed {entry['seed']} {entry.get('name', '')}".rstrip()
        )
        print(entry.get("report") or "\n".join(entry["violations"]))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
