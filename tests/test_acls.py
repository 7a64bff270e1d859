"""ACLs with Kafka's semantics: bindings as metadata records, the StandardAuthorizer's
decisions, and every API's check, through real clients over SASL.

The pure part (the authorizer's rules, binding validation, filters) is checked on the
classes; the rest against one broker with the authorizer on: a PLAINTEXT listener (whose
principal is User:ANONYMOUS, not a super user here, so it stands for a replica fetcher
without CLUSTER_ACTION) and a SASL_PLAINTEXT listener with PLAIN users. `admin` is the
super user; every other principal starts with no rights and gains them binding by binding.
"""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from conftest import BrokerProcess
from kio.schema.alter_partition_reassignments.v0.request import (
    AlterPartitionReassignmentsRequest,
    ReassignablePartition,
    ReassignableTopic,
)
from kio.schema.create_acls.v3.request import AclCreation, CreateAclsRequest
from kio.schema.delete_records.v2.request import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
)
from kio.schema.describe_acls.v3.request import DescribeAclsRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.describe_log_dirs.v4.request import DescribeLogDirsRequest
from kio.schema.describe_quorum.v2.request import DescribeQuorumRequest, PartitionData, TopicData
from kio.schema.describe_topic_partitions.v0.request import (
    DescribeTopicPartitionsRequest,
    TopicRequest,
)
from kio.schema.describe_user_scram_credentials.v0.request import (
    DescribeUserScramCredentialsRequest,
)
from kio.schema.elect_leaders.v2.request import ElectLeadersRequest, TopicPartitions
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.incremental_alter_configs.v1.request import (
    AlterableConfig,
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.leave_group.v5.request import LeaveGroupRequest, MemberIdentity
from kio.schema.list_offsets.v8.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.list_partition_reassignments.v0.request import (
    ListPartitionReassignmentsRequest,
)
from kio.schema.offset_commit.v8.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.schema.sync_group.v5.request import SyncGroupRequest
from straitmq.cli.local_cluster import free_port
from straitmq.metadata.image import MetadataImage
from test_security_tls_sasl import Raw
from waiting import wait_for

from straitmq.security.acls import (
    ALL,
    ALLOW,
    ALTER_CONFIGS,
    CLUSTER,
    DENY,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    LITERAL,
    OP_ANY,
    P_ANY,
    P_MATCH,
    PERM_ANY,
    PREFIXED,
    R_ANY,
    READ,
    TOPIC,
    WRITE,
    AclFilter,
    Authorizer,
    AuthorizerSettings,
    validate_binding,
)
from straitmq.security.acls import (
    AclBinding as Binding,
)

pytestmark = pytest.mark.timeout(300)

TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, INVALID_REQUEST = 29, 30, 31, 42
NAMES = tuple("admin alice bob carol dave erin frank gina hank ivan judy kim".split())
USERS = {name: f"{name}-pw" for name in NAMES}
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    + " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    + ";"
)


DESCRIBE_ALL = DescribeAclsRequest(
    resource_type_filter=1,
    resource_name_filter=None,
    pattern_type_filter=1,
    principal_filter=None,
    host_filter=None,
    operation=1,
    permission_type=1,
)


# -- the authorizer's rules, on the classes ----------------------------------------------


def _authorizer(*bindings: Binding, allow_if_no_acl: bool = False, supers: str = "") -> tuple:
    image = MetadataImage()
    for b in bindings:
        image.apply({"type": "acl", "binding": list(b)})
    a = Authorizer(
        AuthorizerSettings.from_properties(
            {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": supers,
                "allow.everyone.if.no.acl.found": str(allow_if_no_acl).lower(),
            }
        ),
        lambda: image,
    )
    return a, image


def _b(
    name: str,
    op: int,
    perm: int = ALLOW,
    principal: str = "User:alice",
    pattern: int = LITERAL,
    host: str = "*",
    rtype: int = TOPIC,
) -> Binding:
    return Binding(rtype, name, pattern, principal, host, op, perm)


def test_rules_of_the_standard_authorizer() -> None:
    a, _image = _authorizer(
        _b("orders", READ),
        _b("pay-", WRITE, pattern=PREFIXED),
        _b("*", ALL, principal="User:bob"),
        _b("secret", WRITE, DENY, principal="User:bob"),
        _b("hosted", READ, host="10.1.2.3"),
        _b("public", DESCRIBE, principal="User:*"),
        _b("cfg", ALTER_CONFIGS),
        supers="User:root;User:CN=ops,O=Acme",
    )
    ok = lambda p, op, name, host="127.0.0.1", rt=TOPIC: a.authorize(p, host, op, rt, name)  # noqa: E731
    assert ok("User:alice", READ, "orders")
    assert ok("User:alice", DESCRIBE, "orders"), "READ implies DESCRIBE"
    assert not ok("User:alice", WRITE, "orders")
    assert ok("User:alice", WRITE, "pay-eu") and not ok("User:alice", WRITE, "pay")
    assert ok("User:bob", WRITE, "anything") and not ok("User:bob", WRITE, "secret")
    assert ok("User:bob", READ, "secret"), "the DENY is for WRITE only"
    assert not ok("User:alice", READ, "hosted") and ok("User:alice", READ, "hosted", "10.1.2.3")
    assert ok("User:zed", DESCRIBE, "public") and not ok("User:zed", READ, "public")
    assert ok("User:alice", DESCRIBE_CONFIGS, "cfg") and not ok("User:alice", DESCRIBE, "cfg")
    assert ok("User:root", ALL, "x") and ok("User:CN=ops,O=Acme", WRITE, "x", rt=CLUSTER)
    assert not ok("User:alice", READ, "orders", rt=GROUP)
    # No binding applies to `lonely`: denied, unless allow.everyone.if.no.acl.found.
    assert not ok("User:alice", READ, "lonely")
    b, _ = _authorizer(_b("orders", READ), allow_if_no_acl=True)
    assert b.authorize("User:x", "h", READ, TOPIC, "lonely")
    assert not b.authorize("User:x", "h", READ, TOPIC, "orders"), "a binding exists there"


