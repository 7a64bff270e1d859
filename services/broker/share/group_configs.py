"""Group configs (Kafka's ConfigResource GROUP, `kafka-configs.sh --entity-type groups`):
for now `share.auto.offset.reset`, where a share group starts reading a partition it has
no saved start offset for (`latest`, Kafka's default, or `earliest`).

They live in the metadata log as cluster configs keyed `group:<group id>:<name>`, so
every broker (each partition leader initializes its share-partitions) sees the same
value, and they survive restarts like topic configs.
"""

from __future__ import annotations

from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError

GROUP_RESOURCE = 32  # ConfigResource.Type.GROUP
PREFIX = "group:"
SET, DELETE = 0, 1

# name -> (default, what it does)
GROUP_CONFIGS: dict[str, tuple[str, str]] = {
    "share.auto.offset.reset": (
        "latest",
        "Where a share group starts consuming a partition it has no start offset for: "
        "latest or earliest.",
    ),
}
_VALUES = {"share.auto.offset.reset": ("latest", "earliest")}


def config_key(group_id: str, name: str) -> str:
    return f"{PREFIX}{group_id}:{name}"


def configured_groups(image: Any) -> set[str]:
    """The groups with a config set explicitly (ListConfigResources lists these)."""
    out: set[str] = set()
    for key in image.cluster_configs:
        if key.startswith(PREFIX):
            group_id, _, _name = key[len(PREFIX) :].rpartition(":")
            out.add(group_id)
    return out


def describe_entries(image: Any, group_id: str, keys: set[str] | None, docs: bool) -> list[dict]:
    """DescribeConfigs entries of a group (explicit values as dynamic group configs)."""
    out: list[dict] = []
    for name, (default, doc) in sorted(GROUP_CONFIGS.items()):
        if keys and name not in keys:
            continue
        explicit = image.cluster_configs.get(config_key(group_id, name))
        out.append(
            {
                "name": name,
                "value": explicit if explicit is not None else default,
                "read_only": False,
                "config_source": 8 if explicit is not None else 5,  # GROUP_CONFIG / DEFAULT
                "is_default": explicit is None,
                "is_sensitive": False,
                "synonyms": [],
                "config_type": 2,  # STRING
                "documentation": doc if docs else None,
            }
        )
    return out


def changes_for(group_id: str, configs: Any) -> tuple[dict[str, str | None], str | None]:
    """The cluster-config changes of an IncrementalAlterConfigs on a group, or why not."""
    if not group_id:
        return {}, "a group id is required"
    changes: dict[str, str | None] = {}
    for c in configs:
        if c.name not in GROUP_CONFIGS:
            return {}, f"unknown group config {c.name} (known: {', '.join(GROUP_CONFIGS)})"
        if c.config_operation == SET:
            allowed = _VALUES.get(c.name)
            if allowed is not None and c.value not in allowed:
                return {}, f"{c.name} must be one of {', '.join(allowed)}, not {c.value!r}"
            changes[config_key(group_id, c.name)] = c.value
        elif c.config_operation == DELETE:
            changes[config_key(group_id, c.name)] = None
        else:
            return {}, f"{c.name}: SET or DELETE only"
    return changes, None


class Control(Protocol):
    """Asks the active controller for a metadata change (MetadataView.control)."""

    async def control(self, op: str, body: dict, within_s: float = 15.0) -> dict: ...


async def alter(
    metadata: Control, group_id: str, configs: Any, validate_only: bool, res: dict
) -> None:
    changes, problem = changes_for(group_id, configs)
    if problem:
        res["error_code"], res["error_message"] = ErrorCode.invalid_config, problem
        return
    if validate_only or not changes:
        return
    try:
        await metadata.control("alter_cluster_configs", {"changes": changes})
    except KafkaError as e:
        res["error_code"], res["error_message"] = e.code, e.message
