"""Every instrument StraitMQ exports, declared once: name, kind, unit, attributes.

Names follow OpenTelemetry's conventions: dotted, lower case, namespaced by component,
units in UCUM (`By`, `s`, `{message}`), no `_total` or unit in the name (the Prometheus
exporter adds them: `straitmq.broker.topic.io` in `By` is scraped as
`straitmq_broker_topic_io_bytes_total`). Attribute keys reuse the messaging semantic
conventions where they fit (`messaging.destination.name` for the topic, ...).

Cardinality stays bounded by the cluster's own objects (topics, partitions, groups,
brokers, Kafka APIs, error codes); nothing is labelled by client id or host.
"""

from __future__ import annotations

from dataclasses import dataclass

# Attribute keys
TOPIC = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
GROUP = "messaging.consumer.group.name"
DIRECTION = "network.io.direction"  # "receive" (produce) | "transmit" (fetch)
API = "kafka.api.name"  # Produce, Fetch (consumers), FetchFollower (replicas), Metadata, ...
ERROR = "error.type"  # the Kafka error name, e.g. NOT_LEADER_OR_FOLLOWER
ISR_OPERATION = "straitmq.isr.operation"  # shrink | expand
GROUP_STATE = "straitmq.consumer_group.state"  # Empty, PreparingRebalance, ..., Stable
GROUP_TYPE = "straitmq.consumer_group.type"  # classic | consumer (KIP-848) | share (KIP-932)
BROKER_STATE = "straitmq.broker.state"  # active | fenced | shutting_down
NODE = "straitmq.node.id"
REPLICA_KIND = "straitmq.raft.replica.kind"  # voter | observer
FENCE_REASON = "straitmq.fence.reason"  # session_expired, process_gone
RESOURCE_KIND = "straitmq.resource.kind"  # MQCluster | Topic
OUTCOME = "straitmq.reconcile.outcome"  # success | error | requeue
FETCHER_KIND = "straitmq.fetch_session.fetcher"  # follower | consumer
QUOTA_TYPE = "straitmq.quota.type"  # producer_byte_rate, consumer_byte_rate, ...
QUOTA_USER = "straitmq.quota.user"  # "" where the quota is not per user
QUOTA_CLIENT = "straitmq.quota.client_id"  # "" where the quota is not per client id
LOG_DIR = "straitmq.log_dir"  # a broker's data directory, as configured
LISTENER = "straitmq.listener"  # a listener's name (Kafka listeners), or HTTP
VOTER_STATE = "straitmq.raft.voter.state"  # reachable | unreachable
# A client's software (ApiVersions v3+), "unknown" for older clients: bounded by the
# client registry's --client-registry-max-entries, never by client id or host.
CLIENT_SOFTWARE_NAME = "straitmq.client.software.name"
CLIENT_SOFTWARE_VERSION = "straitmq.client.software.version"
LIMIT = "straitmq.limit"  # a bound's name: max.connections, fetch.parked.per.partition, ...
VERSION = "version"  # the release, e.g. 0.2.0.dev0 (straitmq.version.VERSION)
COMMIT = "commit"  # the full git commit id it was built from, or "unknown"

COUNTER = "counter"
HISTOGRAM = "histogram"  # SDK histogram (off the request path)
FAST_HISTOGRAM = "fast_histogram"  # request path: see histogram.py
OBSERVABLE_COUNTER = "observable_counter"
OBSERVABLE_GAUGE = "observable_gauge"


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: str
    unit: str
    description: str
    attributes: tuple[str, ...] = ()

    @property
    def scope(self) -> str:
        """The meter (instrumentation scope) it belongs to: straitmq.<component>."""
        return ".".join(self.name.split(".")[:2])


def _i(name: str, kind: str, unit: str, description: str, *attributes: str) -> Instrument:
    return Instrument(name, kind, unit, description, attributes)


# -- broker ---------------------------------------------------------------------------