def test_decisions_are_cached_until_the_bindings_change() -> None:
    a, image = _authorizer(_b("orders", READ))
    assert a.authorize("User:alice", "h", READ, TOPIC, "orders")
    assert len(a._cache) == 1
    assert a.authorize("User:alice", "h", READ, TOPIC, "orders")
    assert len(a._cache) == 1
    image.apply({"type": "acl", "binding": list(_b("orders", READ, DENY))})
    assert not a.authorize("User:alice", "h", READ, TOPIC, "orders")
    image.apply({"type": "remove_acl", "binding": list(_b("orders", READ, DENY))})
    assert a.authorize("User:alice", "h", READ, TOPIC, "orders")
    off = Authorizer(AuthorizerSettings(), lambda: image)
    assert off.authorize("User:nobody", "h", WRITE, CLUSTER, "kafka-cluster")


def test_bad_bindings_are_refused_with_a_reason() -> None:
    good = _b("t", READ)
    assert validate_binding(good) is None
    assert "resourceType" in validate_binding(good._replace(resource_type=R_ANY))
    assert "patternType" in validate_binding(good._replace(pattern_type=P_MATCH))
    assert "operation" in validate_binding(good._replace(operation=OP_ANY))
    assert "permissionType" in validate_binding(good._replace(permission=PERM_ANY))
    assert "empty" in validate_binding(good._replace(resource_name=""))
    assert "kafka-cluster" in validate_binding(good._replace(resource_type=CLUSTER))
    assert "principal" in validate_binding(good._replace(principal="alice"))


def test_filters_match_as_kafka() -> None:
    lit, pre, star = _b("pay-eu", READ), _b("pay-", WRITE, pattern=PREFIXED), _b("*", READ)
    match = AclFilter(TOPIC, "pay-eu", P_MATCH, None, None, OP_ANY, PERM_ANY)
    assert all(match.matches(b) for b in (lit, pre, star))
    exact = AclFilter(TOPIC, "pay-", PREFIXED, None, None, OP_ANY, PERM_ANY)
    assert exact.matches(pre) and not exact.matches(lit)
    anything = AclFilter(R_ANY, None, P_ANY, "User:alice", None, WRITE, PERM_ANY)
    assert anything.matches(pre) and not anything.matches(lit)


def test_acl_records_are_in_snapshots() -> None:
    image = MetadataImage()
    b = list(_b("orders", READ))
    image.apply({"type": "acl", "binding": b})
    image.apply({"type": "acl", "binding": list(_b("x", WRITE))})
    image.apply({"type": "remove_acl", "binding": list(_b("x", WRITE))})
    import orjson

    loaded = MetadataImage.from_dict(orjson.loads(image.encoded()))
    assert list(loaded.acls) == [tuple(b)]
    assert list(image.copy().acls) == [tuple(b)]


# -- one broker with the authorizer on ---------------------------------------------------


class Secured:
    def __init__(self, broker: BrokerProcess, sasl_port: int) -> None:
        self.broker, self.sasl_port = broker, sasl_port
        self._admins: dict[str, AdminClient] = {}

    def conf(self, user: str, **extra: Any) -> dict:
        c = {
            "bootstrap.servers": f"127.0.0.1:{self.sasl_port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": USERS[user],
        }
        c.update({k.replace("_", "."): v for k, v in extra.items()})
        return c

    def admin(self, user: str = "admin") -> AdminClient:
        # Held: a collected AdminClient cancels its requests.
        if user not in self._admins:
            self._admins[user] = AdminClient(self.conf(user))
        return self._admins[user]

    def raw_as(self, user: str) -> Raw:
        raw = Raw(self.sasl_port)
        assert raw.handshake("PLAIN").error_code == 0
        assert raw.authenticate(f"\0{user}\0{USERS[user]}".encode()).error_code == 0
        return raw

    def allow(self, *bindings: AclBinding) -> None:
        for f in self.admin().create_acls(list(bindings)).values():
            f.result(timeout=30)

    def topic(self, name: str, partitions: int = 1) -> str:
        fs = self.admin().create_topics([NewTopic(name, partitions, 1)])
        fs[name].result(timeout=30)
        return name


def acl(
    name: str,
    op: AclOperation,
    user: str = "alice",
    *,
    rtype: ResourceType = ResourceType.TOPIC,
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    perm: AclPermissionType = AclPermissionType.ALLOW,
    host: str = "*",
) -> AclBinding:
    principal = user if ":" in user else f"User:{user}"
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("acls")
    port, sasl_port = free_port(), free_port()
    props = [
        f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
        "sasl.enabled.mechanisms=PLAIN",
        f"plain.sasl.jaas.config={JAAS}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:admin",
    ]
    (d / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        d / "data", port=port, extra_args=["--properties", str(d / "server.properties")]
    )
    b.start()
    yield Secured(b, sasl_port)
    b.stop()


def fetch_codes(raw: Raw, topic: str, replica: int = -1) -> list[int]:
    """The partition error codes of one Fetch (v12) of partition 0 from offset 0."""
    answer = raw.call(
        FetchRequest(
            cluster_id=None,
            replica_id=replica,
            max_wait=timedelta(0),
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=0,
            session_id=0,
            session_epoch=-1,
            rack_id="",
            forgotten_topics_data=(),
            topics=(
                FetchTopic(
                    topic=topic,
                    partitions=(
                        FetchPartition(
                            partition=0,
                            current_leader_epoch=-1,
                            fetch_offset=0,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1 << 20,
                        ),
                    ),
                ),
            ),
        )
    )
    assert answer is not None
    return [p.error_code for r in answer.responses for p in r.partitions]


