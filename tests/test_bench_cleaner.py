"""bench/cleaner.py's own parts that need no broker: Kafka's cleaner log line, the busy
share of a window, CPU of a process tree, and the profile of one StraitMQ cleaning."""

from __future__ import annotations

import argparse
import os
import re

from bench.cleaner import KAFKA_CLEANED, overlap, parse_args, profile, tree_cpu_s

# As Kafka 4.1's LogCleaner logs it (thousands separators and all).
KAFKA_LINE = """[2026-11-27 09:25:21,345] INFO [kafka-log-cleaner-thread-0]:
\tLog cleaner thread 0 cleaned log dirty0-ab12cd-0 (dirty section = [0, 1000000])
\t1,439.5 MB of log processed in 2.1 seconds (209.3 MB/sec).
\tIndexed 439.5 MB in 1.0 seconds (439.5 Mb/sec, 47.6% of total time)
"""


def test_kafka_cleaner_line_is_parsed() -> None:
    m = KAFKA_CLEANED.search(KAFKA_LINE)
    assert m is not None
    assert m.group("log") == "dirty0-ab12cd-0"
    assert float(m.group("mb").replace(",", "")) == 1439.5
    assert float(m.group("s")) == 2.1


def test_busy_share_is_the_overlap_of_window_and_cleaning() -> None:
    cleaning = {"start": 10.0, "end": 14.0}
    assert overlap((12.0, 16.0), cleaning) == 0.5
    assert overlap((10.0, 14.0), cleaning) == 1.0
    assert overlap((20.0, 22.0), cleaning) == 0.0


def test_tree_cpu_counts_this_process() -> None:
    """CPU this process burns shows in its tree's count: burn until the process's own
    counter (os.times) says 0.1 s went, then the /proc reading must have seen it too
    (no wall-clock budget: a loaded machine only makes it take longer)."""
    before, own = tree_cpu_s(os.getpid()), os.times()
    while (os.times().user + os.times().system) - (own.user + own.system) < 0.1:
        pass
    assert tree_cpu_s(os.getpid()) - before >= 0.09


def test_profile_of_one_cleaning_keeps_one_record_per_key() -> None:
    a: argparse.Namespace = parse_args(["--profile", "--records", "20000", "--keys", "500"])
    out = profile(a)
    removed = int(re.search(r"(\d+) records removed", out).group(1))
    # Every key but the latest version of each goes, except the active segment's records.
    assert 20000 - 500 - 3000 < removed <= 20000 - 500
    assert "compaction.py" in out