BROKER_TOPIC_IO = _i(
    "straitmq.broker.topic.io", OBSERVABLE_COUNTER, "By",
    "Record batch bytes produced to (receive) and fetched by consumers from (transmit) "
    "each topic, on this broker", TOPIC, DIRECTION,
)  # fmt: skip
BROKER_TOPIC_MESSAGES = _i(
    "straitmq.broker.topic.messages", OBSERVABLE_COUNTER, "{message}",
    "Records produced to (receive) and fetched by consumers from (transmit) each topic; "
    "transmit counts the offsets a fetch covers", TOPIC, DIRECTION,
)  # fmt: skip
BROKER_REPLICATION_IO = _i(
    "straitmq.broker.replication.io", OBSERVABLE_COUNTER, "By",
    "Record batch bytes this broker served to follower replicas", DIRECTION,
)  # fmt: skip
BROKER_REQUEST_DURATION = _i(
    "straitmq.broker.request.duration", FAST_HISTOGRAM, "s",
    "Time from the broker taking up a Kafka request to its response being written (queueing "
    "behind earlier requests of the connection excluded), per API", API,
)  # fmt: skip
BROKER_REQUEST_ERRORS = _i(
    "straitmq.broker.request.errors", OBSERVABLE_COUNTER, "{error}",
    "Error codes returned: per partition for Produce and Fetch, the top-level error code for "
    "other APIs", API, ERROR,
)  # fmt: skip
BROKER_PARTITIONS = _i(
    "straitmq.broker.partitions", OBSERVABLE_GAUGE, "{partition}",
    "Partition replicas hosted on this broker",
)  # fmt: skip
BROKER_LEADERS = _i(
    "straitmq.broker.leaders", OBSERVABLE_GAUGE, "{partition}",
    "Partitions this broker leads",
)  # fmt: skip
BROKER_UNDER_REPLICATED = _i(
    "straitmq.broker.partitions.under_replicated", OBSERVABLE_GAUGE, "{partition}",
    "Partitions this broker leads whose ISR is smaller than the replica set",
)  # fmt: skip
BROKER_UNDER_MIN_ISR = _i(
    "straitmq.broker.partitions.under_min_isr", OBSERVABLE_GAUGE, "{partition}",
    "Partitions this broker leads whose ISR is below min.insync.replicas (acks=all fails)",
)  # fmt: skip
BROKER_ISR_OPERATIONS = _i(
    "straitmq.broker.isr.operations", OBSERVABLE_COUNTER, "{operation}",
    "ISR shrinks and expands this broker's partitions committed", ISR_OPERATION,
)  # fmt: skip
BROKER_LOG_SIZE = _i(
    "straitmq.broker.log.size", OBSERVABLE_GAUGE, "By",
    "Bytes in each partition replica's log on this broker", TOPIC, PARTITION,
)  # fmt: skip
BROKER_LOG_SEGMENTS = _i(
    "straitmq.broker.log.segments", OBSERVABLE_GAUGE, "{segment}",
    "Segment files of each partition replica's log on this broker", TOPIC, PARTITION,
)  # fmt: skip
BROKER_OPEN_SEGMENT_FILES = _i(
    "straitmq.broker.log.open_files", OBSERVABLE_GAUGE, "{file}",
    "Segment files this broker holds open (at most --max-open-files; the least recently "
    "used are closed and reopened on demand)",
)  # fmt: skip
BROKER_FETCH_SESSIONS = _i(
    "straitmq.broker.fetch_sessions", OBSERVABLE_GAUGE, "{session}",
    "Incremental fetch sessions (KIP-227) this broker holds as a leader, for follower "
    "replicas and for consumers", FETCHER_KIND,
)  # fmt: skip
BROKER_FETCH_SESSION_PARTITIONS = _i(
    "straitmq.broker.fetch_sessions.partitions", OBSERVABLE_GAUGE, "{partition}",
    "Partitions held in this broker's fetch sessions", FETCHER_KIND,
)  # fmt: skip
BROKER_FETCH_SESSION_EVICTIONS = _i(
    "straitmq.broker.fetch_sessions.evictions", OBSERVABLE_COUNTER, "{session}",
    "Fetch sessions evicted to make room for new ones (the cache holds at most 1000)",
)  # fmt: skip
BROKER_STORAGE_UNAVAILABLE = _i(
    "straitmq.broker.partitions.storage_unavailable", OBSERVABLE_GAUGE, "{partition}",
    "Replicas assigned to this broker whose log cannot be opened (no disk space or "
    "descriptors); their requests get KAFKA_STORAGE_ERROR",
)  # fmt: skip
BROKER_CLEANER_IO = _i(
    "straitmq.broker.log_cleaner.io", OBSERVABLE_COUNTER, "By",
    "Bytes the log cleaner read (receive) and wrote (transmit) compacting logs",
    DIRECTION,
)  # fmt: skip
BROKER_CLEANER_RECORDS_REMOVED = _i(
    "straitmq.broker.log_cleaner.records_removed", OBSERVABLE_COUNTER, "{record}",
    "Records the log cleaner removed: superseded by a later record of their key, "
    "tombstones past delete.retention.ms, records without a key",
)  # fmt: skip
BROKER_CLEANER_CLEANINGS = _i(
    "straitmq.broker.log_cleaner.cleanings", OBSERVABLE_COUNTER, "{cleaning}",
    "Cleanings swapped into a log",
)  # fmt: skip
BROKER_CLEANER_ERRORS = _i(
    "straitmq.broker.log_cleaner.errors", OBSERVABLE_COUNTER, "{error}",
    "Cleanings that failed (corrupt data, a dead worker, I/O errors)",
)  # fmt: skip
BROKER_CLEANER_BUSY = _i(
    "straitmq.broker.log_cleaner.busy", OBSERVABLE_COUNTER, "s",
    "Time the cleaner's workers spent cleaning (summed over workers)",
)  # fmt: skip
BROKER_CLEANER_DIRTY_RATIO = _i(
    "straitmq.broker.log_cleaner.dirty_ratio", OBSERVABLE_GAUGE, "1",
    "Share of a compacted log's cleanable bytes not yet cleaned (cleaned when above "
    "min.cleanable.dirty.ratio)",
    TOPIC, PARTITION,
)  # fmt: skip
BROKER_CLEANER_SINCE_LAST = _i(
    "straitmq.broker.log_cleaner.time_since_last_clean", OBSERVABLE_GAUGE, "s",
    "Seconds since a compacted log was last cleaned on this broker (since start when "
    "never)",
    TOPIC, PARTITION,
)  # fmt: skip
BROKER_CLEANER_UNCLEANABLE = _i(
    "straitmq.broker.log_cleaner.uncleanable_partitions", OBSERVABLE_GAUGE, "{partition}",
    "Compacted logs the cleaner stopped cleaning (unreadable data: see the broker log); "
    "they keep serving",
)  # fmt: skip
OUTCOME_TXN = "straitmq.transaction.outcome"  # commit | abort | timeout
BROKER_TXN_ONGOING = _i(
    "straitmq.broker.transactions.ongoing", OBSERVABLE_GAUGE, "{transaction}",
    "Open transactions of the transactional ids this broker coordinates",
)  # fmt: skip
BROKER_TXN_COMPLETED = _i(
    "straitmq.broker.transactions.completed", OBSERVABLE_COUNTER, "{transaction}",
    "Transactions this broker's coordinator finished, by outcome (timeout: aborted "
    "after transaction.timeout.ms, also counted as abort)",
    OUTCOME_TXN,
)  # fmt: skip
BROKER_TXN_MARKER_DURATION = _i(
    "straitmq.broker.transactions.marker.duration", OBSERVABLE_COUNTER, "s",
    "Time from a transaction's EndTxn (or timeout) to its markers being in every "
    "partition and its outcome written, summed over the finished transactions (divided "
    "by straitmq.broker.transactions.completed: the mean)",
)  # fmt: skip
BROKER_QUOTA_THROTTLE = _i(
    "straitmq.broker.quota.throttle_time",
    OBSERVABLE_COUNTER,
    "s",
    "Throttle time given to clients over a quota, per quota type and the user and client "
    "id sharing it (only clients with a quota); its rate is the share of time throttled",
    QUOTA_TYPE,
    QUOTA_USER,
    QUOTA_CLIENT,
)
BROKER_QUOTA_BYTES = _i(
    "straitmq.broker.quota.io",
    OBSERVABLE_COUNTER,
    "By",
    "Bytes produced (producer_byte_rate) and fetched (consumer_byte_rate) by clients with "
    "a byte-rate quota, counted against it",
    QUOTA_TYPE,
    QUOTA_USER,
    QUOTA_CLIENT,
)
BROKER_QUOTA_LIMIT = _i(
    "straitmq.broker.quota.limit",
    OBSERVABLE_GAUGE,
    "1",
    "The quota that applies (bytes/s, percent of a thread, partition mutations/s), per "
    "client with one that has been active",
    QUOTA_TYPE,
    QUOTA_USER,
    QUOTA_CLIENT,
)
BROKER_LOG_DIR_USABLE = _i(
    "straitmq.broker.log_dir.usable", OBSERVABLE_GAUGE, "By",
    "Bytes still free for this broker in its log directory's file system (statvfs "
    "f_bavail, what DescribeLogDirs reports as usable_bytes)", LOG_DIR,
)  # fmt: skip
BROKER_LOG_DIR_CAPACITY = _i(
    "straitmq.broker.log_dir.capacity", OBSERVABLE_GAUGE, "By",
    "Size of the file system holding this broker's log directory (DescribeLogDirs' "
    "total_bytes)", LOG_DIR,
)  # fmt: skip
BROKER_CLIENTS = _i(
    "straitmq.broker.clients", OBSERVABLE_GAUGE, "{client}",
    "Clients this broker has seen lately (GET /api/v1/clients: connected now, or within "
    "--client-registry-expiry-ms), by software name and version (unknown: ApiVersions "
    "below v3)", CLIENT_SOFTWARE_NAME, CLIENT_SOFTWARE_VERSION,
)  # fmt: skip
BROKER_LIMIT_REFUSALS = _i(
    "straitmq.broker.limit.refusals", OBSERVABLE_COUNTER, "{refusal}",
    "Connections closed and requests answered early at a bound: max.connections, "
    "max.connections.per.ip, connection_creation_rate (an ip quota), "
    "fetch.parked.per.partition, share.fetch.parked, group.parked",
    LIMIT,
)  # fmt: skip
CONSUMER_GROUP_LAG = _i(
    "straitmq.consumer_group.lag", OBSERVABLE_GAUGE, "{message}",
    "High watermark minus committed offset (a share group's: minus its share-partition "
    "start offset), for groups this broker coordinates on partitions it holds a replica "
    "of", GROUP, GROUP_TYPE, TOPIC, PARTITION,
)  # fmt: skip
CONSUMER_GROUP_STATE = _i(
    "straitmq.consumer_group.state", OBSERVABLE_GAUGE, "1",
    "1 for each group this broker coordinates, labelled with the group's state",
    GROUP, GROUP_TYPE, GROUP_STATE,
)  # fmt: skip
CONSUMER_GROUP_MEMBERS = _i(
    "straitmq.consumer_group.members", OBSERVABLE_GAUGE, "{member}",
    "Members of each group this broker coordinates", GROUP, GROUP_TYPE,
)  # fmt: skip

