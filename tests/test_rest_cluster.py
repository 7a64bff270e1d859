"""The REST API on a 3-broker cluster, through the one admin client the CLI uses.

A REST produce whose records land on partitions led by different brokers once bounced
between 307s ("too many redirects", found when a pod posted through the bootstrap
Service): the broker that gets it now writes its own partitions and forwards each other
leader its share.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from cluster_support import ROOT, cluster_factory

from straitmq.admin_client import AdminError, request_sync

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def test_rest_produce_spanning_leaders_writes_every_partition_once(cluster) -> None:
    c = cluster()
    c.create_topic("spread", partitions=6, rf=1, min_isr=1)
    b = c.any_broker()
    base = f"http://{b.host}:{b.http_port}"
    topic = request_sync(base, "GET", "/api/v1/topics/spread")
    leaders = {p["partition"]: p["leader"] for p in topic["partitions"]}
    assert len(set(leaders.values())) == 3, leaders  # RF 1 over 3 brokers: all lead some

    records = [{"value": f"v{i}", "partition": i % 6} for i in range(60)]
    answer = request_sync(base, "POST", "/api/v1/topics/spread/records", {"records": records})
    assert sorted((o["partition"], o["count"]) for o in answer["offsets"]) == [
        (p, 10) for p in range(6)
    ]
    got = []
    for p in range(6):
        page = request_sync(base, "GET", f"/api/v1/topics/spread/partitions/{p}/records?limit=100")
        got += [(p, r["value"]["text"]) for r in page["records"]]
    assert sorted(got) == sorted((i % 6, f"v{i}") for i in range(60))  # each exactly once

    # The CLI (the same client) produces keyed records spread over all leaders.
    out = subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", base, "produce", "spread"],
        input="\n".join(f"line{i}" for i in range(30)),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr

    with pytest.raises(AdminError) as e:
        request_sync(
            base,
            "POST",
            "/api/v1/topics/spread/records",
            {"records": [{"value": "x", "partition": 9}]},
        )
    assert e.value.status == 400 and "partition must be in [0, 6)" in e.value.message
