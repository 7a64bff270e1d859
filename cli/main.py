"""`strait`: run a local StraitMQ and administer it.

Admin, produce and consume commands talk to a broker's HTTP API (default
http://127.0.0.1:8080, or $STRAIT_HTTP); any Kafka client can use the Kafka listener.
A secured API (https, client certificates, HTTP Basic) takes --ca-file, --cert/--key
and --user with $STRAIT_PASSWORD (or the $STRAIT_CA_FILE, $STRAIT_CERT, $STRAIT_KEY,
$STRAIT_USER variables). Errors are one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from straitmq.admin_client import AdminAuth, AdminError, request_sync
from straitmq.client_security import librdkafka_config
from straitmq.properties import read_properties

DEFAULT_HTTP = os.environ.get("STRAIT_HTTP", "http://127.0.0.1:8080")
# How the HTTP API is reached when it is secured (set by main from the global options).
_auth: AdminAuth | None = None


class CliError(Exception):
    pass


def _request(base: str, method: str, path: str, body: Any = None) -> Any:
    try:
        return request_sync(base, method, path, body, auth=_auth)
    except AdminError as e:
        if e.status == 401:
            raise CliError(
                f"{e.message} (give --user and $STRAIT_PASSWORD, or --cert/--key)"
            ) from None
        if e.unreachable:
            raise CliError(
                f"cannot reach StraitMQ at {base} ({e.message}); is it running? (`strait up`)"
            ) from None
        raise CliError(e.message) from None


def _parse_configs(items: list[str] | None) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"config '{item}' must look like key=value")
        out[key] = value
    return out


def _cleanup_line(configs: dict[str, str]) -> str:
    """How the topic's log is cleaned up: the policy and the settings it uses (the
    dirty ratio is per partition, in the table)."""
    policy = [p for p in configs.get("cleanup.policy", "delete").split(",") if p]
    parts = [f"cleanup {','.join(policy) or 'none (keeps everything)'}"]
    if "delete" in policy:
        ms, size = configs.get("retention.ms", "-1"), configs.get("retention.bytes", "-1")
        parts.append(f"retention.ms {ms}" if ms != "-1" else "retention.ms forever")
        if size != "-1":
            parts.append(f"retention.bytes {size}")
    if "compact" in policy:
        parts.append(f"min.cleanable.dirty.ratio {configs.get('min.cleanable.dirty.ratio')}")
        parts.append(f"delete.retention.ms {configs.get('delete.retention.ms')}")
    return "  ".join(parts)


def _dirty(cleaner: dict) -> str:
    if cleaner.get("uncleanable"):
        return f"uncleanable: {cleaner['uncleanable']}"
    return f"{cleaner['dirty_ratio']:.0%}"


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    cols = [headers, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cols) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cols
    )


# -- commands ------------------------------------------------------------------------


def cmd_up(a: argparse.Namespace) -> None:
    if not a.single:
        _up_cluster(a)
        return
    from straitmq.broker.__main__ import main as broker_main

    from straitmq.version import describe

    data = os.path.abspath(a.data_dir)
    print(
        f"starting StraitMQ {describe()} (single node) with data in {data}; Ctrl-C stops it",
        file=sys.stderr,
    )
    broker_main(
        [
            "--data-dir",
            data,
            "--listen",
            a.listen,
            "--http",
            a.http_listen,
            "--log-level",
            a.log_level,
        ]
    )


def _up_cluster(a: argparse.Namespace) -> None:
    """Controllers and brokers as separate processes; Ctrl-C stops them all (brokers
    first, each with a controlled shutdown)."""
    import signal
    import time

    from .local_cluster import LocalCluster

    port = a.listen.rpartition(":")[2]
    http_port = a.http_listen.rpartition(":")[2]
    cluster = LocalCluster(
        os.path.join(a.data_dir, "cluster"),
        controllers=3,
        brokers=a.brokers,
        kafka_base=int(port),
        http_base=int(http_port),
        controller_base=a.controller_port,
        broker_args=[
            "--default-replication-factor",
            str(min(3, a.brokers)),
            "--offsets-topic-replication-factor",
            str(min(3, a.brokers)),
        ],
        log_level=a.log_level,
    )
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
        print(
            f"StraitMQ cluster {cluster.cluster_id} ready: 3 controllers "
            f"({cluster.voters}), {a.brokers} brokers (Kafka {cluster.bootstrap}, HTTP "
            f"{', '.join(str(b.http_port) for b in cluster.brokers.values())}); data and logs "
            f"in {cluster.data_dir}; Ctrl-C stops all",
            file=sys.stderr,
            flush=True,
        )
        while not stop:
            for n in cluster.nodes():
                if not n.stopped and not n.alive():
                    print(f"{n.name} exited; see {n.log_path}", file=sys.stderr)
                    n.stopped = True
            time.sleep(0.5)
    except (RuntimeError, TimeoutError) as e:
        print(f"strait up: {e}", file=sys.stderr)
        failed = True
    else:
        failed = False
    finally:
        print("stopping StraitMQ...", file=sys.stderr, flush=True)
        cluster.stop()
    if failed:
        sys.exit(1)  # a script starting the cluster must not take it for running


def cmd_topic(a: argparse.Namespace) -> None:
    base = a.http
    if a.action == "list":
        topics = _request(base, "GET", "/api/v1/topics" + ("?internal=true" if a.internal else ""))
        rows = [
            [
                t["name"],
                len(t["partitions"]),
                t["replication_factor"],
                sum(p["high_watermark"] for p in t["partitions"]),
            ]
            for t in topics["topics"]
        ]
        print(_table(rows, ["TOPIC", "PARTITIONS", "RF", "MESSAGES"]))
    elif a.action == "create":
        t = _request(
            base,
            "POST",
            "/api/v1/topics",
            {
                "name": a.name,
                "partitions": a.partitions,
                "replication_factor": a.replication_factor,
                "configs": _parse_configs(a.config),
            },
        )
        print(f"created topic {t['name']} with {len(t['partitions'])} partition(s)")
    elif a.action == "describe":
        t = _request(base, "GET", f"/api/v1/topics/{urllib.parse.quote(a.name)}")
        print(f"topic {t['name']}  id {t['topic_id']}  rf {t['replication_factor']}")
        print(_cleanup_line(t["effective_configs"]))
        if t["configs"]:
            print("configs: " + ", ".join(f"{k}={v}" for k, v in sorted(t["configs"].items())))
        rows = [
            [
                p["partition"],
                p["leader"],
                ",".join(map(str, p["replicas"])),
                ",".join(map(str, p["isr"])),
                p["log_start_offset"],
                p["high_watermark"],
                p.get("last_stable_offset", p["high_watermark"]),
                p["size_bytes"],
                p["segments"],
            ]
            for p in t["partitions"]
        ]
        headers = [
            "PARTITION",
            "LEADER",
            "REPLICAS",
            "ISR",
            "START",
            "END",
            "STABLE",
            "BYTES",
            "SEGMENTS",
        ]
        if any("cleaner" in p for p in t["partitions"]):
            # As the asked broker's replica is: each replica cleans its own log.
            headers.append("DIRTY")
            for row, p in zip(rows, t["partitions"], strict=True):
                c = p.get("cleaner")
                row.append(_dirty(c) if c else "-")
        print(_table(rows, headers))
    elif a.action == "delete":
        _request(base, "DELETE", f"/api/v1/topics/{urllib.parse.quote(a.name)}")
        print(f"deleted topic {a.name}")
    elif a.action == "alter":
        body: dict[str, Any] = {}
        if a.partitions is not None:
            body["partitions"] = a.partitions
        configs = _parse_configs(a.config)
        for key in a.delete_config or []:
            configs[key] = None
        if configs:
            body["configs"] = configs
        if not body:
            raise CliError("nothing to alter: give --partitions, --config or --delete-config")
        t = _request(base, "PATCH", f"/api/v1/topics/{urllib.parse.quote(a.name)}", body)
        print(f"altered topic {t['name']}: {len(t['partitions'])} partition(s)")


def cmd_produce(a: argparse.Namespace) -> None:
    lines = [a.value] if a.value is not None else [line.rstrip("\n") for line in sys.stdin]
    records = []
    for line in lines:
        if not line and a.value is None:
            continue
        rec: dict[str, Any] = {"value": line}
        if a.key_separator and a.key_separator in line:
            rec["key"], rec["value"] = line.split(a.key_separator, 1)
        if a.key is not None:
            rec["key"] = a.key
        if a.header:
            rec["headers"] = dict(h.split("=", 1) for h in a.header)
        if a.partition is not None:
            rec["partition"] = a.partition
        records.append(rec)
    total = 0
    for i in range(0, len(records), 1000):
        chunk = records[i : i + 1000]
        _request(
            a.http,
            "POST",
            f"/api/v1/topics/{urllib.parse.quote(a.topic)}/records",
            {"records": chunk},
        )
        total += len(chunk)
        if len(records) > 1000:
            print(f"\rproduced {total}/{len(records)}", end="", file=sys.stderr)
    if len(records) > 1000:
        print(file=sys.stderr)
    print(f"produced {total} record(s) to {a.topic}", file=sys.stderr)


def _show(value: dict) -> str:
    if value.get("text") is not None:
        return value["text"]
    if "base64" in value:
        return "base64:" + value["base64"]
    return "null"


def cmd_consume(a: argparse.Namespace) -> None:
    topic = _request(a.http, "GET", f"/api/v1/topics/{urllib.parse.quote(a.topic)}")
    parts = (
        [a.partition] if a.partition is not None else [p["partition"] for p in topic["partitions"]]
    )
    positions: dict[int, int | None] = {p: None for p in parts}
    if not a.group:
        for p in topic["partitions"]:
            if p["partition"] in positions:
                positions[p["partition"]] = (
                    p["log_start_offset"] if a.from_beginning else p["high_watermark"]
                )
    shown = 0
    deadline = time.monotonic() + a.timeout if a.timeout else None
    while True:
        got = 0
        for p in parts:
            query = {"limit": str(min(500, a.max_messages - shown) if a.max_messages else 500)}
            if positions[p] is not None:
                query["offset"] = str(positions[p])
            if a.group:
                query["group"] = a.group
            res = _request(
                a.http,
                "GET",
                f"/api/v1/topics/{urllib.parse.quote(a.topic)}/partitions/{p}/records?"
                + urllib.parse.urlencode(query),
            )
            for r in res["records"]:
                key = _show(r["key"])
                line = (
                    f"{key}{a.key_separator}{_show(r['value'])}"
                    if a.print_key
                    else _show(r["value"])
                )
                if a.print_offset:
                    line = f"{p}:{r['offset']}\t{line}"
                print(line, flush=True)
                shown += 1
                got += 1
            positions[p] = res["next_offset"]
            if a.max_messages and shown >= a.max_messages:
                return
        if not got:
            if not a.follow or (deadline and time.monotonic() > deadline):
                return
            time.sleep(0.2)


def _partitions(by_topic: dict[str, list[int]]) -> str:
    """{topic: [0, 1, 2]} as "topic:0,1,2" (topics sorted, space separated), "-" if none."""
    return (
        " ".join(f"{t}:{','.join(str(p) for p in ps)}" for t, ps in sorted(by_topic.items()) if ps)
        or "-"
    )


def _or_dash(v: Any) -> Any:
    return "-" if v is None or v == "" else v


def cmd_group(a: argparse.Namespace) -> None:
    if a.action == "list":
        listed = _request(a.http, "GET", "/api/v1/groups")
        rows = [
            [g["group_id"], g.get("type", "classic"), g["state"], g["protocol_type"] or "-"]
            for g in listed["groups"]
        ]
        print(_table(rows, ["GROUP", "TYPE", "STATE", "PROTOCOL"]))
        if missing := listed.get("unreachable_brokers"):
            # Their groups are missing from the list, as from kafka-consumer-groups --list.
            print(f"(brokers {', '.join(map(str, missing))} did not answer)", file=sys.stderr)
        return
    g = _request(a.http, "GET", f"/api/v1/groups/{urllib.parse.quote(a.group)}")
    kind = g.get("type", "classic")
    epochs = (
        f"generation {_or_dash(g.get('group_epoch'))}"
        if kind == "classic"
        else (
            f"group epoch {_or_dash(g.get('group_epoch'))}  "
            f"assignment epoch {_or_dash(g.get('assignment_epoch'))}"
        )
    )
    print(
        f"group {g['group_id']}  type {kind}  state {g['state']}  {epochs}  "
        f"assignor {_or_dash(g.get('assignor'))}  members {len(g['members'])}"
    )
    if g["members"]:
        rows = []
        pending_col = kind == "consumer"
        for m in g["members"]:
            subs = m.get("subscribed_topic_regex") or ",".join(m.get("subscribed_topics") or [])
            row = [
                m["member_id"],
                _or_dash(m.get("member_epoch")),
                _or_dash(m.get("instance_id")),
                _or_dash(m["client_id"]),
                _or_dash(m["host"]),
                subs or "-",
                _partitions(m.get("assignment") or {}),
            ]
            if pending_col:
                row.append(_partitions(m.get("pending") or {}))
            rows.append(row)
        headers = ["MEMBER", "EPOCH", "INSTANCE", "CLIENT", "HOST", "SUBSCRIBED", "ASSIGNED"]
        print(_table(rows, headers + (["PENDING"] if pending_col else [])))
    if kind == "share":
        rows = [
            [o["topic"], o["partition"], o["start_offset"], o["end"], _or_dash(o["lag"])]
            for o in g["offsets"]
        ]
        if g.get("offsets_note"):
            print(f"start offsets: {g['offsets_note']}")
        elif not rows:
            print("start offsets: none saved yet")
        else:
            print(_table(rows, ["TOPIC", "PARTITION", "START-OFFSET", "END", "LAG"]))
        return
    rows = [
        [o["topic"], o["partition"], o["committed"], o["end"], _or_dash(o["lag"])]
        for o in g["offsets"]
    ]
    if rows:
        print(_table(rows, ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"]))


def cmd_cluster(a: argparse.Namespace) -> None:
    c = _request(a.http, "GET", "/api/v1/cluster")
    try:
        q = _request(a.http, "GET", "/api/v1/quorum")
    except CliError as e:
        q = {"error": str(e)}
    print(f"cluster {c['cluster_id']}")
    rows = [
        [
            b["id"],
            f"{b['host']}:{b['port']}",
            b["http_port"],
            b["rack"] or "-",
            "shutting down" if b["shutting_down"] else "fenced" if b["fenced"] else "alive",
        ]
        for b in c["brokers"]
    ]
    print(_table(rows, ["BROKER", "KAFKA", "HTTP", "RACK", "STATE"]))
    if "error" in q:
        print(f"controller quorum: {q['error']}")
    else:
        active = q["leader_id"] if q.get("active_controller", True) else "none yet"
        print(
            f"active controller {active}  quorum leader {q['leader_id']}  epoch {q['epoch']}  "
            f"high watermark {q['high_watermark']}"
        )
        vrows = [
            [
                v["node_id"],
                v.get("role")
                or ("unreachable" if v.get("reachable") is False else None)
                or ("leader" if v["node_id"] == q["leader_id"] else "-"),
                v.get("log_end_offset", "-"),
                v["lag"] if v.get("lag") is not None else "-",
            ]
            for v in q.get("voters", [])
        ]
        print(_table(vrows, ["VOTER", "ROLE", "LOG END", "LAG"]))
    print(
        f"under-replicated partitions {c['under_replicated_partitions']}  "
        f"offline partitions {c['offline_partitions']}"
    )


def cmd_features(a: argparse.Namespace) -> None:
    """Feature levels: what every node supports and what the cluster has finalized."""
    if a.action in ("upgrade", "downgrade"):
        updates: dict[str, int] = {}
        for item in a.feature:
            name, sep, level = item.partition("=")
            if not sep or not level.strip().lstrip("-").isdigit():
                raise CliError(f"--feature {item!r} must look like name=level")
            updates[name.strip()] = int(level)
        body = {
            "updates": updates,
            "downgrade": a.action == "downgrade",
            "unsafe": getattr(a, "unsafe", False),
            "validate_only": a.dry_run,
        }
        _request(a.http, "POST", "/api/v1/features", body)
        verb = "could be finalized" if a.dry_run else "finalized"
        for name, level in updates.items():
            print(f"{name} {verb} at {level}")
        if a.dry_run:
            return
    f = _request(a.http, "GET", "/api/v1/features")
    rows = [
        [
            x["name"],
            f"{x['supported_min']}-{x['supported_max']}",
            x["finalized"],
            "" if x["explicit"] else "(0.1.0 baseline)",
        ]
        for x in f["features"]
    ]
    print(_table(rows, ["FEATURE", "SUPPORTED", "FINALIZED", ""]))
    print(f"epoch {f['epoch']}")


def _cluster_clients(base: str, brokers_too: bool = False) -> tuple[list[dict], list[str]]:
    """Every broker's clients (GET /api/v1/clients of each), joined into one list, the
    brokers' own connections (replica fetchers, transaction markers) only if asked; and
    the brokers that could not be asked, saying why."""
    from straitmq.metadata import client_impact

    cluster = _request(base, "GET", "/api/v1/cluster")
    scheme = urllib.parse.urlsplit(base).scheme or "http"
    views: dict[int, list[dict]] = {}
    missing = []
    for b in cluster["brokers"]:
        # The broker --http names is asked there (its advertised host may be a name only
        # the cluster resolves); the others at their registered host and HTTP port.
        url = (
            base
            if b["id"] == cluster.get("node_id")
            else f"{scheme}://{b['host']}:{b['http_port']}"
        )
        try:
            views[b["id"]] = _request(url, "GET", "/api/v1/clients")["clients"]
        except CliError as e:
            missing.append(f"broker {b['id']} ({url}) not asked: {e}")
    merged = client_impact.merge(views)
    return [c for c in merged if brokers_too or "broker" not in c["roles"]], missing


def _ago(ms: int, now_ms: int, connected: bool) -> str:
    if connected:
        return "now"
    s = max(0, (now_ms - ms) // 1000)
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago"


def cmd_clients(a: argparse.Namespace) -> None:
    """The clients every broker has seen lately: software, identity, protocols."""
    import json

    clients, missing = _cluster_clients(a.http, a.all)
    for m in missing:
        print(f"strait: {m}", file=sys.stderr)
    if a.json:
        print(json.dumps(clients, indent=2, sort_keys=True))
        return
    now_ms = int(time.time() * 1000)
    rows = [
        [
            c["software"],
            c["client_id"] or "-",
            c["principal"],
            c["host"],
            c["connections"],
            ",".join(c["group_protocols"]) or "-",
            ",".join(f"v{v}" for v in c["transaction_versions"]) or "-",
            ",".join(str(b) for b in c["brokers"]),
            _ago(c["last_seen_ms"], now_ms, c["connections"] > 0),
        ]
        for c in clients
    ]
    headers = ["SOFTWARE", "CLIENT ID", "PRINCIPAL", "HOST", "CONNECTIONS", "GROUP PROTOCOL"]
    print(_table(rows, [*headers, "TXN", "BROKERS", "LAST SEEN"]))
    if a.apis:
        for c in clients:
            apis = ", ".join(
                f"{x['name']} {'/'.join(f'v{v}' for v in x['versions'])}" for x in c["apis"]
            )
            print(f"{c['software']} {c['client_id'] or '-'}@{c['host']}: {apis}")


def _targets(items: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (part for arg in items for part in arg.split(",") if part.strip()):
        name, sep, level = item.partition("=")
        if not sep or not level.strip().lstrip("-").isdigit():
            raise CliError(f"--to {item!r} must look like feature=level[,feature=level]")
        out[name.strip()] = int(level)
    return out


def cmd_upgrade(a: argparse.Namespace) -> None:
    """Which clients a change of feature levels would affect (changes nothing)."""
    from straitmq.metadata import client_impact, features

    f = _request(a.http, "GET", "/api/v1/features")
    current = {x["name"]: x["finalized"] for x in f["features"]}
    if a.to_release:
        ranges = features.RELEASES.get(a.to_release)
        if ranges is None:
            known = ", ".join(features.RELEASES)
            raise CliError(f"--to-release {a.to_release}: known releases: {known}")
        # The levels that release can run at: the cluster's, where it supports them.
        targets = {
            n: min(max(current.get(n, 0), lo), hi)
            for n, (lo, hi) in ranges.items()
            if not lo <= current.get(n, 0) <= hi
        }
        if not targets:
            print(f"release {a.to_release} supports every finalized level: no level changes")
    else:
        targets = _targets(a.to or [])
        if not targets:
            raise CliError("give --to FEATURE=LEVEL[,...] or --to-release RELEASE")
    clients, missing = _cluster_clients(a.http)
    for m in missing:
        print(f"strait: {m} (its clients are not in this plan)", file=sys.stderr)
    result = client_impact.plan(clients, current, targets)
    for name, (now, to) in result.changes.items():
        kind = "upgrade" if to > now else "downgrade" if to < now else "no change"
        print(f"{name}: {now} -> {to} ({kind})")
        for finding in (x for x in result.findings if x.feature == name):
            print(f"  {'!' if finding.affected else '-'} {finding.sentence}")
            shown = finding.clients if finding.affected or a.verbose else finding.clients[:5]
            for c in shown:
                print(
                    f"      client.id={c.get('client_id') or '-'} "
                    f"principal={c.get('principal')} host={c.get('host')} "
                    f"brokers={','.join(str(b) for b in c.get('brokers', ()))}"
                )
            if len(shown) < len(finding.clients):
                print(f"      and {len(finding.clients) - len(shown)} more (--verbose lists them)")
    for refusal in result.refusals:
        print(f"refused: {refusal}")
    affected = {client_impact.identity(c) for x in result.affected for c in x.clients}
    print(
        f"{len(affected)} of {len(clients)} clients affected"
        if affected
        else f"no client affected ({len(clients)} seen)"
    )
    if result.refusals:
        raise CliError("the cluster would refuse part of this change (see above)")


def cmd_quorum(a: argparse.Namespace) -> None:
    """The controller quorum's voters (KIP-853: they change, one at a time)."""
    if a.action == "add":
        if a.controller is None and a.node_id is None:
            raise CliError("give --controller http://host:port (the new controller's address)")
        body: dict[str, Any] = {"timeout_s": a.timeout}
        if a.controller is not None:
            body["controller_url"] = a.controller
        if a.node_id is not None:
            body.update(node_id=a.node_id, directory_id=a.directory_id, endpoint=a.endpoint)
        r = _request(a.http, "POST", "/api/v1/quorum/voters", body)
        print(f"voter added at offset {r['offset']} (committed in {r['commit_ms']} ms)")
        print(_voter_set_table(r["voters"]))
        return
    if a.action == "remove":
        path = f"/api/v1/quorum/voters/{a.node_id}?timeout_s={a.timeout}"
        if a.directory_id:
            path += f"&directory_id={a.directory_id}"
        r = _request(a.http, "DELETE", path)
        print(
            f"voter {a.node_id} removed at offset {r['offset']} (committed in {r['commit_ms']} ms)"
        )
        print(_voter_set_table(r["voters"]))
        return
    q = _request(a.http, "GET", "/api/v1/quorum")
    pending = "  a voter change is pending" if q.get("voter_change_pending") else ""
    print(
        f"quorum leader {q['leader_id']}  epoch {q['epoch']}  "
        f"high watermark {q['high_watermark']}{pending}"
    )
    rows = [
        [
            v["node_id"],
            v.get("directory_id") or "-",
            v.get("role") or ("unreachable" if v.get("reachable") is False else "-"),
            v.get("log_end_offset", "-") if v.get("log_end_offset") is not None else "-",
            v["lag"] if v.get("lag") is not None else "-",
            v.get("url") or "-",
        ]
        for v in q.get("voters", [])
    ]
    print(_table(rows, ["VOTER", "DIRECTORY", "ROLE", "LOG END", "LAG", "URL"]))
    obs = [
        [o["node_id"], o.get("directory_id") or "-", o["log_end_offset"], o["lag"]]
        for o in q.get("observers", [])
    ]
    if obs:
        print(_table(obs, ["OBSERVER", "DIRECTORY", "LOG END", "LAG"]))