# -- controller (the quorum voters; a combined node reports these too) --------------

CONTROLLER_ACTIVE = _i(
    "straitmq.controller.active", OBSERVABLE_GAUGE, "1",
    "1 on the active controller (the quorum leader, once it serves), else 0",
)  # fmt: skip
QUORUM_EPOCH = _i(
    "straitmq.controller.quorum.epoch", OBSERVABLE_GAUGE, "{epoch}",
    "This voter's current Raft epoch",
)  # fmt: skip
QUORUM_HIGH_WATERMARK = _i(
    "straitmq.controller.quorum.high_watermark", OBSERVABLE_GAUGE, "{record}",
    "Committed end of the metadata log as this voter knows it",
)  # fmt: skip
QUORUM_COMMIT_DURATION = _i(
    "straitmq.controller.quorum.commit.duration", HISTOGRAM, "s",
    "Time from proposing a metadata change on the leader to its commit",
)  # fmt: skip
QUORUM_FOLLOWER_LAG = _i(
    "straitmq.controller.quorum.follower.lag", OBSERVABLE_GAUGE, "{record}",
    "Records each voter and observer (broker) is behind the leader's log end; "
    "reported by the leader", NODE, REPLICA_KIND,
)  # fmt: skip
QUORUM_VOTERS = _i(
    "straitmq.controller.quorum.voters", OBSERVABLE_GAUGE, "{voter}",
    "Voters of the quorum by whether they fetched from the leader within the check-quorum "
    "window (1.5 x fetch timeout; the leader counts itself reachable); reported by the "
    "leader only", VOTER_STATE,
)  # fmt: skip
CONTROLLER_FENCINGS = _i(
    "straitmq.controller.broker.fencings", OBSERVABLE_COUNTER, "{event}",
    "Brokers this controller fenced while active", FENCE_REASON,
)  # fmt: skip
CONTROLLER_BROKERS = _i(
    "straitmq.controller.brokers", OBSERVABLE_GAUGE, "{broker}",
    "Registered brokers by state; reported by the active controller only", BROKER_STATE,
)  # fmt: skip
CONTROLLER_TOPICS = _i(
    "straitmq.controller.topics", OBSERVABLE_GAUGE, "{topic}",
    "Topics in the metadata image; reported by the active controller only",
)  # fmt: skip
CONTROLLER_PARTITIONS = _i(
    "straitmq.controller.partitions", OBSERVABLE_GAUGE, "{partition}",
    "Partitions in the metadata image; reported by the active controller only",
)  # fmt: skip
CONTROLLER_OFFLINE = _i(
    "straitmq.controller.partitions.offline", OBSERVABLE_GAUGE, "{partition}",
    "Partitions without a leader; reported by the active controller only",
)  # fmt: skip
CONTROLLER_UNDER_REPLICATED = _i(
    "straitmq.controller.partitions.under_replicated", OBSERVABLE_GAUGE, "{partition}",
    "Partitions with a leader whose ISR is smaller than the replica set; reported by the "
    "active controller only",
)  # fmt: skip
CONTROLLER_QUOTA_THROTTLE = _i(
    "straitmq.controller.quota.throttle_time", OBSERVABLE_COUNTER, "s",
    "controller_mutation_rate: throttle time given (and, strict, time until topics would "
    "no longer be refused), per user and client id sharing an allowance; the active "
    "controller's, for the whole cluster",
    QUOTA_USER, QUOTA_CLIENT,
)  # fmt: skip
CONTROLLER_QUOTA_MUTATIONS = _i(
    "straitmq.controller.quota.mutations", OBSERVABLE_COUNTER, "{partition}",
    "Partitions created or deleted by clients with a controller_mutation_rate, charged "
    "to their allowance",
    QUOTA_USER, QUOTA_CLIENT,
)  # fmt: skip
CONTROLLER_QUOTA_REFUSED = _i(
    "straitmq.controller.quota.throttled", OBSERVABLE_COUNTER, "{topic}",
    "Topics refused THROTTLING_QUOTA_EXCEEDED (strict) or answers throttled (permissive) "
    "over controller_mutation_rate",
    QUOTA_USER, QUOTA_CLIENT,
)  # fmt: skip

