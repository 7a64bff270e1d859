"""Dynamic controller quorum (KIP-853) with real processes: 3 -> 5 -> 3 voters under a
steady load of topic creations, the active controller SIGKILLed during each change; no
acknowledged topic is lost, no epoch has two leaders, the brokers keep serving. And the
refusals, each with its reason and nothing changed.

Prints the figures (time to add a voter, metadata commit latency during a change).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_support import CONTROLLER_ARGS, Cluster, cluster_factory, wait_for
from straitmq.cli.local_cluster import Node, free_port
from straitmq.operator import quorum
from straitmq.operator.admin import AdminClient

from bench.javatools import KAFKA44_TOOLS, ensure_jars, java_cmd
from straitmq.admin_client import AdminError, request_sync


@pytest.fixture
def cluster(tmp_path: Path):
    yield from cluster_factory(tmp_path)


def strait(http: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", http, *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def broker_url(c: Cluster) -> str:
    b = c.any_broker()
    return f"http://{b.host}:{b.http_port}"


def start_joining_controller(c: Cluster, cid: int) -> Node:
    """A controller outside --voters: it follows the metadata log as an observer."""
    port = free_port()
    args = [*c._controller_cmd(cid), "--listen", f"127.0.0.1:{port}"]
    node = Node("controller", cid, args, os.path.join(c.data_dir, f"controller-{cid}.log"), port)
    c.controllers[cid] = node
    node.start()
    wait_for(lambda: (node.get("/api/v1/quorum") or {}).get("leader_id"), 30, f"{cid} following")
    return node


def leader_view(c: Cluster) -> dict:
    """The quorum leader's own status."""

    def find() -> dict | None:
        for n in c.controllers.values():
            if n.alive():
                st = n.get("/api/v1/quorum")
                if st and st.get("role") == "leader":
                    return st
        return None

    return wait_for(find, 30, "a quorum leader")  # type: ignore[return-value]


def voter_ids(c: Cluster) -> set[int]:
    return {v["id"] for v in leader_view(c)["voter_set"]}


