"""The metadata image: what the metadata log says the cluster looks like right now.

Every change is a record (a plain dict with a "type") applied by `apply`; brokers and
the controller read the image, never the log. Records arrive in entries of the Raft
metadata log; a snapshot is `to_dict()` of the image at an offset, written as `encoded()`.

Record types:
  cluster           cluster_id
  register_broker   id, incarnation, host, port, http_port, rack (registers fenced),
                    endpoints {listener name: [host, port]} (named listeners)
  fence_broker / unfence_broker / broker_shutdown   id
  topic             name, topic_id, configs, internal
  partition         topic, index, replicas, isr, leader
  partition_change  topic, index and any of leader, isr, replicas, adding, removing
  config            name, changes {key: value | None}
  cluster_config    changes {key: value | None} (e.g. the replication throttle)
  remove_topic      name
  producer_ids      next
  user_scram_credential         name, mechanism, salt, iterations, stored_key, server_key
                                (SCRAM, base64; never the password)
  remove_user_scram_credential  name, mechanism
  acl               binding [resource_type, resource_name, pattern_type, principal, host,
                    operation, permission] (Kafka's codes; straitmq.security.acls)
  remove_acl        binding (the same seven values)
  client_quota      entity [[type, name | null], ...], key, value (null: remove the key)
                    (Kafka's QuotaRecord; straitmq.metadata.quotas)
  feature_level     name, level (Kafka's FeatureLevelRecord; straitmq.metadata.features)

Versions: a record may carry "v" (absent: 1). RECORD_VERSIONS says the newest version of
each type this code reads; a newer one, an unknown type, or a finalized feature level this
code does not support stops the node with a MetadataVersionError that says which, never a
guess. New fields that older releases may ignore (their handlers read named keys only)
keep the version; anything else is a new version, written only once the feature level
that introduced it is finalized. Snapshots keep the same rule: a new top-level key is
ignored by older readers, and is written only when it holds something.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from straitmq.metadata.features import SUPPORTED, finalized
from straitmq.metadata.quotas import EntityKey, entity_key

Record = dict[str, Any]
NO_LEADER = -1


class MetadataVersionError(ValueError):
    """The log holds what this code cannot read or serve (a newer record, a finalized
    feature level beyond its range): the node must stop rather than misread it."""


@dataclass(slots=True)
class BrokerImage:
    id: int
    incarnation: str
    host: str
    port: int
    http_port: int
    rack: str | None = None
    fenced: bool = True
    shutting_down: bool = False
    # Advertised endpoint per listener name; {} for a broker registered before named
    # listeners (its host/port are its PLAINTEXT listener).
    endpoints: dict[str, list] = field(default_factory=dict)

    @property
    def alive(self) -> bool:
        return not self.fenced and not self.shutting_down


@dataclass(slots=True)
class PartitionImage:
    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int = 0
    partition_epoch: int = 0
    # An ongoing reassignment: replicas = target + removing; `removing` leave once every
    # target replica is in the ISR.
    adding: list[int] = field(default_factory=list)
    removing: list[int] = field(default_factory=list)

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER


@dataclass(slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: list[PartitionImage] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False

    @property
    def replication_factor(self) -> int:
        if not self.partitions:
            return 0
        p = self.partitions[0]  # mid-reassignment, replicas also hold the leaving ones
        return len(p.replicas) - len(p.removing)


@dataclass(slots=True)
class MetadataImage:
    cluster_id: str = ""
    brokers: dict[int, BrokerImage] = field(default_factory=dict)
    topics: dict[str, TopicImage] = field(default_factory=dict)
    cluster_configs: dict[str, str] = field(default_factory=dict)
    next_producer_id: int = 0
    offset: int = -1  # Raft offset of the last applied entry
    # user -> mechanism -> {"salt", "iterations", "stored_key", "server_key"} (base64)
    scram_credentials: dict[str, dict[str, dict]] = field(default_factory=dict)
    # ACL bindings as 7-tuples (a dict: ordered, no duplicates, O(1) removal).
    acls: dict[tuple, None] = field(default_factory=dict)
    # A new value whenever `acls` changes, unique across images: authorizers drop their
    # cached decisions when it moves.
    acls_version: int = field(default_factory=lambda: next(_versions), repr=False, compare=False)
    # Client quotas: entity key (sorted (type, name | None) pairs) -> {key: value}.
    client_quotas: dict[EntityKey, dict[str, float]] = field(default_factory=dict)
    # A new value whenever `client_quotas` changes: the brokers' quota lookups are cached
    # against it (a new image, e.g. one loaded from a snapshot, gets one of its own).
    quotas_version: int = field(default_factory=lambda: next(_versions), repr=False, compare=False)
    # Bumped by every record that changes a topic / any broker: what is built from the
    # image (snapshot bytes, Metadata answers) is cached against these.
    topic_versions: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    brokers_version: int = field(default=0, repr=False, compare=False)
    # Bumped when a topic is created or removed: the topic-id index is built against it.
    topic_set_version: int = field(default=0, repr=False, compare=False)
    _names_by_id: tuple[int, dict[uuid.UUID, str]] | None = field(
        default=None, repr=False, compare=False
    )
    # Each topic's snapshot encoding with the topic version it was made at: a snapshot
    # re-encodes only what changed since the last one.
    _encoded: dict[str, tuple[int, bytes]] = field(default_factory=dict, repr=False, compare=False)
    # Feature levels the log finalized ({} for a log made by 0.1.0 and never finalized:
    # `finalized_features` fills in the baseline).
    features: dict[str, int] = field(default_factory=dict)
    # Each broker's supported feature ranges, from its registration ({} from 0.1.0,
    # whose registrations carry none: straitmq.metadata.features.RELEASE_0_1_0).
    broker_features: dict[int, dict[str, list[int]]] = field(default_factory=dict)

    def finalized_features(self) -> dict[str, int]:
        return finalized(self.features)

    def partition(self, topic: str, index: int) -> PartitionImage | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]

    def live_brokers(self) -> list[BrokerImage]:
        return [b for b in self.brokers.values() if b.alive]

    def broker_alive(self, broker_id: int) -> bool:
        b = self.brokers.get(broker_id)
        return b is not None and b.alive

    def broker_incarnation(self, broker_id: int) -> str | None:
        """The broker's current registration (its process), None if unknown (KIP-903)."""
        b = self.brokers.get(broker_id)
        return None if b is None else b.incarnation

    def topic_name(self, topic_id: uuid.UUID | None) -> str | None:
        """The name of the topic with this id (requests that name topics by id), from an
        index rebuilt only when a topic is created or removed."""
        cached = self._names_by_id
        if cached is None or cached[0] != self.topic_set_version:
            by_id = {t.topic_id: name for name, t in self.topics.items()}
            cached = self._names_by_id = (self.topic_set_version, by_id)
        return cached[1].get(topic_id) if topic_id is not None else None

    def partition_health(self) -> tuple[int, int]:
        """(offline, under-replicated) partition counts."""
        offline = under = 0
        for t in self.topics.values():
            for p in t.partitions:
                if p.leader == NO_LEADER:
                    offline += 1
                elif len(p.isr) < len(p.replicas):
                    under += 1
        return offline, under

    def describe_brokers(self) -> list[dict]:
        return [broker_dict(b) for b in sorted(self.brokers.values(), key=lambda b: b.id)]

    def apply_entry(self, offset: int, records: list[Record] | None) -> None:
        for r in records or ():
            self.apply(r)
        self.offset = offset

    def apply(self, record: Record) -> None:
        kind = record["type"]
        handler = _HANDLERS.get(kind)
        if handler is None:
            raise MetadataVersionError(
                f"unknown metadata record type {kind!r}: the log was written by a newer "
                "StraitMQ; run that release or a newer one"
            )
        version = record.get("v", 1)
        if version > RECORD_VERSIONS[kind]:
            raise MetadataVersionError(
                f"metadata record {kind!r} version {version} is newer than this StraitMQ "
                f"reads (1..{RECORD_VERSIONS[kind]}); run the release that wrote it or a "
                "newer one"
            )
        handler(self, record)

    def copy(self) -> MetadataImage:
        """An independent image: applying records to one never changes the other. Lists
        of broker ids are shared, as `apply` replaces them and never edits one in place."""
        return MetadataImage(
            self.cluster_id,
            {i: _copy_broker(b) for i, b in self.brokers.items()},
            {
                name: TopicImage(
                    t.name,
                    t.topic_id,
                    [_copy_partition(p) for p in t.partitions],
                    dict(t.configs),
                    t.internal,
                )
                for name, t in self.topics.items()
            },
            dict(self.cluster_configs),
            self.next_producer_id,
            self.offset,
            {user: dict(creds) for user, creds in self.scram_credentials.items()},
            dict(self.acls),
            client_quotas={e: dict(q) for e, q in self.client_quotas.items()},
            quotas_version=self.quotas_version,
            features=dict(self.features),
            broker_features=dict(self.broker_features),
        )

    # -- snapshots -------------------------------------------------------------------

    def encoded(self) -> bytes:
        """`to_dict()` as JSON, made incrementally: unchanged topics reuse their bytes."""
        old, cache = self._encoded, {}  # rebuilt, so deleted topics drop out
        for name, t in self.topics.items():
            version = self.topic_versions.get(name, 0)
            hit = old.get(name)
            cache[name] = (
                hit
                if hit is not None and hit[0] == version
                else (version, orjson.dumps(_topic_dict(t)))
            )
        self._encoded = cache
        topics = [b for _, b in cache.values()]
        rest = orjson.dumps(
            {
                "cluster_id": self.cluster_id,
                "brokers": [broker_dict(b) for b in self.brokers.values()],
                "cluster_configs": self.cluster_configs,
                "next_producer_id": self.next_producer_id,
                "offset": self.offset,
                "scram_credentials": self.scram_credentials,
                "acls": list(self.acls),
                "client_quotas": _quotas_list(self.client_quotas),
                **self._version_keys(),
            }
        )
        return b'{"topics":[' + b",".join(topics) + b"]," + rest[1:]

    def _version_keys(self) -> dict:
        """Snapshot keys release 0.1.0 does not know (it ignores them), present only when
        they hold something, so an unfinalized cluster's snapshots stay 0.1.0's bytes."""
        keys: dict = {}
        if self.features:
            keys["features"] = dict(self.features)
        if self.broker_features:
            keys["broker_features"] = {str(b): f for b, f in self.broker_features.items()}
        return keys

    def to_dict(self) -> dict:
        # Copies of the config dicts: `apply` edits them in place, and a snapshot must
        # not change after it is taken (the Raft node may keep it to send to followers).
        return {
            "cluster_id": self.cluster_id,
            "brokers": [broker_dict(b) for b in self.brokers.values()],
            "topics": [_topic_dict(t) for t in self.topics.values()],
            "cluster_configs": dict(self.cluster_configs),
            "next_producer_id": self.next_producer_id,
            "offset": self.offset,
            "scram_credentials": {u: dict(c) for u, c in self.scram_credentials.items()},
            "acls": [list(b) for b in self.acls],
            "client_quotas": _quotas_list(self.client_quotas),
            **self._version_keys(),
        }

    @classmethod
    def from_dict(cls, d: dict) -> MetadataImage:
        image = cls(
            cluster_id=d["cluster_id"],
            cluster_configs=dict(d["cluster_configs"]),
            next_producer_id=d["next_producer_id"],
            offset=d["offset"],
            # Snapshots written before SCRAM hold none.
            scram_credentials={u: dict(c) for u, c in d.get("scram_credentials", {}).items()},
            # ... nor ACLs.
            acls={tuple(b): None for b in d.get("acls", ())},
            # ... nor client quotas.
            client_quotas={
                entity_key((t, n) for t, n in entity): dict(values)
                for entity, values in d.get("client_quotas", ())
            },
            # ... nor feature levels (0.1.0's snapshots).
            features={n: int(v) for n, v in d.get("features", {}).items()},
            broker_features={int(b): f for b, f in d.get("broker_features", {}).items()},
        )
        _check_features(image.features)
        for b in d["brokers"]:
            image.brokers[b["id"]] = BrokerImage(**b)
        for t in d["topics"]:
            image.topics[t["name"]] = TopicImage(
                t["name"],
                uuid.UUID(t["topic_id"]),
                [_load_partition(p) for p in t["partitions"]],
                dict(t["configs"]),
                t["internal"],
            )
        return image