# -- every server process (brokers, controllers, combined nodes) ---------------------

EVENT_LOOP_STALLS = _i(
    "straitmq.process.event_loop.stalls", OBSERVABLE_COUNTER, "{stall}",
    "Times the event loop ran a heartbeat at least 0.25 s late: one callback blocked (or "
    "many queued) that long, and every request on the process waited with it",
)  # fmt: skip
EVENT_LOOP_STALLED = _i(
    "straitmq.process.event_loop.stalled", OBSERVABLE_COUNTER, "s",
    "Seconds the stalls counted by straitmq.process.event_loop.stalls lasted, summed",
)  # fmt: skip
TLS_CERTIFICATE_EXPIRY = _i(
    "straitmq.tls.certificate.expiry", OBSERVABLE_GAUGE, "s",
    "When the certificate each TLS listener serves stops being valid (its notAfter, Unix "
    "seconds); follows rotations of the files", LISTENER,
)  # fmt: skip
# Served by every process, the operator too (straitmq.telemetry.Telemetry registers it).
BUILD_INFO = _i(
    "straitmq.build.info", OBSERVABLE_GAUGE, "",
    "Always 1, labelled with the version and the commit of the running code (Prometheus' "
    "build_info convention: join on instance to see what each process runs)", VERSION, COMMIT,
)  # fmt: skip