class Watch:
    """Topic creations in a loop (what the active controller commits) and, beside them,
    every controller's status sampled: which node led which epoch."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.acked: list[str] = []
        self.latencies: list[tuple[float, float]] = []  # (when, seconds)
        self.leaders: dict[int, set[int]] = {}
        self.stop_flag = threading.Event()
        self.threads = [
            threading.Thread(target=self._create, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]

    def start(self) -> Watch:
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(60)

    def _create(self) -> None:
        n = 0
        while not self.stop_flag.is_set() and n < 5000:
            n += 1
            name = f"load-{n}"
            body = {"name": name, "partitions": 1, "replication_factor": 1}
            t0 = time.monotonic()
            try:
                b = self.c.any_broker()
                request_sync(f"http://{b.host}:{b.http_port}", "POST", "/api/v1/topics", body, 20)
            except (AdminError, RuntimeError):
                continue  # not acknowledged: it may or may not exist; only acks count
            self.acked.append(name)
            self.latencies.append((t0, time.monotonic() - t0))

    def _sample(self) -> None:
        while not self.stop_flag.is_set():
            for n in list(self.c.controllers.values()):
                if n.alive():
                    st = n.get("/api/v1/quorum", 1.0)
                    if st and st.get("role") == "leader":
                        self.leaders.setdefault(st["epoch"], set()).add(st["node_id"])


def change_with_kill(c: Cluster, watch: Watch, op: str, cid: int, expect_in: bool) -> float:
    """Ask for a voter change through a broker's HTTP API, SIGKILL the active controller
    while it is in flight, restart it, and repeat the request until the change is in
    force and committed. Seconds from the first request to the committed change."""
    url = broker_url(c)
    results: list[object] = []

    def request() -> None:
        try:
            if op == "add":
                body = {"controller_url": f"http://127.0.0.1:{c.controllers[cid].http_port}"}
                results.append(request_sync(url, "POST", "/api/v1/quorum/voters", body, 40))
            else:
                results.append(
                    request_sync(url, "DELETE", f"/api/v1/quorum/voters/{cid}", None, 40)
                )
        except AdminError as e:
            results.append(e)

    t0 = time.monotonic()
    active = c.wait_active_controller()
    th = threading.Thread(target=request, daemon=True)
    th.start()
    # The change is appended (in force on the leader) or already done: kill the leader.
    wait_for(
        lambda: results or (cid in {v["id"] for v in leader_view(c)["voter_set"]}) == expect_in,
        30,
        f"{op} {cid} appended",
    )
    active.kill9()
    active.start()
    th.join(60)
    deadline = time.monotonic() + 120
    while (cid in voter_ids(c)) != expect_in or leader_view(c)["voter_change_pending"]:
        assert time.monotonic() < deadline, f"{op} {cid} not in force: {results}"
        results.clear()
        request()  # lost with the old leader, or refused while pending: ask again
    return time.monotonic() - t0


def test_three_to_five_to_three_voters_with_the_active_controller_killed(cluster) -> None:
    c = cluster(brokers=3)
    watch = Watch(c).start()
    wait_for(lambda: len(watch.acked) >= 20, 60, "topic creations under way")
    for cid in (1004, 1005):
        start_joining_controller(c, cid)
    timings = {}
    for op, cid, expect in (
        ("add", 1004, True),
        ("add", 1005, True),
        ("remove", 1001, False),
        ("remove", 1002, False),
    ):
        before = len(watch.acked)
        timings[f"{op} {cid}"] = change_with_kill(c, watch, op, cid, expect)
        # Metadata keeps committing after each change.
        wait_for(lambda b=before: len(watch.acked) >= b + 10, 60, f"creations after {op} {cid}")
    assert voter_ids(c) == {1003, 1004, 1005}
    for cid in (1001, 1002):  # removed: they may go
        c.controllers[cid].stop()
    final = len(watch.acked)
    wait_for(lambda: len(watch.acked) >= final + 10, 60, "creations with the new quorum")
    watch.stop()

    # Every acknowledged creation is in every broker's metadata.
    acked = set(watch.acked)

    def all_there() -> bool:
        for b in c.brokers.values():
            got = b.get("/api/v1/topics", 10.0)
            if not got or not acked <= {t["name"] for t in got["topics"]}:
                return False
        return True

    wait_for(all_there, 60, "every acknowledged topic on every broker")
    two = {e: ids for e, ids in watch.leaders.items() if len(ids) > 1}
    assert not two, f"epochs with two leaders: {two}"
    lat = [s for _, s in watch.latencies]
    print(
        "\nvoter changes (request -> committed, active controller killed in each): "
        + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items())
        + f"\ntopic creations acknowledged: {len(lat)}, latency p50 "
        f"{statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms"
    )


def test_refusals_say_why_and_change_nothing(cluster) -> None:
    c = cluster(brokers=1)
    url = broker_url(c)

    def pinned() -> list | None:
        # The leader records the static voters' directory ids by itself first (a change
        # of its own): "nothing changed" is counted from there.
        st = leader_view(c)
        vs = st["voter_set"]
        return vs if all(v["directory_id"] for v in vs) and not st["voter_change_pending"] else None

    before = wait_for(pinned, 30, "the static voters' directory ids pinned")

    def refused(method: str, path: str, body: object = None) -> str:
        with pytest.raises(AdminError) as exc:
            request_sync(url, method, path, body, 20)
        return exc.value.message

    # An unknown or unreachable node.
    dead = free_port()
    assert "unreachable" in refused(
        "POST", "/api/v1/quorum/voters", {"controller_url": f"http://127.0.0.1:{dead}"}
    )
    unknown = {"node_id": 4242, "directory_id": "x", "endpoint": f"127.0.0.1:{dead}"}
    assert "not fetching" in refused("POST", "/api/v1/quorum/voters", unknown)
    assert "endpoint" in refused(
        "POST", "/api/v1/quorum/voters", {"node_id": 4242, "directory_id": "x"}
    )
    assert "VOTER_NOT_FOUND" in refused("DELETE", "/api/v1/quorum/voters/4242")
    assert "already a voter" in refused(
        "POST", "/api/v1/quorum/voters", {"node_id": 1001, "directory_id": "x"}
    )
    # The same through the CLI: the reason, a non-zero exit.
    r = strait(url, "quorum", "remove", "--node-id", "4242")
    assert r.returncode != 0 and "VOTER_NOT_FOUND" in r.stderr, r
    r = strait(url, "quorum", "add", "--controller", f"http://127.0.0.1:{dead}")
    assert r.returncode != 0 and "unreachable" in r.stderr, r
    r = strait(url, "quorum", "describe")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("quorum leader ") and "VOTER" in lines[1], r.stdout
    ids = {int(line.split()[0]) for line in lines[2:] if line.split()[0].isdigit()}
    assert set(c.controllers) <= ids, r.stdout
    # Bad input.
    assert "number" in refused("DELETE", "/api/v1/quorum/voters/abc")
    assert "controller_url" in refused("POST", "/api/v1/quorum/voters", {"node_id": "one"})
    # Losing the majority: with one voter down, removing a live one leaves a set of two
    # that needs the dead one. Refused once the leader has not heard from it for a
    # check-quorum period (1.5 fetch timeouts).
    active = c.wait_active_controller()
    victim, live = [n for n in c.controllers.values() if n is not active]
    victim.kill9()

    def silent() -> bool:
        st = leader_view(c)
        seen = {v["node_id"]: v["last_fetch_ms"] for v in st["voters"]}
        return seen[st["node_id"]] - (seen.get(victim.node_id) or 0) > 1600

    wait_for(silent, 30, f"the leader to stop hearing from {victim.node_id}")
    assert "LOSES_MAJORITY" in _try_remove(url, live.node_id)
    victim.start()
    assert leader_view(c)["voter_set"] == before


# Kafka 4.x's answer to a voter change while another is pending (AddVoterHandler and
# RemoveVoterHandler.handle*VoterRequest, `isOperationPending`): REQUEST_TIMED_OUT (7).
PENDING_MESSAGE = "Request timed out waiting for leader to handle previous voter change request"


def test_a_second_change_while_one_is_pending_gets_kafkas_answer(cluster) -> None:
    """An add that cannot commit (both followers stopped: the new set of four needs
    three) is pending; a removal asked meanwhile is refused as Kafka refuses it, through
    Kafka's own kafka-metadata-quorum, the HTTP API and `strait quorum remove`; once the
    followers are back the add commits. (A long fetch timeout keeps the leader from
    resigning while its followers are stopped.)"""
    ensure_jars()
    i = CONTROLLER_ARGS.index("--fetch-timeout-ms")
    args = [*CONTROLLER_ARGS[:i], *CONTROLLER_ARGS[i + 2 :], "--fetch-timeout-ms", "10000"]
    c = cluster(brokers=1, controller_args=args)
    url = broker_url(c)
    active = c.wait_active_controller()

    def own() -> dict:
        return active.get("/api/v1/quorum", 5.0) or {}

    def settled() -> bool:
        st = own()
        vs = st.get("voter_set") or []
        return bool(vs) and all(v["directory_id"] for v in vs) and not st["voter_change_pending"]

    wait_for(settled, 30, "the static voters' directory ids pinned")
    joining = start_joining_controller(c, 1004)

    def caught_up() -> bool:
        st = own()
        return any(
            o["node_id"] == 1004 and o["log_end_offset"] >= st["log_end_offset"]
            for o in st.get("observers", [])
        )

    wait_for(caught_up, 30, "1004 caught up")
    followers = [n for n in c.controllers.values() if n.node_id not in (active.node_id, 1004)]
    victim = followers[0]
    victim_dir = next(v["directory_id"] for v in own()["voter_set"] if v["id"] == victim.node_id)
    added: list[object] = []

    def add() -> None:
        body = {"controller_url": f"http://127.0.0.1:{joining.http_port}", "timeout_s": 60}
        try:
            added.append(request_sync(url, "POST", "/api/v1/quorum/voters", body, 90))
        except AdminError as e:
            added.append(e)

    for f in followers:
        f.signal(signal.SIGSTOP)
    th = threading.Thread(target=add, daemon=True)
    try:
        th.start()
        wait_for(lambda: own().get("voter_change_pending"), 10, "the add pending", 0.05)
        r = subprocess.run(
            java_cmd(
                KAFKA44_TOOLS["kafka-metadata-quorum"],
                [
                    "--bootstrap-server",
                    c.bootstrap,
                    "remove-controller",
                    "--controller-id",
                    str(victim.node_id),
                    "--controller-directory-id",
                    victim_dir,
                ],
                jars="4.4",
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode != 0 and PENDING_MESSAGE in r.stderr, r.stderr[-3000:]
        with pytest.raises(AdminError) as exc:
            request_sync(url, "DELETE", f"/api/v1/quorum/voters/{victim.node_id}", None, 20)
        assert exc.value.message == PENDING_MESSAGE and exc.value.error_code == 7, exc.value
        cli = strait(url, "quorum", "remove", "--node-id", str(victim.node_id))
        assert cli.returncode != 0 and PENDING_MESSAGE in cli.stderr, cli
        assert own()["voter_change_pending"]  # all of it inside the pending window
    finally:
        for f in followers:
            f.signal(signal.SIGCONT)
    th.join(90)
    assert added and not isinstance(added[0], AdminError), added
    assert voter_ids(c) == {*c.controllers}


def test_the_last_voter_is_never_removed(cluster) -> None:
    c = cluster(brokers=1, controllers=1)
    url = broker_url(c)
    assert "LAST_VOTER" in _try_remove(url, 1001)
    r = strait(url, "quorum", "remove", "--node-id", "1001")
    assert r.returncode != 0 and "last voter" in r.stderr, r
    assert voter_ids(c) == {1001}


def _try_remove(url: str, cid: int) -> str:
    try:
        request_sync(url, "DELETE", f"/api/v1/quorum/voters/{cid}", None, 20)
    except AdminError as e:
        return e.message
    raise AssertionError(f"removing {cid} was not refused")


def test_the_operators_planner_and_calls_change_a_real_quorum(cluster) -> None:
    """The operator's quorum planner on the real /api/v1/quorum view, and its admin calls
    on the brokers' API: a controller that joins as an observer (id 1000: pod 0 in the
    operator's numbering) is added once caught up, then an extra voter is removed, the
    leader last. (The Kubernetes side, the StatefulSet and the pods, is
    test_operator_k8s's and the real-node tier's.)"""
    c = cluster(brokers=1)
    url = broker_url(c)
    joining = start_joining_controller(c, 1000)
    own = f"http://127.0.0.1:{joining.http_port}"

    def view() -> dict:
        # Retried while no leader answers (a handover after a change, a killed leader).
        return wait_for(
            lambda: request_sync(url, "GET", "/api/v1/quorum", None, 10),
            30,
            "the quorum view",
            ignore=(AdminError,),
        )

    def pod(i: int) -> quorum.ControllerPod:
        node = c.controllers[1000 + i]
        return quorum.ControllerPod(i, node.alive(), node.get("/api/v1/quorum"))

    def pods() -> dict[int, quorum.ControllerPod]:
        return {i: pod(i) for i in range(4) if 1000 + i in c.controllers}

    # Voters 1001-1003 on "pods" 1-3, asked for four: 1000 is missing, added once caught up.
    step = wait_for(
        lambda: (s := quorum.plan(4, 4, view(), pods())).action == quorum.ADD and s,
        30,
        "the planner's add",
    )
    assert (step.node_id, step.ordinal, step.directory_id) == (
        1000,
        0,
        joining.get("/api/v1/quorum")["directory_id"],
    )

    async def call(fn: str, *args: object) -> dict:
        async with AdminClient(url, 20.0) as admin:
            return await getattr(admin, fn)(*args)

    def add() -> None:
        # The planner calls a controller caught up within MAX_LAG entries; the leader
        # wants it at its log end within a fetch timeout, and refuses (retriably) before:
        # the operator retries at its next pass, as this does.
        def added() -> bool:
            try:
                asyncio.run(call("add_voter", own, 15.0))
            except AdminError as e:
                if "NOT_CAUGHT_UP" not in str(e):
                    raise
                return False
            return True

        wait_for(added, 30, "controller 1000 added", every=0.5)

    add()
    assert voter_ids(c) == {1000, 1001, 1002, 1003}
    assert quorum.plan(4, 4, view(), pods()).action == quorum.IDLE
    # Asked for three: 1003 goes (on "pod" 3: the StatefulSet keeps it until removed).
    step = quorum.plan(3, 4, view(), pods())
    assert step.action == quorum.REMOVE and step.node_id == 1003 and step.replicas == 4, step
    asyncio.run(call("remove_voter", step.node_id, step.directory_id, 15.0))
    assert voter_ids(c) == {1000, 1001, 1002}
    done = quorum.plan(3, 4, view(), pods())
    assert (done.action, done.replicas) == (quorum.IDLE, 3)

    # 1000's storage is lost (its PVC): it comes back empty, with a new directory id. The
    # planner replaces its voter: remove the old (id, directory), add it back once caught up.
    old_dir = next(v for v in view()["voters"] if v["node_id"] == 1000)["directory_id"]
    joining.kill9()
    shutil.rmtree(os.path.join(c.data_dir, "controller-1000"))
    joining.start()
    step = wait_for(
        lambda: (s := quorum.plan(3, 3, view(), pods())).action == quorum.REMOVE and s,
        30,
        "the planner's replacement",
    )
    assert (step.node_id, step.directory_id) == (1000, old_dir), step
    asyncio.run(call("remove_voter", step.node_id, step.directory_id, 15.0))
    step = wait_for(
        lambda: (s := quorum.plan(3, 3, view(), pods())).action == quorum.ADD and s,
        30,
        "the planner's add of the new storage",
    )
    new_dir = joining.get("/api/v1/quorum")["directory_id"]
    assert step.node_id == 1000 and step.directory_id == new_dir != old_dir, step
    add()
    got = {v["node_id"]: v["directory_id"] for v in view()["voters"]}
    assert set(got) == {1000, 1001, 1002} and got[1000] == new_dir
    assert quorum.plan(3, 3, view(), pods()).action == quorum.IDLE


def test_a_never_changed_static_quorum_replaces_a_voter_back_on_empty_storage(cluster) -> None:
    """Three voters from the static --voters flags, never changed: the leader pins their
    directory ids by itself. A follower's metadata directory is then wiped (SIGKILL
    first) and it restarts on new storage: it is not counted as the voter (with the
    third voter down nothing commits), the quorum view and `strait quorum describe` show
    it as an observer with its new directory id, and `strait quorum remove` / `add` (the
    operator's replacement) make it a voter again. No committed metadata is lost.

    Prints the times: restart on new storage -> seen as an observer, and the replacement
    (remove the old storage, add the new) -> committed."""
    c = cluster(brokers=1)
    url = broker_url(c)
    own = {cid: n.get("/api/v1/quorum")["directory_id"] for cid, n in c.controllers.items()}

    def view() -> dict:
        # Retried while no leader answers (a handover after a change, a killed leader).
        return wait_for(
            lambda: request_sync(url, "GET", "/api/v1/quorum", None, 10),
            30,
            "the quorum view",
            ignore=(AdminError,),
        )

    # No change was asked for: the leader records the static voters' directory ids.
    wait_for(
        lambda: (
            {v["node_id"]: v["directory_id"] for v in view()["voters"]} == own
            and not view()["voter_change_pending"]
        ),
        30,
        "the static voters' directory ids pinned",
        ignore=(AdminError,),
    )
    created = []
    for i in range(10):
        body = {"name": f"before-{i}", "partitions": 1, "replication_factor": 1}
        request_sync(url, "POST", "/api/v1/topics", body, 20)
        created.append(body["name"])

    leader = leader_view(c)["node_id"]
    lost, third = sorted(cid for cid in c.controllers if cid != leader)
    node = c.controllers[lost]
    node.kill9()
    shutil.rmtree(os.path.join(c.data_dir, f"controller-{lost}"))
    node.start()
    t0 = time.monotonic()
    new_dir = wait_for(lambda: (node.get("/api/v1/quorum") or {}).get("directory_id"), 30, "up")
    assert new_dir != own[lost]

    def observed() -> bool:
        q = view()
        seen = {(o["node_id"], o["directory_id"]) for o in q["observers"]}
        mine = node.get("/api/v1/quorum") or {}
        return (lost, new_dir) in seen and mine.get("role") == "observer"

    wait_for(observed, 30, f"{lost} on new storage seen as an observer", ignore=(AdminError,))
    detect_s = time.monotonic() - t0
    q = view()
    assert {v["node_id"]: v["directory_id"] for v in q["voters"]} == own  # the old storage
    r = strait(url, "quorum", "describe")
    assert r.returncode == 0, r.stderr
    obs_rows = [line.split() for line in r.stdout.splitlines() if line.startswith(f"{lost} ")]
    assert [lost_row[:2] for lost_row in obs_rows if new_dir in lost_row] == [
        [str(lost), new_dir]
    ], r.stdout

    # Not counted: with the third voter down, the leader and the new storage commit nothing.
    c.controllers[third].kill9()
    hw = q["high_watermark"]
    blocked = {"name": "while-not-counted", "partitions": 1, "replication_factor": 1}
    with pytest.raises(AdminError):
        request_sync(url, "POST", "/api/v1/topics", blocked, 8)
    c.controllers[third].start()
    wait_for(
        lambda: view()["high_watermark"] > hw, 60, "the quorum commits again", ignore=(AdminError,)
    )

    # The replacement, as the operator does it: remove the old storage, add the new.
    def ask(*args: str) -> subprocess.CompletedProcess:
        r = strait(url, "quorum", *args)
        return r if r.returncode == 0 else None  # type: ignore[return-value]

    def voters_now() -> set[tuple[int, str]]:
        return {(v["node_id"], v["directory_id"]) for v in view()["voters"]}

    # Each step is done once the voter set says so: an attempt that timed out on a loaded
    # machine may still commit, and asking again then gets VOTER_NOT_FOUND / DUPLICATE.
    t1 = time.monotonic()
    wait_for(
        lambda: (
            (lost, own[lost]) not in voters_now()
            or ask("remove", "--node-id", str(lost), "--directory-id", own[lost])
        ),
        60,
        f"removing {lost}'s old storage",
    )
    controller_url = f"http://127.0.0.1:{node.http_port}"
    wait_for(
        lambda: (lost, new_dir) in voters_now() or ask("add", "--controller", controller_url),
        60,
        f"adding {lost} back",
    )
    replace_s = time.monotonic() - t1
    got = {v["node_id"]: v["directory_id"] for v in view()["voters"]}
    assert got == {**own, lost: new_dir}, got
    wait_for(lambda: (node.get("/api/v1/quorum") or {}).get("role") == "follower", 30, "voter")

    # Nothing committed was lost; metadata still commits.
    body = {"name": "after", "partitions": 1, "replication_factor": 1}
    request_sync(url, "POST", "/api/v1/topics", body, 20)
    names = {t["name"] for t in request_sync(url, "GET", "/api/v1/topics", None, 10)["topics"]}
    assert {*created, "after"} <= names, names
    print(
        f"\nlost voter of a never-changed static quorum: seen as an observer {detect_s:.2f}s "
        f"after its restart on new storage; replaced (remove + add, committed) in {replace_s:.2f}s"
    )