def _quotas_list(quotas: dict[EntityKey, dict[str, float]]) -> list:
    return [[[list(p) for p in entity], dict(values)] for entity, values in quotas.items()]


def _copy_broker(b: BrokerImage) -> BrokerImage:
    return BrokerImage(
        b.id,
        b.incarnation,
        b.host,
        b.port,
        b.http_port,
        b.rack,
        b.fenced,
        b.shutting_down,
        b.endpoints,
    )


def _copy_partition(p: PartitionImage) -> PartitionImage:
    return PartitionImage(
        p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch, p.adding, p.removing
    )


def broker_dict(b: BrokerImage) -> dict:
    return {
        "id": b.id,
        "incarnation": b.incarnation,
        "host": b.host,
        "port": b.port,
        "http_port": b.http_port,
        "rack": b.rack,
        "fenced": b.fenced,
        "shutting_down": b.shutting_down,
        "endpoints": b.endpoints,
    }


def _topic_dict(t: TopicImage) -> dict:
    return {
        "name": t.name,
        "topic_id": str(t.topic_id),
        "configs": dict(t.configs),
        "internal": t.internal,
        # Positional, in PartitionImage's field order: a third of the size of named fields.
        "partitions": [
            [p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch, p.adding, p.removing]
            for p in t.partitions
        ],
    }