def _voter_set_table(voters: list[dict]) -> str:
    rows = [
        [v["id"], v.get("directory_id") or "-", (v.get("endpoints") or {}).get("CONTROLLER", "-")]
        for v in voters
    ]
    return _table(rows, ["VOTER", "DIRECTORY", "ENDPOINT"])


def _reassign_rows(items: list[dict]) -> str:
    rows = []
    for r in items:
        ends = r.get("replica_log_end_offsets") or {}
        leo = r.get("leader_log_end_offset")
        copied = ", ".join(
            f"{x}: {ends[str(x)]}/{leo}" if str(x) in ends and leo is not None else f"{x}: ?"
            for x in r["adding"]
        )
        rows.append(
            [
                f"{r['topic']}-{r['partition']}",
                ",".join(map(str, r["target"])),
                ",".join(map(str, r["adding"])) or "-",
                ",".join(map(str, r["removing"])) or "-",
                ",".join(map(str, r["isr"])),
                copied or "-",
            ]
        )
    return _table(rows, ["PARTITION", "TARGET", "ADDING", "REMOVING", "ISR", "COPIED"])


def _set_throttle(base: str, value: int | None) -> None:
    body = {"configs": {"replication.throttled.rate": value}}
    _request(base, "PUT", "/api/v1/cluster/configs", body)