# -- operator (straitmq.operator uses these through operator.OperatorMetrics) -------

OPERATOR_RECONCILES = _i(
    "straitmq.operator.reconciles", COUNTER, "{reconcile}",
    "Reconcile passes, by resource kind and outcome", RESOURCE_KIND, OUTCOME,
)  # fmt: skip
OPERATOR_RECONCILE_DURATION = _i(
    "straitmq.operator.reconcile.duration", HISTOGRAM, "s",
    "Time one reconcile pass took", RESOURCE_KIND,
)  # fmt: skip
OPERATOR_RECONCILE_ERRORS = _i(
    "straitmq.operator.reconcile.errors", COUNTER, "{error}",
    "Reconcile passes that failed, by resource kind and error type", RESOURCE_KIND, ERROR,
)  # fmt: skip

BROKER = (
    BROKER_TOPIC_IO, BROKER_TOPIC_MESSAGES, BROKER_REPLICATION_IO, BROKER_REQUEST_DURATION,
    BROKER_REQUEST_ERRORS, BROKER_PARTITIONS, BROKER_LEADERS, BROKER_UNDER_REPLICATED,
    BROKER_UNDER_MIN_ISR, BROKER_ISR_OPERATIONS, BROKER_LOG_SIZE, BROKER_LOG_SEGMENTS,
    BROKER_OPEN_SEGMENT_FILES, BROKER_STORAGE_UNAVAILABLE, BROKER_FETCH_SESSIONS,
    BROKER_FETCH_SESSION_PARTITIONS, BROKER_FETCH_SESSION_EVICTIONS, BROKER_CLEANER_IO,
    BROKER_CLEANER_RECORDS_REMOVED, BROKER_CLEANER_CLEANINGS, BROKER_CLEANER_ERRORS,
    BROKER_CLEANER_BUSY, BROKER_CLEANER_DIRTY_RATIO, BROKER_CLEANER_SINCE_LAST,
    BROKER_CLEANER_UNCLEANABLE, BROKER_TXN_ONGOING, BROKER_TXN_COMPLETED,
    BROKER_TXN_MARKER_DURATION, BROKER_LOG_DIR_USABLE, BROKER_LOG_DIR_CAPACITY,
    BROKER_QUOTA_THROTTLE, BROKER_QUOTA_BYTES, BROKER_QUOTA_LIMIT, BROKER_CLIENTS,
    BROKER_LIMIT_REFUSALS, CONSUMER_GROUP_LAG, CONSUMER_GROUP_STATE, CONSUMER_GROUP_MEMBERS,
)  # fmt: skip
CONTROLLER = (
    CONTROLLER_ACTIVE, QUORUM_EPOCH, QUORUM_HIGH_WATERMARK, QUORUM_COMMIT_DURATION,
    QUORUM_FOLLOWER_LAG, QUORUM_VOTERS, CONTROLLER_FENCINGS, CONTROLLER_BROKERS, CONTROLLER_TOPICS,
    CONTROLLER_PARTITIONS, CONTROLLER_OFFLINE, CONTROLLER_UNDER_REPLICATED,
    CONTROLLER_QUOTA_THROTTLE, CONTROLLER_QUOTA_MUTATIONS, CONTROLLER_QUOTA_REFUSED,
)  # fmt: skip
PROCESS = (EVENT_LOOP_STALLS, EVENT_LOOP_STALLED, TLS_CERTIFICATE_EXPIRY, BUILD_INFO)
OPERATOR = (OPERATOR_RECONCILES, OPERATOR_RECONCILE_DURATION, OPERATOR_RECONCILE_ERRORS)
ALL = BROKER + CONTROLLER + PROCESS + OPERATOR