def _load_partition(p: list | dict) -> PartitionImage:
    # Snapshots written before the positional form hold a dict per partition.
    return PartitionImage(*p) if isinstance(p, list) else PartitionImage(**p)


def _cluster(img: MetadataImage, r: Record) -> None:
    img.cluster_id = r["cluster_id"]


_versions: Iterator[int] = itertools.count(1)


def _topic_changed(img: MetadataImage, name: str) -> None:
    img.topic_versions[name] = next(_versions)


def _register_broker(img: MetadataImage, r: Record) -> None:
    img.brokers_version += 1
    if r.get("features"):
        img.broker_features[r["id"]] = {n: list(v) for n, v in r["features"].items()}
    else:  # a broker of 0.1.0, or registered through a 0.1.0 controller
        img.broker_features.pop(r["id"], None)
    img.brokers[r["id"]] = BrokerImage(
        r["id"],
        r["incarnation"],
        r["host"],
        r["port"],
        r["http_port"],
        r.get("rack"),
        endpoints=dict(r.get("endpoints") or {}),
    )


def _fence(img: MetadataImage, r: Record) -> None:
    img.brokers_version += 1
    img.brokers[r["id"]].fenced = True


def _unfence(img: MetadataImage, r: Record) -> None:
    img.brokers_version += 1
    b = img.brokers[r["id"]]
    b.fenced = False
    b.shutting_down = False