def cmd_reassign(a: argparse.Namespace) -> None:
    base = a.http
    throttle_was_set = False
    if a.list:
        res = _request(base, "GET", "/api/v1/reassignments")
        if not res["reassignments"]:
            print("no reassignments in progress")
        else:
            print(_reassign_rows(res["reassignments"]))
        rate = res["throttle_bytes_per_sec"]
        print(f"replication throttle: {f'{rate} bytes/s' if rate > 0 else 'none'}")
        return
    moving = a.replicas is not None or a.cancel
    if moving:
        if a.topic is None or a.partition is None:
            raise CliError("give --topic and --partition with --replicas or --cancel")
        if a.replicas is not None and a.cancel:
            raise CliError("give either --replicas or --cancel, not both")
        replicas = None
        if a.replicas is not None:
            try:
                replicas = [int(x) for x in a.replicas.split(",") if x.strip()]
            except ValueError:
                raise CliError(
                    f"--replicas must be broker ids like 2,3,4, not {a.replicas!r}"
                ) from None
            if not replicas:
                raise CliError("--replicas needs at least one broker id")
        body: dict[str, Any] = {
            "partitions": [{"topic": a.topic, "partition": a.partition, "replicas": replicas}]
        }
        if a.throttle is not None:
            body["throttle_bytes_per_sec"] = a.throttle
            throttle_was_set = a.throttle > 0
        res = _request(base, "POST", "/api/v1/reassignments", body)
        for p in res["partitions"]:
            if replicas is None:
                what = "cancelled"
            elif p["done"]:
                what = "done"
            else:
                what = f"started (adding {p['adding']}, removing {p['removing']})"
            print(f"{p['topic']}-{p['partition']}: replicas {p['replicas']}: {what}")
    elif a.throttle is not None:
        value = a.throttle if a.throttle > 0 else None
        _set_throttle(base, value)
        print(f"replication throttle: {f'{a.throttle} bytes/s' if value else 'none'}")
    elif not a.wait:
        raise CliError("nothing to do: give --replicas, --cancel, --list, --throttle or --wait")
    if a.wait:
        _wait_reassignments(base, a.topic, a.partition, a.timeout)
        if throttle_was_set:
            left = _request(base, "GET", "/api/v1/reassignments")["reassignments"]
            if not left:
                _set_throttle(base, None)
                print("replication throttle removed")