def produce_error(conf: dict, topic: str, **extra: Any) -> KafkaError | None:
    """The delivery error of one record (None: delivered)."""
    outcome: list[Any] = []
    p = Producer({**conf, "message.timeout.ms": 15000, **extra})
    p.produce(topic, value=b"v", on_delivery=lambda err, msg: outcome.append(err))
    p.flush(30)
    assert outcome, "no delivery report"
    return outcome[0]


def consume_one(conf: dict, topic: str, group: str) -> KafkaError | bytes:
    """The first record or the first error the consumer is told about."""
    c = Consumer(
        {**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    c.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                return m.error()
            return m.value()
        raise AssertionError("neither a record nor an error in 30 s")
    finally:
        c.close()


def test_produce_needs_write_and_fetch_needs_read(secured: Secured) -> None:
    t = secured.topic("acl-orders")
    err = produce_error(secured.conf("alice"), t)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    secured.allow(acl(t, AclOperation.WRITE))
    assert produce_error(secured.conf("alice"), t) is None
    # WRITE implies DESCRIBE, not READ: her Fetch is refused on the wire.
    raw = secured.raw_as("alice")
    assert fetch_codes(raw, t) == [TOPIC_AUTH]
    # READ on the topic without READ on the group: the group refuses.
    secured.allow(acl(t, AclOperation.READ))
    assert fetch_codes(raw, t) == [0], "the cached decision went with the binding change"
    raw.close()
    got = consume_one(secured.conf("alice"), t, "acl-g1")
    assert isinstance(got, KafkaError) and got.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, got
    secured.allow(acl("acl-g1", AclOperation.READ, rtype=ResourceType.GROUP))
    assert consume_one(secured.conf("alice"), t, "acl-g1") == b"v"
    # bob has nothing: his consumer is refused on the topic.
    secured.allow(acl("acl-g2", AclOperation.READ, "bob", rtype=ResourceType.GROUP))
    got = consume_one(secured.conf("bob"), t, "acl-g2")
    assert isinstance(got, KafkaError) and got.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, got


def test_prefixed_literal_deny_host_and_wildcard_principal(secured: Secured) -> None:
    for name in ("pay-eu", "pay-us", "payroll", "acl-secret", "acl-open", "acl-hosted", "acl-pub"):
        secured.topic(name)
    secured.allow(
        acl("pay-", AclOperation.WRITE, "carol", pattern=ResourcePatternType.PREFIXED),
        acl("*", AclOperation.ALL, "dave"),
        acl("acl-secret", AclOperation.WRITE, "dave", perm=AclPermissionType.DENY),
        acl("acl-hosted", AclOperation.WRITE, "erin", host="10.9.9.9"),
        acl("acl-pub", AclOperation.WRITE, "User:*"),
    )
    carol, dave, erin = (secured.conf(u) for u in ("carol", "dave", "erin"))
    assert produce_error(carol, "pay-eu") is None and produce_error(carol, "pay-us") is None
    assert produce_error(carol, "payroll").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(dave, "acl-open") is None, "ALLOW ALL on *"
    assert produce_error(dave, "acl-secret").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(erin, "acl-hosted").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    secured.allow(acl("acl-hosted", AclOperation.WRITE, "erin", host="127.0.0.1"))
    assert produce_error(erin, "acl-hosted") is None
    assert produce_error(secured.conf("frank"), "acl-pub") is None, "User:* names everyone"
    assert produce_error(secured.conf("admin"), "acl-secret") is None, "the super user"


def test_metadata_shows_only_what_the_principal_may_describe(secured: Secured) -> None:
    secured.topic("acl-seen")
    secured.topic("acl-hidden")
    secured.allow(acl("acl-seen", AclOperation.DESCRIBE, "frank"))
    topics = AdminClient(secured.conf("frank")).list_topics(timeout=20).topics
    assert "acl-seen" in topics and "acl-hidden" not in topics
    assert "acl-hidden" in secured.admin().list_topics(timeout=20).topics
    # Auto-creation needs CREATE: a producer to a new topic is refused, not served.
    err = produce_error(secured.conf("frank"), "acl-auto-new")
    assert err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    assert "acl-auto-new" not in secured.admin().list_topics(timeout=20).topics


def test_authorized_operations_are_the_principals_own(secured: Secured) -> None:
    """Describe* with include_authorized_operations answers what this principal may do
    (implied operations included); the super user gets all a resource supports."""
    from confluent_kafka import TopicCollection

    t = secured.topic("acl-ops")
    secured.allow(
        acl(t, AclOperation.READ, "judy"),
        acl(t, AclOperation.ALTER_CONFIGS, "judy"),
        acl("kafka-cluster", AclOperation.DESCRIBE, "judy", rtype=ResourceType.BROKER),
        acl("acl-ops-g", AclOperation.READ, "judy", rtype=ResourceType.GROUP),
    )
    judy = AdminClient(secured.conf("judy"))

    def topic_ops(admin: AdminClient) -> set:
        got = admin.describe_topics(TopicCollection([t]), include_authorized_operations=True)
        return set(got[t].result(timeout=30).authorized_operations)

    op = AclOperation
    assert topic_ops(judy) == {op.READ, op.DESCRIBE, op.ALTER_CONFIGS, op.DESCRIBE_CONFIGS}
    everything = {
        op.READ,
        op.WRITE,
        op.CREATE,
        op.DESCRIBE,
        op.DELETE,
        op.ALTER,
        op.DESCRIBE_CONFIGS,
        op.ALTER_CONFIGS,
    }
    assert topic_ops(secured.admin()) == everything
    cluster = judy.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert set(cluster.authorized_operations) == {op.DESCRIBE}
    group = judy.describe_consumer_groups(["acl-ops-g"], include_authorized_operations=True)
    described = group["acl-ops-g"].result(timeout=30)
    assert set(described.authorized_operations) == {op.READ, op.DESCRIBE}


def test_topic_admin_apis(secured: Secured) -> None:
    bob = secured.admin("bob")
    fs = bob.create_topics([NewTopic("bob-t1", 1, 1)])
    with pytest.raises(KafkaException) as e:
        fs["bob-t1"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    secured.allow(acl("bob-", AclOperation.CREATE, "bob", pattern=ResourcePatternType.PREFIXED))
    bob.create_topics([NewTopic("bob-t1", 1, 1)])["bob-t1"].result(timeout=30)
    with pytest.raises(KafkaException) as e:
        bob.create_partitions([NewPartitions("bob-t1", 2)])["bob-t1"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    res = ConfigResource(ConfigResource.Type.TOPIC, "bob-t1")
    with pytest.raises(KafkaException) as e:
        bob.describe_configs([res])[res].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as e:
        bob.delete_topics(["bob-t1"])["bob-t1"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    secured.allow(
        acl("bob-", AclOperation.ALTER, "bob", pattern=ResourcePatternType.PREFIXED),
        acl("bob-", AclOperation.ALTER_CONFIGS, "bob", pattern=ResourcePatternType.PREFIXED),
        acl("bob-t1", AclOperation.DELETE, "bob"),
    )
    bob.create_partitions([NewPartitions("bob-t1", 2)])["bob-t1"].result(timeout=30)
    configs = bob.describe_configs([res])[res].result(timeout=30)  # ALTER_CONFIGS implies it
    assert "retention.ms" in configs
    bob.delete_topics(["bob-t1"])["bob-t1"].result(timeout=30)


def test_cluster_apis_need_the_cluster_permission(secured: Secured) -> None:
    bob = secured.admin("bob")
    with pytest.raises(KafkaException) as e:
        for f in bob.create_acls([acl("x", AclOperation.READ, "bob")]).values():
            f.result(timeout=30)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    flt = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    # librdkafka shows a refused DescribeAcls as an empty list: asked on the wire.
    assert secured.raw_as("bob").call(DESCRIBE_ALL).error_code == CLUSTER_AUTH
    broker_res = ConfigResource(ConfigResource.Type.BROKER, "1")
    with pytest.raises(KafkaException) as e:
        bob.describe_configs([broker_res])[broker_res].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # On the wire: librdkafka 2.x crashes on a refused DescribeUserScramCredentials.
    scram = DescribeUserScramCredentialsRequest(users=None)
    assert secured.raw_as("bob").call(scram).error_code == CLUSTER_AUTH
    secured.allow(acl("kafka-cluster", AclOperation.DESCRIBE, "bob", rtype=ResourceType.BROKER))
    assert secured.raw_as("bob").call(DESCRIBE_ALL).error_code == 0
    assert bob.describe_acls(flt).result(timeout=30), "bob sees the bindings"
    assert secured.raw_as("bob").call(scram).error_code == 0


def test_idempotent_producer_needs_idempotent_write_or_write_on_a_topic(secured: Secured) -> None:
    t = secured.topic("acl-idem")
    secured.allow(acl(t, AclOperation.WRITE, "alice"))
    assert produce_error(secured.conf("alice"), t, **{"enable.idempotence": True}) is None
    init = InitProducerIdRequest(
        transactional_id=None, transaction_timeout=timedelta(0), producer_id=-1, producer_epoch=-1
    )
    assert secured.raw_as("alice").call(init).error_code == 0
    # gina may WRITE no topic (a DENY on all of them beats the User:* ALLOW on acl-pub).
    secured.allow(acl("*", AclOperation.WRITE, "gina", perm=AclPermissionType.DENY))
    assert secured.raw_as("gina").call(init).error_code == CLUSTER_AUTH
    secured.allow(
        acl("kafka-cluster", AclOperation.IDEMPOTENT_WRITE, "gina", rtype=ResourceType.BROKER)
    )
    assert secured.raw_as("gina").call(init).error_code == 0


def test_transactional_ids_need_write_and_describe(secured: Secured) -> None:
    """TRANSACTIONAL_ID: DESCRIBE to find its coordinator, WRITE to use it (with WRITE on
    the topics the transaction writes to), as Kafka checks them."""
    # The coordinator writes its markers over the inter-broker listener, PLAINTEXT here:
    # as in Kafka, that principal needs CLUSTER_ACTION.
    markers = acl(
        "kafka-cluster", AclOperation.CLUSTER_ACTION, "ANONYMOUS", rtype=ResourceType.BROKER
    )
    secured.allow(markers)
    try:
        _transactions_as_kim(secured)
    finally:  # the other tests expect ANONYMOUS to have nothing
        flt = AclBindingFilter(
            markers.restype,
            markers.name,
            markers.resource_pattern_type,
            markers.principal,
            markers.host,
            markers.operation,
            markers.permission_type,
        )
        for f in secured.admin().delete_acls([flt]).values():
            f.result(timeout=30)


def _transactions_as_kim(secured: Secured) -> None:
    TXN_AUTH = 53
    t = secured.topic("acl-txn")
    secured.allow(
        acl(t, AclOperation.WRITE, "kim"),
        acl(t, AclOperation.READ, "kim"),
        acl("kim-g", AclOperation.READ, "kim", rtype=ResourceType.GROUP),
    )
    kim = secured.conf("kim")
    raw = secured.raw_as("kim")
    find = FindCoordinatorRequest(key_type=1, coordinator_keys=("kim-tx",))
    assert [c.error_code for c in raw.call(find).coordinators] == [TXN_AUTH]
    init = InitProducerIdRequest(
        transactional_id="kim-tx",
        transaction_timeout=timedelta(seconds=30),
        producer_id=-1,
        producer_epoch=-1,
    )
    secured.allow(acl("kim-tx", AclOperation.DESCRIBE, "kim", rtype=ResourceType.TRANSACTIONAL_ID))
    assert [c.error_code for c in raw.call(find).coordinators] == [0]
    assert raw.call(init).error_code == TXN_AUTH
    secured.allow(acl("kim-tx", AclOperation.WRITE, "kim", rtype=ResourceType.TRANSACTIONAL_ID))
    p = Producer({**kim, "transactional.id": "kim-tx"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(t, value=b"in a transaction")
    p.commit_transaction(30)
    # A topic kim may not write cannot join the transaction: nothing is half-committed.
    other = secured.topic("acl-txn-other")
    p.begin_transaction()
    p.produce(other, value=b"refused")
    with pytest.raises(KafkaException) as e:
        p.commit_transaction(30)
    assert (
        e.value.args[0].code()
        in (
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError._STATE,
        )
        or e.value.args[0].txn_requires_abort()
    )
    p.abort_transaction(30)
    got = consume_one({**kim, "isolation.level": "read_committed"}, t, "kim-g")
    assert got == b"in a transaction"


def test_group_apis(secured: Secured) -> None:
    t = secured.topic("acl-grp-t")
    assert produce_error(secured.conf("admin"), t) is None
    secured.allow(
        acl(t, AclOperation.READ, "carol"),
        acl(
            "cg-",
            AclOperation.READ,
            "carol",
            rtype=ResourceType.GROUP,
            pattern=ResourcePatternType.PREFIXED,
        ),
    )
    carol = secured.conf("carol")
    assert consume_one(carol, t, "cg-1") == b"v"
    c = Consumer({**carol, "group.id": "cg-1", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(t, 0, 1)], asynchronous=False)
    assert c.committed([TopicPartition(t, 0)], timeout=20)[0].offset == 1
    c.close()
    # A group carol may not READ/DESCRIBE: librdkafka keeps waiting for its coordinator,
    # so the answers are checked on the wire.
    raw = secured.raw_as("carol")
    found = raw.call(FindCoordinatorRequest(key_type=0, coordinator_keys=("other", "cg-1")))
    assert [c.error_code for c in found.coordinators] == [GROUP_AUTH, 0]

    def commit(group: str, topic: str) -> list[int]:
        answer = raw.call(
            OffsetCommitRequest(
                group_id=group,
                generation_id_or_member_epoch=-1,
                member_id="",
                group_instance_id=None,
                topics=(
                    OffsetCommitRequestTopic(
                        name=topic,
                        partitions=(
                            OffsetCommitRequestPartition(
                                partition_index=0,
                                committed_offset=1,
                                committed_leader_epoch=-1,
                                committed_metadata=None,
                            ),
                        ),
                    ),
                ),
            )
        )
        return [p.error_code for r in answer.topics for p in r.partitions]

    assert commit("other", t) == [GROUP_AUTH]
    # DESCRIBE on a group is not READ: finding and describing it works, joining,
    # syncing, heartbeats and leaving do not.
    secured.allow(acl("desc-only", AclOperation.DESCRIBE, "carol", rtype=ResourceType.GROUP))
    found = raw.call(FindCoordinatorRequest(key_type=0, coordinator_keys=("desc-only",)))
    assert [c.error_code for c in found.coordinators] == [0]
    described = raw.call(
        DescribeGroupsRequest(groups=("desc-only", "other"), include_authorized_operations=False)
    )
    assert [g.error_code for g in described.groups] == [0, GROUP_AUTH]
    joined = raw.call(
        JoinGroupRequest(
            group_id="desc-only",
            session_timeout=timedelta(seconds=10),
            rebalance_timeout=timedelta(seconds=10),
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b""),),
            reason=None,
        )
    )
    assert joined.error_code == GROUP_AUTH
    beat = raw.call(
        HeartbeatRequest(
            group_id="desc-only", generation_id=1, member_id="m", group_instance_id=None
        )
    )
    assert beat.error_code == GROUP_AUTH
    synced = raw.call(
        SyncGroupRequest(
            group_id="desc-only",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=(),
        )
    )
    assert synced.error_code == GROUP_AUTH
    left = raw.call(
        LeaveGroupRequest(
            group_id="desc-only",
            members=(MemberIdentity(member_id="m", group_instance_id=None, reason=None),),
        )
    )
    assert [m.error_code for m in left.members] == [GROUP_AUTH]
    secured.topic("acl-grp-unread")
    assert commit("cg-1", "acl-grp-unread") == [TOPIC_AUTH]
    assert commit("cg-1", t) == [0]
    raw.close()
    admin_c = secured.admin("carol")
    groups = admin_c.list_consumer_groups().result(timeout=30)
    assert {g.group_id for g in groups.valid} == {"cg-1"}
    assert "cg-1" in {
        g.group_id for g in secured.admin().list_consumer_groups().result(timeout=30).valid
    }
    fs = admin_c.delete_consumer_groups(["cg-1"])
    with pytest.raises(KafkaException) as e:
        fs["cg-1"].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_replica_fetch_without_cluster_action_is_refused(secured: Secured) -> None:
    """The PLAINTEXT listener's principal is User:ANONYMOUS: a fetch as replica 2 is
    refused partition by partition, as Kafka answers a fetcher without CLUSTER_ACTION."""
    t = secured.topic("acl-repl")
    assert produce_error(secured.conf("admin"), t) is None
    raw = Raw(secured.broker.port)
    assert fetch_codes(raw, t, replica=2) == [TOPIC_AUTH]
    epochs = raw.call(
        OffsetForLeaderEpochRequest(
            replica_id=2,
            topics=(
                OffsetForLeaderTopic(
                    topic=t,
                    partitions=(
                        OffsetForLeaderPartition(
                            partition=0, current_leader_epoch=-1, leader_epoch=0
                        ),
                    ),
                ),
            ),
        )
    )
    assert [p.error_code for r in epochs.topics for p in r.partitions] == [TOPIC_AUTH]
    raw.close()


def test_every_other_api_on_the_wire(secured: Secured) -> None:
    """hank starts with nothing: each API answers Kafka's authorization error; after the
    bindings it needs, the same request is served."""
    t = secured.topic("wire-t")
    assert produce_error(secured.conf("admin"), t) is None
    zero = timedelta(seconds=5)
    requests: dict[str, Any] = {
        "list_offsets": ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=(
                ListOffsetsTopic(
                    name=t,
                    partitions=(
                        ListOffsetsPartition(
                            partition_index=0, current_leader_epoch=-1, timestamp=-1
                        ),
                    ),
                ),
            ),
        ),
        "delete_records": DeleteRecordsRequest(
            timeout=zero,
            topics=(
                DeleteRecordsTopic(
                    name=t, partitions=(DeleteRecordsPartition(partition_index=0, offset=0),)
                ),
            ),
        ),
        "describe_topic": DescribeTopicPartitionsRequest(
            topics=(TopicRequest(name=t),), response_partition_limit=100, cursor=None
        ),
        "alter_topic_config": IncrementalAlterConfigsRequest(
            validate_only=True,
            resources=(
                AlterConfigsResource(
                    resource_type=2,
                    resource_name=t,
                    configs=(
                        AlterableConfig(name="retention.ms", config_operation=0, value="60000"),
                    ),
                ),
            ),
        ),
        "alter_broker_config": IncrementalAlterConfigsRequest(
            validate_only=True,
            resources=(AlterConfigsResource(resource_type=4, resource_name="1", configs=()),),
        ),
        "elect": ElectLeadersRequest(
            election_type=0,
            timeout=zero,
            topic_partitions=(TopicPartitions(topic=t, partitions=(0,)),),
        ),
        "log_dirs": DescribeLogDirsRequest(topics=None),
        "reassign": AlterPartitionReassignmentsRequest(
            timeout=zero,
            topics=(
                ReassignableTopic(
                    name=t, partitions=(ReassignablePartition(partition_index=0, replicas=None),)
                ),
            ),
        ),
        "list_reassign": ListPartitionReassignmentsRequest(timeout=zero, topics=None),
        "quorum": DescribeQuorumRequest(
            topics=(
                TopicData(
                    topic_name="__cluster_metadata", partitions=(PartitionData(partition_index=0),)
                ),
            )
        ),
        "offset_fetch": OffsetFetchRequest(
            group_id="hank-g",
            require_stable=False,
            topics=(OffsetFetchRequestTopic(name=t, partition_indexes=(0,)),),
        ),
    }

    def codes(answer: Any, name: str) -> list[int]:
        if name in ("list_offsets", "delete_records"):
            return [p.error_code for r in answer.topics for p in r.partitions]
        if name == "describe_topic":
            return [r.error_code for r in answer.topics]
        if name.startswith("alter_") and name.endswith("config"):
            return [r.error_code for r in answer.responses]
        if name == "offset_fetch":
            return [answer.error_code]
        return [answer.error_code]

    def asked(user: str) -> dict[str, list[int]]:
        raw = secured.raw_as(user)
        try:
            return {name: codes(raw.call(req), name) for name, req in requests.items()}
        finally:
            raw.close()

    before = asked("hank")
    assert before == {
        "list_offsets": [TOPIC_AUTH],
        "delete_records": [TOPIC_AUTH],
        "describe_topic": [TOPIC_AUTH],
        "alter_topic_config": [TOPIC_AUTH],
        "alter_broker_config": [CLUSTER_AUTH],
        "elect": [CLUSTER_AUTH],
        "log_dirs": [CLUSTER_AUTH],
        "reassign": [CLUSTER_AUTH],
        "list_reassign": [CLUSTER_AUTH],
        "quorum": [CLUSTER_AUTH],
        "offset_fetch": [GROUP_AUTH],
    }, before
    cluster = {"rtype": ResourceType.BROKER}
    secured.allow(
        acl(t, AclOperation.DELETE, "hank"),  # implies DESCRIBE
        acl(t, AclOperation.ALTER_CONFIGS, "hank"),
        acl("kafka-cluster", AclOperation.ALTER, "hank", **cluster),
        acl("kafka-cluster", AclOperation.DESCRIBE, "hank", **cluster),
        acl("kafka-cluster", AclOperation.ALTER_CONFIGS, "hank", **cluster),
        acl("hank-g", AclOperation.READ, "hank", rtype=ResourceType.GROUP),
    )
    after = asked("hank")
    assert not {c for cs in after.values() for c in cs} & {TOPIC_AUTH, CLUSTER_AUTH, GROUP_AUTH}
    assert after["list_offsets"] == [0] and after["delete_records"] == [0], after
    assert after["describe_topic"] == [0] and after["alter_topic_config"] == [0], after
    assert after["log_dirs"] == [0] and after["list_reassign"] == [0], after
    assert after["offset_fetch"] == [0], after
    assert asked("admin") == after, "the super user is served the same"


def test_bad_bindings_get_invalid_request(secured: Secured) -> None:
    """Each bad binding is its own INVALID_REQUEST with a reason; the good one in the same
    request is created, and the broker goes on serving."""

    def creation(
        rtype: int = 2,
        name: str = "t",
        pattern: int = 3,
        principal: str = "User:x",
        host: str = "*",
        op: int = 3,
        perm: int = 3,
    ) -> AclCreation:
        return AclCreation(
            resource_type=rtype,
            resource_name=name,
            resource_pattern_type=pattern,
            principal=principal,
            host=host,
            operation=op,
            permission_type=perm,
        )

    bad = [
        creation(rtype=1),
        creation(rtype=0),
        creation(pattern=1),
        creation(pattern=2),
        creation(op=1),
        creation(op=0),
        creation(op=99),
        creation(perm=1),
        creation(name=""),
        creation(rtype=4, name="not-the-cluster"),
        creation(principal="nocolon"),
        creation(rtype=99),
    ]
    good = creation(name="acl-bad-neighbour")
    answer = secured.raw_as("admin").call(CreateAclsRequest(creations=(*bad, good)))
    codes = [r.error_code for r in answer.results]
    assert codes == [INVALID_REQUEST] * len(bad) + [0], codes
    assert all(r.error_message for r in answer.results[:-1])
    assert any(n == "acl-bad-neighbour" for _, n, _, _, _ in _listed(secured))
    # Through librdkafka too.
    fs = secured.admin().create_acls(
        [acl("not-the-cluster", AclOperation.ALTER, rtype=ResourceType.BROKER)]
    )
    for f in fs.values():
        with pytest.raises(KafkaException) as e:
            f.result(timeout=30)
        assert e.value.args[0].code() == KafkaError.INVALID_REQUEST


def _listed(secured: Secured, **kw: Any) -> set[tuple]:
    flt = AclBindingFilter(
        kw.get("rtype", ResourceType.ANY),
        kw.get("name"),
        kw.get("pattern", ResourcePatternType.ANY),
        kw.get("principal"),
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return {
        (b.restype, b.name, b.resource_pattern_type, b.principal, b.operation)
        for b in secured.admin().describe_acls(flt).result(timeout=30)
    }


def test_describe_and_delete_with_match_and_any_filters(secured: Secured) -> None:
    secured.allow(
        acl("mx-", AclOperation.READ, "mallory", pattern=ResourcePatternType.PREFIXED),
        acl("mx-1", AclOperation.WRITE, "mallory"),
        acl("other", AclOperation.WRITE, "mallory"),
    )
    matched = _listed(
        secured, rtype=ResourceType.TOPIC, name="mx-1", pattern=ResourcePatternType.MATCH
    )
    assert {(n, o) for _, n, _, p, o in matched if p == "User:mallory"} == {
        ("mx-", AclOperation.READ),
        ("mx-1", AclOperation.WRITE),
    }
    flt = AclBindingFilter(
        ResourceType.TOPIC,
        "mx-1",
        ResourcePatternType.MATCH,
        "User:mallory",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    deleted = secured.admin().delete_acls([flt])[flt].result(timeout=30)
    assert {b.name for b in deleted} == {"mx-", "mx-1"}
    left = _listed(secured, principal="User:mallory")
    assert {n for _, n, _, _, _ in left} == {"other"}


# -- kafka-acls (Kafka 4.4) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def jars() -> None:
    from bench.javatools import ensure_jars

    ensure_jars()


def test_kafka_acls_cli_adds_lists_and_removes(
    secured: Secured, jars: None, tmp_path: Path
) -> None:
    from bench.javatools import KAFKA44_TOOLS, java_cmd

    config = tmp_path / "admin.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="admin-pw";\n'
    )

    def acls(*args: str) -> str:
        r = subprocess.run(
            java_cmd(
                KAFKA44_TOOLS["kafka-acls"],
                [
                    "--bootstrap-server",
                    f"127.0.0.1:{secured.sasl_port}",
                    "--command-config",
                    str(config),
                    *args,
                ],
                jars="4.4",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, f"kafka-acls {args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
        return r.stdout

    t = secured.topic("cli-topic")
    frank = secured.conf("frank")
    assert produce_error(frank, t).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    acls("--add", "--allow-principal", "User:frank", "--producer", "--topic", t)
    acls(
        "--add",
        "--allow-principal",
        "User:frank",
        "--operation",
        "Read",
        "--group",
        "cli-",
        "--resource-pattern-type",
        "prefixed",
    )
    listed = acls("--list", "--topic", t)
    assert "User:frank" in listed and "WRITE" in listed and "CREATE" in listed, listed
    assert produce_error(frank, t) is None
    assert "cli-" in acls("--list", "--principal", "User:frank")
    acls("--remove", "--force", "--allow-principal", "User:frank", "--producer", "--topic", t)
    assert "User:frank" not in acls("--list", "--topic", t)
    assert produce_error(frank, t).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_kafka_python_and_the_java_client_are_refused_then_served(
    secured: Secured, jars: None
) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    from bench.javatools import straitclient

    t = secured.topic("clients-t")
    kp = dict(
        bootstrap_servers=f"127.0.0.1:{secured.sasl_port}",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="ivan",
        sasl_plain_password=USERS["ivan"],
    )
    producer = KafkaProducer(**kp, max_block_ms=15000)
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send(t, b"kp").get(timeout=30)
    producer.close()
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="ivan" password="{USERS["ivan"]}";'
    )
    props = ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", f"sasl.jaas.config={jaas}"]
    extra = [a for p in props for a in ("--prop", p)]
    bootstrap = f"127.0.0.1:{secured.sasl_port}"
    sent = straitclient(
        ["produce", "--bootstrap", bootstrap, "--topic", t, "--count", 5, *extra], timeout=180
    )
    assert sent.returncode != 0
    assert "TopicAuthorizationException" in sent.stdout + sent.stderr, sent.stdout[-2000:]

    secured.allow(acl(t, AclOperation.WRITE, "ivan"), acl(t, AclOperation.READ, "ivan"))
    producer = KafkaProducer(**kp)
    producer.send(t, b"kp").get(timeout=30)
    producer.close()
    sent = straitclient(
        ["produce", "--bootstrap", bootstrap, "--topic", t, "--count", 5, *extra], timeout=180
    )
    assert sent.returncode == 0 and sent.json["acked"] == 5, sent.stderr[-3000:]
    consumer = KafkaConsumer(
        t, group_id="ivan-g", auto_offset_reset="earliest", consumer_timeout_ms=20000, **kp
    )
    with pytest.raises(GroupAuthorizationFailedError):
        next(iter(consumer))
    consumer.close()
    got = straitclient(
        [
            "consume",
            "--bootstrap",
            bootstrap,
            "--topic",
            t,
            "--group",
            "ivan-g",
            "--count",
            6,
            "--timeout-ms",
            20000,
            "--offset-reset",
            "earliest",
            *extra,
        ],
        timeout=180,
    )
    assert got.returncode != 0
    assert "GroupAuthorizationException" in got.stdout + got.stderr, got.stdout[-2000:]
    secured.allow(acl("ivan-g", AclOperation.READ, "ivan", rtype=ResourceType.GROUP))
    got = straitclient(
        [
            "consume",
            "--bootstrap",
            bootstrap,
            "--topic",
            t,
            "--group",
            "ivan-g",
            "--count",
            6,
            "--timeout-ms",
            60000,
            "--offset-reset",
            "earliest",
            *extra,
        ],
        timeout=180,
    )
    assert got.returncode == 0 and len(got.records) == 6, got.stderr[-3000:]


# Last in the module: restarts the broker.
def test_acls_survive_a_restart(secured: Secured) -> None:
    t = secured.topic("acl-durable")
    secured.allow(acl(t, AclOperation.WRITE, "erin"))
    secured.broker.restart()
    wait_for(
        lambda: produce_error(secured.conf("erin"), t) is None,
        60,
        "erin's WRITE binding is back after the restart",
    )
    assert produce_error(secured.conf("bob"), t).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert any(n == t for _, n, _, _, _ in _listed(secured, principal="User:erin"))


# -- a 3+3 cluster -------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    from cluster_support import cluster_factory

    yield from cluster_factory(tmp_path)


def test_bindings_apply_on_every_broker_of_a_cluster(cluster: Any) -> None:
    """A binding created at broker 1 decides at brokers 2 and 3 (it travels in the
    metadata log); replication runs on a PLAINTEXT listener whose User:ANONYMOUS is a
    super user, as Kafka needs for a PLAINTEXT inter-broker listener."""
    from cluster_support import BROKER_ARGS

    from straitmq.admin_client import request_sync

    c = cluster(
        broker_args=[
            *BROKER_ARGS,
            "--listeners",
            "REPLICATION://127.0.0.1:0,CLIENT://127.0.0.1:0",
            "--listener-security-protocol-map",
            "REPLICATION:PLAINTEXT,CLIENT:SASL_PLAINTEXT",
            "--inter-broker-listener-name",
            "REPLICATION",
            "--override",
            "listener.name.client.sasl.enabled.mechanisms=PLAIN",
            "--override",
            f"listener.name.client.plain.sasl.jaas.config={JAAS}",
            "--override",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "--override",
            "super.users=User:admin;User:ANONYMOUS",
        ]
    )
    first = next(iter(c.brokers.values()))
    described = request_sync(f"http://{first.host}:{first.http_port}", "GET", "/api/v1/cluster")
    client = {b["id"]: b["endpoints"]["CLIENT"][1] for b in described["brokers"]}
    assert sorted(client) == [1, 2, 3]

    def conf(user: str, broker: int) -> dict:
        return {
            "bootstrap.servers": f"127.0.0.1:{client[broker]}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": USERS[user],
        }

    admin = AdminClient(conf("admin", 1))
    for name in ("shared", "private"):
        admin.create_topics([NewTopic(name, 3, 3)])[name].result(timeout=30)
    for f in admin.create_acls(
        [
            acl("shared", AclOperation.WRITE),
            acl("shared", AclOperation.READ),
            acl("cl-g", AclOperation.READ, rtype=ResourceType.GROUP),
        ]
    ).values():
        f.result(timeout=30)

    def visible(broker: int) -> set[str] | None:
        try:
            md = AdminClient(conf("alice", broker)).list_topics(timeout=5)
        except KafkaException:
            return None
        return {t for t in md.topics if not t.startswith("__")}

    for broker in (1, 2, 3):
        assert (
            wait_for(
                lambda b=broker: visible(b) == {"shared"} or None,
                30,
                f"broker {broker} applies the bindings",
            )
            is True
        )
    p = Producer({**conf("alice", 3), "acks": "all", "enable.idempotence": True})
    for i in range(90):
        p.produce("shared", value=b"m%d" % i, partition=i % 3)
    assert p.flush(60) == 0
    err = produce_error(conf("alice", 2), "private")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    consumer = Consumer({**conf("alice", 2), "group.id": "cl-g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["shared"])
    got: set[bytes] = set()

    def read() -> bool:
        m = consumer.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            got.add(m.value())
        return len(got) == 90

    wait_for(read, 60, "every record read back by alice", every=0)
    consumer.close()