def _shutdown(img: MetadataImage, r: Record) -> None:
    img.brokers_version += 1
    img.brokers[r["id"]].shutting_down = True


def _topic(img: MetadataImage, r: Record) -> None:
    _topic_changed(img, r["name"])
    img.topic_set_version += 1
    img.topics[r["name"]] = TopicImage(
        r["name"],
        uuid.UUID(r["topic_id"]),
        [],
        dict(r.get("configs", {})),
        r.get("internal", False),
    )


def _partition(img: MetadataImage, r: Record) -> None:
    _topic_changed(img, r["topic"])
    parts = img.topics[r["topic"]].partitions
    if r["index"] != len(parts):
        raise ValueError(f"partition record {r['topic']}-{r['index']} out of order")
    parts.append(PartitionImage(list(r["replicas"]), list(r["isr"]), r["leader"]))


def _partition_change(img: MetadataImage, r: Record) -> None:
    _topic_changed(img, r["topic"])
    p = img.topics[r["topic"]].partitions[r["index"]]
    if "leader" in r and r["leader"] != p.leader:
        p.leader = r["leader"]
        # Followers truncate by leader epoch, so every new leader needs a new epoch.
        p.leader_epoch += 1
    for key in ("isr", "replicas", "adding", "removing"):
        if key in r:
            setattr(p, key, list(r[key]))
    p.partition_epoch += 1