def _wait_reassignments(
    base: str, topic: str | None, partition: int | None, timeout: float
) -> None:
    """Poll until the partition (or, without --topic, every partition) stops moving."""
    deadline = time.monotonic() + timeout if timeout else None
    last = ""
    while True:
        res = _request(base, "GET", "/api/v1/reassignments")["reassignments"]
        mine = [
            r
            for r in res
            if (topic is None or r["topic"] == topic)
            and (partition is None or r["partition"] == partition)
        ]
        if not mine:
            print("reassignment complete")
            return
        text = _reassign_rows(mine)
        if text != last:
            print(text, flush=True)
            last = text
        if deadline is not None and time.monotonic() > deadline:
            raise CliError(f"still reassigning after {timeout:.0f}s (see `strait reassign --list`)")
        time.sleep(1.0)


def cmd_rack_from_node(a: argparse.Namespace) -> None:
    from straitmq.operator.node_rack import RackError, write_rack

    if not a.node:
        raise CliError("--node or NODE_NAME is required")
    try:
        rack = write_rack(a.node, a.label, Path(a.out))
    except RackError as e:
        raise CliError(str(e)) from None
    print(f"rack {rack} (node {a.node}, label {a.label}) written to {a.out}")


class _VersionAction(argparse.Action):
    """--version: `strait 0.2.0.dev0 (commit 1379679a4ec5)` on stdout, as argparse's
    "version" action prints, but worked out only when asked (it may run git)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version and the commit it was built from, and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from straitmq.version import describe

        print(f"{parser.prog} {describe()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:  # noqa: PLR0915 (a table: one line per option)
    p = argparse.ArgumentParser(prog="strait", description="StraitMQ command line.")
    p.add_argument("--version", action=_VersionAction)
    p.add_argument("--http", default=DEFAULT_HTTP, help="broker HTTP API (default %(default)s)")
    env = os.environ.get
    p.add_argument(
        "--ca-file",
        default=env("STRAIT_CA_FILE"),
        help="CA file (PEM) the broker's https certificate chains to ($STRAIT_CA_FILE)",
    )
    p.add_argument(
        "--cert",
        default=env("STRAIT_CERT"),
        help="client certificate (PEM) for mTLS ($STRAIT_CERT)",
    )
    p.add_argument(
        "--key",
        default=env("STRAIT_KEY"),
        help="its private key, if not in the --cert file ($STRAIT_KEY)",
    )
    p.add_argument(
        "--user",
        default=env("STRAIT_USER"),
        help="HTTP Basic user ($STRAIT_USER); the password from $STRAIT_PASSWORD or --password",
    )
    p.add_argument(
        "--password",
        default=env("STRAIT_PASSWORD"),
        help="HTTP Basic password (prefer $STRAIT_PASSWORD: arguments are visible "
        "to other users of the machine)",
    )
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="a Kafka client properties file, as Kafka's tools take it "
        "(ssl.ca.location or ssl.truststore.location, ssl.keystore.location or "
        "ssl.certificate.location/ssl.key.location, sasl.jaas.config or "
        "sasl.username/sasl.password): the same credentials for the HTTP API; "
        "the flags above win",
    )
    # What --command-config's ssl.endpoint.identification.algorithm may turn off.
    p.set_defaults(check_hostname=True)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run a local StraitMQ in the foreground")
    up.add_argument(
        "--single",
        action="store_true",
        help="one combined node (controller and broker in one process)",
    )
    up.add_argument("--brokers", type=int, default=3, help="brokers in cluster mode")
    up.add_argument("--controller-port", type=int, default=9191, help="first controller port")
    up.add_argument("--data-dir", default=".strait-data")
    up.add_argument("--listen", default="127.0.0.1:9092")
    up.add_argument("--http-listen", default="127.0.0.1:8080")
    up.add_argument("--log-level", default="warning")
    up.set_defaults(func=cmd_up)

    topic = sub.add_parser("topic", help="create, list, describe, alter, delete topics")
    tsub = topic.add_subparsers(dest="action", required=True)
    tl = tsub.add_parser("list")
    tl.add_argument("--internal", action="store_true", help="include internal topics")
    tc = tsub.add_parser("create")
    tc.add_argument("name")
    tc.add_argument("-p", "--partitions", type=int, default=1)
    tc.add_argument("-r", "--replication-factor", type=int, default=1)
    tc.add_argument("-c", "--config", action="append", help="key=value (repeatable)")
    td = tsub.add_parser("describe")
    td.add_argument("name")
    tx = tsub.add_parser("delete")
    tx.add_argument("name")
    ta = tsub.add_parser("alter")
    ta.add_argument("name")
    ta.add_argument("-p", "--partitions", type=int)
    ta.add_argument("-c", "--config", action="append", help="key=value (repeatable)")
    ta.add_argument("--delete-config", action="append", help="config key to reset")
    topic.set_defaults(func=cmd_topic)

    prod = sub.add_parser("produce", help="produce lines of stdin (or --value) to a topic")
    prod.add_argument("topic")
    prod.add_argument("--value")
    prod.add_argument("--key")
    prod.add_argument("--key-separator", help="split each line into key and value")
    prod.add_argument("--header", action="append", help="name=value (repeatable)")
    prod.add_argument("--partition", type=int)
    prod.set_defaults(func=cmd_produce)

    cons = sub.add_parser("consume", help="print records of a topic")
    cons.add_argument("topic")
    cons.add_argument("--group", help="start from and commit to this group's offsets")
    cons.add_argument("--from-beginning", action="store_true")
    cons.add_argument("--partition", type=int)
    cons.add_argument("-n", "--max-messages", type=int, default=0)
    cons.add_argument("-f", "--follow", action="store_true", help="keep waiting for records")
    cons.add_argument("--timeout", type=float, default=0, help="with --follow: stop after N s")
    cons.add_argument("--print-key", action="store_true")
    cons.add_argument("--print-offset", action="store_true")
    cons.add_argument("--key-separator", default="\t")
    cons.set_defaults(func=cmd_consume)

    clu = sub.add_parser("cluster", help="brokers, controller quorum and partition health")
    csub = clu.add_subparsers(dest="action", required=True)
    csub.add_parser("status")
    clu.set_defaults(func=cmd_cluster)

    fea = sub.add_parser(
        "features",
        help="describe feature levels; finalize (upgrade) or downgrade one",
        description="A new release is rolled out first and finalized after: until its "
        "levels are finalized, every node writes only what the previous release reads, so "
        "a rollback stays possible. Examples: strait features describe; strait features "
        "upgrade --feature straitmq.metadata.version=2 (ends rollback to 0.1.0); strait "
        "features downgrade --feature transaction.version=1. Refused with the reason when "
        "some broker or controller does not support the level.",
    )
    fsub = fea.add_subparsers(dest="action", required=True)
    fsub.add_parser("describe")
    for verb in ("upgrade", "downgrade"):
        fu = fsub.add_parser(verb)
        fu.add_argument("--feature", action="append", required=True, metavar="NAME=LEVEL")
        fu.add_argument("--dry-run", action="store_true", help="check only, change nothing")
        if verb == "downgrade":
            fu.add_argument("--unsafe", action="store_true", help="allow a lossy downgrade")
    fea.set_defaults(func=cmd_features)

    cli = sub.add_parser(
        "clients",
        help="the clients every broker has seen lately: software, API versions, protocols",
        description="Each broker keeps the clients it has seen lately (connected now, or "
        "within --client-registry-expiry-ms): software name and version (ApiVersions v3+; "
        "older clients are unknown), client id, principal, host, the API versions used, "
        "the group protocol and the transaction version. This asks every broker.",
    )
    cli.add_argument("--apis", action="store_true", help="also list each client's API versions")
    cli.add_argument("--json", action="store_true", help="print the joined list as JSON")
    cli.add_argument(
        "--all", action="store_true", help="also the brokers' own connections (replication)"
    )
    cli.set_defaults(func=cmd_clients)

    upg = sub.add_parser(
        "upgrade",
        help="plan a change of feature levels: which clients it would affect",
        description="Which clients a change of feature levels would affect, from what the "
        "brokers have seen them use; changes nothing. Examples: strait upgrade plan --to "
        "transaction.version=1; strait upgrade plan --to group.version=0,share.version=0; "
        "strait upgrade plan --to-release 0.1.0.",
    )
    usub = upg.add_subparsers(dest="action", required=True)
    up_plan = usub.add_parser("plan")
    up_plan.add_argument("--to", action="append", metavar="FEATURE=LEVEL[,...]")
    up_plan.add_argument(
        "--to-release", metavar="RELEASE", help="the levels a release can run at (e.g. 0.1.0)"
    )
    up_plan.add_argument(
        "-v", "--verbose", action="store_true", help="list every unaffected client too"
    )
    upg.set_defaults(func=cmd_upgrade)

    quo = sub.add_parser(
        "quorum",
        help="describe the controller quorum; add or remove a voter",
        description="The controller quorum's voters change one at a time, each answered "
        "once committed. Examples: strait quorum describe; strait quorum add --controller "
        "http://10.0.0.4:9093 (a controller started outside --voters, fetching as an "
        "observer); strait quorum remove --node-id 3. Refused with the reason: a change "
        "while another is pending, removing the last voter, one that would leave no live "
        "majority, an unknown or unreachable controller.",
    )
    qsub = quo.add_subparsers(dest="action", required=True)
    qsub.add_parser("describe")
    qa = qsub.add_parser("add")
    qa.add_argument("--controller", help="the new controller's URL: http://host:port")
    qa.add_argument("--node-id", type=int)
    qa.add_argument("--directory-id")
    qa.add_argument("--endpoint", help="host:port the voters reach it on")
    qa.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the commit")
    qr = qsub.add_parser("remove")
    qr.add_argument("--node-id", type=int, required=True)
    qr.add_argument("--directory-id", help="only that storage of the id (a replaced voter)")
    qr.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the commit")
    quo.set_defaults(func=cmd_quorum)

    rea = sub.add_parser(
        "reassign",
        help="move a partition's replicas to other brokers",
        description="Start, cancel, list and wait for partition reassignments. Examples: "
        "strait reassign --topic orders --partition 0 --replicas 2,3,4 --throttle 1048576 "
        "--wait; strait reassign --topic orders --partition 0 --cancel; "
        "strait reassign --list",
    )
    rea.add_argument("--topic")
    rea.add_argument("--partition", type=int)
    rea.add_argument("--replicas", help="target broker ids, preferred leader first: 2,3,4")
    rea.add_argument("--cancel", action="store_true", help="stop moving this partition")
    rea.add_argument("--list", action="store_true", help="show reassignments in progress")
    rea.add_argument(
        "--throttle",
        type=int,
        metavar="BYTES",
        help="bytes/s for copying to new replicas (cluster-wide; 0 or -1 removes it)",
    )
    rea.add_argument("--wait", action="store_true", help="poll and print progress until done")
    rea.add_argument("--timeout", type=float, default=0, help="with --wait: give up after N s")
    rea.set_defaults(func=cmd_reassign)

    grp = sub.add_parser("group", help="list and describe consumer groups")
    gsub = grp.add_subparsers(dest="action", required=True)
    gsub.add_parser("list")
    gd = gsub.add_parser("describe")
    gd.add_argument("group")
    grp.set_defaults(func=cmd_group)

    rack = sub.add_parser(
        "rack-from-node",
        help="write a Kubernetes node's rack label to a file (the broker pods' init step)",
    )
    rack.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME"),
        help="the node's name (default: $NODE_NAME, from spec.nodeName)",
    )
    rack.add_argument("--label", required=True, help="the node label that names the rack")
    rack.add_argument("--out", required=True, help="the file to write the rack to")
    rack.set_defaults(func=cmd_rack_from_node)
    return p


def _apply_command_config(args: argparse.Namespace) -> None:
    """Fill the HTTP credentials the flags and environment left unset from a Kafka client
    properties file (Java's or librdkafka's names). The broker's HTTP API checks a Basic
    user against the same SCRAM and PLAIN users as the Kafka listener, and a client
    certificate as mTLS does, so one file serves both. Raises ValueError for a setting
    that cannot be honoured."""
    conf = librdkafka_config(read_properties(args.command_config))
    for inline in ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem"):
        if inline in conf:
            raise ValueError(
                f"{inline} (certificates inline) is not read by strait; "
                "give PEM files (ssl.ca.location, ssl.keystore.location)"
            )
    if "ssl.keystore.location" in conf:  # librdkafka's name for a PKCS#12 keystore
        raise ValueError(
            "a PKCS12 keystore is not read by strait; give a PEM keystore "
            "(ssl.keystore.type=PEM) or ssl.certificate.location"
        )
    if conf.get("ssl.key.password"):
        raise ValueError(
            "an encrypted private key is not read by strait; give an unencrypted PEM key"
        )
    protocol = conf.get("security.protocol", "PLAINTEXT").upper()
    if protocol.startswith("SASL_") and not conf.get("sasl.username"):
        raise ValueError(
            f"security.protocol={protocol} needs sasl.jaas.config "
            "(or sasl.username and sasl.password)"
        )
    args.ca_file = args.ca_file or conf.get("ssl.ca.location")
    # Java's "" and librdkafka's "none" turn the host name check off, as for the listener.
    args.check_hostname = conf.get("ssl.endpoint.identification.algorithm") != "none"
    if not args.cert:
        args.cert = conf.get("ssl.certificate.location")
        args.key = args.key or conf.get("ssl.key.location")
    if not args.user and conf.get("sasl.username"):
        args.user = conf["sasl.username"]
        args.password = args.password if args.password is not None else conf.get("sasl.password")


def main(argv: list[str] | None = None) -> None:
    global _auth
    args = build_parser().parse_args(argv)
    _auth = None
    if args.command_config:
        try:
            _apply_command_config(args)
        except (OSError, ValueError) as e:
            print(f"strait: --command-config {args.command_config}: {e}", file=sys.stderr)
            sys.exit(1)
    if args.ca_file or args.cert or args.user:
        if args.user and args.password is None:
            print("strait: --user needs a password: set $STRAIT_PASSWORD", file=sys.stderr)
            sys.exit(1)
        _auth = AdminAuth(
            ca_file=args.ca_file,
            cert_file=args.cert,
            key_file=args.key,
            username=args.user,
            password=args.password,
            check_hostname=args.check_hostname,
        )
    try:
        args.func(args)
    except CliError as e:
        print(f"strait: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
