"""A broker that is alive but cannot open some replicas' logs (its log directory refuses
new files) reports them in its heartbeats; the controller leads them from other in-sync
replicas and drops the broker from their ISRs, so clients write and read them with no
error, and the broker takes its replicas back once its directory accepts files again.

The directory is made immutable with `chattr +i` (root cannot create files in it
either), which fails the replicas' creation the way a full or broken disk does.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cluster_support import Workload, cluster_factory, verify, wait_for
from waiting import wait_progressing

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def _chattr(flag: str, path: Path) -> None:
    assert shutil.which("chattr"), "chattr (e2fsprogs) is needed to make a directory refuse files"
    subprocess.run(["chattr", flag, str(path)], check=True)


def test_replicas_a_broker_cannot_open_are_led_elsewhere(cluster) -> None:
    c = cluster()
    victim = 1
    logs = Path(c.data_dir) / f"broker-{victim}" / "logs"
    assert logs.is_dir()
    _chattr("+i", logs)
    try:
        # Not waiting for full ISRs: the controller may drop the broker from them (the
        # point of the test) before a first look sees them full (CI: a 30 s timeout
        # waiting for every ISR of size 3 on a loaded machine).
        c.create_topic("off", partitions=6, rf=3, min_isr=2, wait=False)

        def moved() -> bool:
            parts = c.topic("off")["partitions"]
            return all(p["leader"] not in (victim, -1) and victim not in p["isr"] for p in parts)

        wait_for(
            moved,
            30,
            f"broker {victim}'s replicas led elsewhere and out of the ISRs",
            detail=lambda: str(c.topic("off")["partitions"]),
            ignore=(RuntimeError,),  # no broker knows the topic yet
        )
        # Not by fencing: the broker stays registered, unfenced and serving.
        assert c.brokers[victim].get("/readyz") == {"status": "ready"}
        w = Workload(c.bootstrap, "off", partitions=6, prefix="off").start()
        w.wait_acked_growth(300, 30)
        assert not w.errors, dict(w.errors)
    finally:
        _chattr("-i", logs)

    # Its directory takes files again: the replicas open (tried again every few
    # seconds), catch up and rejoin the ISRs, for as long as that keeps moving.
    def rejoined() -> bool:
        parts = c.topic("off")["partitions"]
        return all(p["leader"] >= 0 and len(p["isr"]) == 3 for p in parts)

    def progress() -> tuple[int, int]:
        """(partitions whose ISR is whole, the victim's replicas' log end offsets)."""
        full = sum(len(p["isr"]) == 3 for p in c.topic("off")["partitions"])
        mine = c.brokers[victim].get("/api/v1/topics/off") or {"partitions": []}
        return full, sum(p["log_end_offset"] for p in mine["partitions"])

    wait_progressing(rejoined, progress, 30, "every ISR of size 3 again")
    w.wait_acked_growth(200, 30)
    w.stop()
    fig = verify(c, w, "offline-replicas", {"victim": victim})
    assert fig.ok(), fig.line()
