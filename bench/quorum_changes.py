"""Dynamic controller quorum (issue 28, KIP-853) figures on a local cluster:

- add: a controller started outside the voters (an observer) is added; seconds from the
  request to the committed voter set (the controller's own commit time is printed too);
- replace: a voter's storage is lost (SIGKILL, its data directory removed, restarted
  with a new directory id); seconds from the restart to the committed set holding its new
  identity (remove the old (id, directory), wait for it to catch up, add the new one);
- metadata commit latency during a change: topic creations (each one metadata commit
  through the active controller) run throughout; their latency p50/p99 outside any
  change and while a change is in flight.

    python -m bench.quorum_changes              # 3 controllers + 1 broker, --rounds 3
    python -m bench.quorum_changes --rounds 1 --json /tmp/q.json

One JSON object on stdout (or --json FILE), a line per figure on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster_support import Cluster, cluster_factory, wait_for  # noqa: E402
from straitmq.cli.local_cluster import Node, free_port  # noqa: E402

from straitmq.admin_client import AdminError, request_sync  # noqa: E402


class Load:
    """Topic creations back to back through the brokers; (start, seconds) of each ack."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.acks: list[tuple[float, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.done.is_set():
            n += 1
            b = self.c.any_broker()
            body = {"name": f"bench-{n}", "partitions": 1, "replication_factor": 1}
            t0 = time.monotonic()
            try:
                request_sync(f"http://{b.host}:{b.http_port}", "POST", "/api/v1/topics", body, 20)
            except AdminError:
                continue
            self.acks.append((t0, time.monotonic() - t0))


def _leader(c: Cluster) -> dict:
    def find() -> dict | None:
        for n in c.controllers.values():
            if n.alive():
                st = n.get("/api/v1/quorum")
                if st and st.get("role") == "leader":
                    return st
        return None

    return wait_for(find, 30, "a quorum leader")  # type: ignore[return-value]


def _start_observer(c: Cluster, cid: int, port: int) -> Node:
    args = [*c._controller_cmd(cid), "--listen", f"127.0.0.1:{port}"]
    log = os.path.join(c.data_dir, f"controller-{cid}.log")
    node = c.controllers[cid] = Node("controller", cid, args, log, port)
    node.start()
    return node


def _caught_up(c: Cluster, node: Node) -> bool:
    st = node.get("/api/v1/quorum")
    leader = _leader(c)
    return bool(st) and st["log_end_offset"] >= leader["high_watermark"]


def _broker(c: Cluster) -> str:
    b = c.any_broker()
    return f"http://{b.host}:{b.http_port}"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(rounds: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-quorum-"))
    gen = cluster_factory(tmp)
    make = next(gen)
    out: dict = {"add_s": [], "add_commit_ms": [], "replace_s": [], "windows": []}
    try:
        c = make(brokers=1, log_level="warning")
        load = Load(c)
        load.thread.start()
        wait_for(lambda: len(load.acks) >= 50, 60, "topic creations under way")
        for r in range(rounds):
            cid = 1004 + r
            node = _start_observer(c, cid, free_port())
            wait_for(lambda n=node: _caught_up(c, n), 60, f"{cid} caught up")
            t0 = time.monotonic()
            reply = request_sync(
                _broker(c),
                "POST",
                "/api/v1/quorum/voters",
                {"controller_url": f"http://127.0.0.1:{node.http_port}"},
                40,
            )
            add_s = time.monotonic() - t0
            out["add_s"].append(add_s)
            out["add_commit_ms"].append(reply["commit_ms"])
            out["windows"].append((t0, time.monotonic()))
            print(f"add {cid}: {add_s * 1000:.0f} ms request -> committed", file=sys.stderr)

            # Replace it: its storage is lost.
            old_dir = next(v for v in _leader(c)["voter_set"] if v["id"] == cid)["directory_id"]
            node.kill9()
            shutil.rmtree(os.path.join(c.data_dir, f"controller-{cid}"))
            t1 = time.monotonic()
            node.start()
            request_sync(
                _broker(c),
                "DELETE",
                f"/api/v1/quorum/voters/{cid}?directory_id={old_dir}",
                None,
                40,
            )
            wait_for(lambda n=node: _caught_up(c, n), 60, f"{cid} on new storage caught up")
            request_sync(
                _broker(c),
                "POST",
                "/api/v1/quorum/voters",
                {"controller_url": f"http://127.0.0.1:{node.http_port}"},
                40,
            )
            replace_s = time.monotonic() - t1
            out["replace_s"].append(replace_s)
            out["windows"].append((t1, time.monotonic()))
            new_dir = next(v for v in _leader(c)["voter_set"] if v["id"] == cid)["directory_id"]
            assert new_dir != old_dir
            print(f"replace {cid}: {replace_s:.2f} s restart -> committed", file=sys.stderr)
            # Back to three voters for the next round.
            request_sync(_broker(c), "DELETE", f"/api/v1/quorum/voters/{cid}", None, 40)
            node.stop()
        n_before = len(load.acks)
        wait_for(lambda: len(load.acks) >= n_before + 50, 60, "creations after the changes")
        load.done.set()
        load.thread.join(30)
    finally:
        try:
            next(gen)
        except StopIteration:
            pass
        shutil.rmtree(tmp, ignore_errors=True)

    def during(t: float) -> bool:
        return any(a <= t <= b for a, b in out["windows"])

    inside = [s * 1000 for t, s in load.acks if during(t)]
    outside = [s * 1000 for t, s in load.acks if not during(t)]
    result = {
        "rounds": rounds,
        "add_voter_ms": [round(x * 1000, 1) for x in out["add_s"]],
        "add_voter_leader_commit_ms": out["add_commit_ms"],
        "replace_lost_voter_s": [round(x, 2) for x in out["replace_s"]],
        "metadata_commit_ms_outside_changes": {
            "n": len(outside),
            "p50": round(statistics.median(outside), 1) if outside else None,
            "p99": round(_pct(outside, 0.99), 1),
        },
        "metadata_commit_ms_during_changes": {
            "n": len(inside),
            "p50": round(statistics.median(inside), 1) if inside else None,
            "p99": round(_pct(inside, 0.99), 1),
        },
    }
    print(
        f"topic creation (a metadata commit) p50/p99 ms: outside changes "
        f"{result['metadata_commit_ms_outside_changes']}, during "
        f"{result['metadata_commit_ms_during_changes']}",
        file=sys.stderr,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.quorum_changes", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", help="write the result here instead of stdout")
    a = p.parse_args(argv)
    result = run(a.rounds)
    text = json.dumps(result, indent=2)
    if a.json:
        Path(a.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