def _config(img: MetadataImage, r: Record) -> None:
    _topic_changed(img, r["name"])
    _merge(img.topics[r["name"]].configs, r["changes"])


def _cluster_config(img: MetadataImage, r: Record) -> None:
    _merge(img.cluster_configs, r["changes"])


def _merge(configs: dict[str, str], changes: dict[str, str | None]) -> None:
    for key, value in changes.items():
        if value is None:
            configs.pop(key, None)
        else:
            configs[key] = value


def _remove_topic(img: MetadataImage, r: Record) -> None:
    _topic_changed(img, r["name"])
    img.topic_set_version += 1
    img.topics.pop(r["name"], None)


def _producer_ids(img: MetadataImage, r: Record) -> None:
    img.next_producer_id = r["next"]


def _user_scram_credential(img: MetadataImage, r: Record) -> None:
    img.scram_credentials.setdefault(r["name"], {})[r["mechanism"]] = {
        "salt": r["salt"],
        "iterations": r["iterations"],
        "stored_key": r["stored_key"],
        "server_key": r["server_key"],
    }


def _remove_user_scram_credential(img: MetadataImage, r: Record) -> None:
    creds = img.scram_credentials.get(r["name"])
    if creds is not None:
        creds.pop(r["mechanism"], None)
        if not creds:
            del img.scram_credentials[r["name"]]


def _acl(img: MetadataImage, r: Record) -> None:
    img.acls[tuple(r["binding"])] = None
    img.acls_version = next(_versions)


def _remove_acl(img: MetadataImage, r: Record) -> None:
    img.acls.pop(tuple(r["binding"]), None)
    img.acls_version = next(_versions)


def _client_quota(img: MetadataImage, r: Record) -> None:
    entity = entity_key((t, n) for t, n in r["entity"])
    img.quotas_version = next(_versions)
    if r["value"] is None:
        values = img.client_quotas.get(entity)
        if values is not None:
            values.pop(r["key"], None)
            if not values:
                del img.client_quotas[entity]
    else:
        img.client_quotas.setdefault(entity, {})[r["key"]] = float(r["value"])


def _feature_level(img: MetadataImage, r: Record) -> None:
    levels = {**img.features, r["name"]: int(r["level"])}
    _check_features(levels)
    img.features = levels


def _check_features(levels: dict[str, int]) -> None:
    """A finalized level this code cannot serve stops the node: it must not go on as if
    it could (Kafka refuses to start below a finalized metadata.version it supports)."""
    for name, level in levels.items():
        feature = SUPPORTED.get(name)
        if feature is None and level == 0:
            continue
        if feature is None or not feature.min_level <= level <= feature.max_level:
            known = f"{feature.min_level}..{feature.max_level}" if feature else "unknown"
            raise MetadataVersionError(
                f"the cluster has finalized {name}={level}, which this StraitMQ does not "
                f"support (supported: {known}); run a release that supports it"
            )


_HANDLERS = {
    "cluster": _cluster,
    "register_broker": _register_broker,
    "fence_broker": _fence,
    "unfence_broker": _unfence,
    "broker_shutdown": _shutdown,
    "topic": _topic,
    "partition": _partition,
    "partition_change": _partition_change,
    "config": _config,
    "cluster_config": _cluster_config,
    "remove_topic": _remove_topic,
    "producer_ids": _producer_ids,
    "user_scram_credential": _user_scram_credential,
    "remove_user_scram_credential": _remove_user_scram_credential,
    "acl": _acl,
    "remove_acl": _remove_acl,
    "client_quota": _client_quota,
    "feature_level": _feature_level,
}

# The newest version of each record type this code reads (see the module's docstring).
RECORD_VERSIONS: dict[str, int] = {kind: 1 for kind in _HANDLERS}
