"""Rewrite the README's "Time budgets" table from two warm full runs' logs.

    .venv/bin/python scripts/time_budgets.py EARLIER.log LATER.log

Each log is the output of the README's test command (its "seconds per module" section,
printed by tests/conftest.py). A module's budget is 1.5 times the longer of the two runs,
rounded up to 10 s; the measured column is the later run. Modules that are in the table
but in neither log keep their row, so a partial log cannot drop a budget.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\s*([0-9.]+)\s+(tests/\S+\.py)\b")
HEADING = "### Time budgets"


def seconds(log: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    in_section = False
    for line in log.read_text(errors="replace").splitlines():
        if "seconds per module" in line:
            in_section = True
        elif in_section and (m := ROW.match(line)):
            out[m.group(2)] = float(m.group(1))
        elif in_section and out:
            break
    if not out:
        raise SystemExit(f"{log}: no 'seconds per module' section")
    return out


def main(earlier: Path, later: Path) -> None:
    a, b = seconds(earlier), seconds(later)
    readme = ROOT / "README.md"
    lines = readme.read_text().splitlines()
    start = lines.index(HEADING)
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("| `tests/"))
    end = first
    while end < len(lines) and lines[end].startswith("| `tests/"):
        end += 1
    rows = range(first, end)  # the table's rows: one contiguous block
    old = {lines[i].split("`")[1]: lines[i] for i in rows}
    new: list[tuple[float, str]] = []
    for module in sorted(set(old) | set(a) | set(b)):
        if module not in a and module not in b:
            new.append((0.0, old[module]))
            continue
        longest = max(a.get(module, 0.0), b.get(module, 0.0))
        budget = max(10, math.ceil(1.5 * longest / 10) * 10)
        measured = b.get(module, a.get(module, 0.0))
        new.append((measured, f"| `{module}` | {budget} | {measured:.0f} |"))
    new.sort(key=lambda r: -r[0])
    lines[first:end] = [row for _, row in new]
    readme.write_text("\n".join(lines) + "\n")
    print(f"{len(new)} rows written to {readme}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
