"""The group APIs' version-dependent fields, on the wire against a real broker.

The state machine's rules are unit-tested in test_group_state_machine.py; this checks
that the Kafka handlers pass what depends on the request version: JoinGroup v9's
skip_assignment for a returning static leader (older versions are told the previous
leader instead), SyncGroup v5's protocol name check, LeaveGroup v3+ by instance id.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kio.schema.errors import ErrorCode as E
from test_errors import Raw, kio_module, make
from waiting import wait_for

TIMEOUT = datetime.timedelta(milliseconds=10_000)


def join(raw: Raw, version: int, group: str, member_id: str = "", instance: str = "i1") -> Any:
    m = kio_module("join_group", version)
    return raw.call(
        make(
            m.JoinGroupRequest,
            group_id=group,
            session_timeout=TIMEOUT,
            rebalance_timeout=TIMEOUT,
            member_id=member_id,
            group_instance_id=instance,
            protocol_type="consumer",
            protocols=(m.JoinGroupRequestProtocol(name="range", metadata=b"sub"),),
            reason=None,
        )
    )


def sync(raw: Raw, group: str, member_id: str, generation: int, protocol: str) -> Any:
    m = kio_module("sync_group", 5)
    return raw.call(
        m.SyncGroupRequest(
            group_id=group,
            generation_id=generation,
            member_id=member_id,
            group_instance_id="i1",
            protocol_type="consumer",
            protocol_name=protocol,
            assignments=(m.SyncGroupRequestAssignment(member_id=member_id, assignment=b"all"),),
        )
    )


def test_static_rejoin_skip_assignment_by_version_and_leave_by_instance(broker) -> None:
    group = f"wire-{uuid.uuid4().hex[:8]}"
    r = Raw(broker)
    try:
        _static_rejoin_and_leave(r, group)
    finally:
        r.close()


def _static_rejoin_and_leave(r: Raw, group: str) -> None:
    fc = kio_module("find_coordinator", 3)
    wait_for(
        lambda: r.call(fc.FindCoordinatorRequest(key=group, key_type=0)).error_code == E.none,
        30,
        "the group coordinator",
    )
    first = join(r, 9, group)  # static: no MEMBER_ID_REQUIRED; initial delay 0 in tests
    assert first.error_code == E.none and first.leader == first.member_id
    wrong = sync(r, group, first.member_id, first.generation_id, "roundrobin")
    assert wrong.error_code == E.inconsistent_group_protocol
    ok = sync(r, group, first.member_id, first.generation_id, "range")
    assert ok.error_code == E.none and ok.assignment == b"all"

    # The same instance restarts: v9 keeps the lead but must not reassign...
    v9 = join(r, 9, group)
    assert v9.error_code == E.none and v9.generation_id == first.generation_id
    assert v9.skip_assignment and v9.leader == v9.member_id != first.member_id
    assert [m.member_id for m in v9.members] == [v9.member_id]
    # ...an older client is told the previous leader, so it syncs as a follower.
    v5 = join(r, 5, group)
    assert v5.error_code == E.none and v5.generation_id == first.generation_id
    assert v5.leader == v9.member_id != v5.member_id and v5.members == ()

    hb = kio_module("heartbeat", 4)
    fenced = r.call(
        hb.HeartbeatRequest(
            group_id=group,
            generation_id=first.generation_id,
            member_id=v9.member_id,
            group_instance_id="i1",
        )
    )
    assert fenced.error_code == E.fenced_instance_id

    lg = kio_module("leave_group", 5)
    left = r.call(
        lg.LeaveGroupRequest(
            group_id=group,
            members=(lg.MemberIdentity(member_id="", group_instance_id="i1", reason=None),),
        )
    )
    assert [(m.group_instance_id, m.error_code) for m in left.members] == [("i1", E.none)]
    dg = kio_module("describe_groups", 5)
    (desc,) = r.call(
        dg.DescribeGroupsRequest(groups=(group,), include_authorized_operations=False)
    ).groups
    assert desc.group_state == "Empty" and desc.members == ()
