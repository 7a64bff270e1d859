"""ApiVersions with feature flags (KIP-584) and UpdateFeatures: `kafka-features.sh`.

Kafka's Admin.describeFeatures asks a broker's ApiVersions (v3+) and prints, for every
supported feature, its supported range and finalized level. The supported ranges are this
release's (straitmq.metadata.features.SUPPORTED); the finalized levels are the metadata
log's (`feature_level` records, or the 0.1.0 baseline for a log that has none), so what a
tool shows is what an operator finalized, and `kafka-features upgrade|downgrade`
(UpdateFeatures) changes it through the active controller.

As in Kafka, a finalized level 0 is not listed (the tool prints 0 for it), and before
v4 features whose supported minimum is 0 are left out (KAFKA-17492: older clients fail
to read them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.features import SAFE_DOWNGRADE, SUPPORTED, UPGRADE

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER

from .context import RequestContext
from .versions import advertised

if TYPE_CHECKING:
    from ..metadata_view import MetadataView
    from .deps import AdminDeps


def feature_fields(version: int, epoch: int, levels: Mapping[str, int]) -> dict:
    """The ApiVersions fields for features, for response `version` (none before v3)."""
    if version < 3:
        return {}
    return {
        "supported_features": [
            {"name": name, "min_version": f.min_level, "max_version": f.max_level}
            for name, f in SUPPORTED.items()
            if version >= 4 or f.min_level > 0
        ],
        "finalized_features_epoch": epoch,
        "finalized_features": [
            {"name": name, "min_version_level": level, "max_version_level": level}
            for name, level in levels.items()
            if level > 0
        ],
    }


async def handle_api_versions(metadata: MetadataView, ctx: RequestContext, req: Any) -> dict:
    image = metadata.image
    # Kafka's finalized-features epoch is the metadata offset the levels were read at.
    return {
        "error_code": 0,
        "api_keys": advertised(),
        "throttle_time": 0,
        **feature_fields(ctx.version, max(image.offset, 0), image.finalized_features()),
    }


async def handle_update_features(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    """UpdateFeatures v0-2: the active controller checks every node and writes the levels,
    all or nothing; the answer waits until this broker's image shows them."""
    names = [u.feature for u in req.feature_updates]
    if not ctx.cluster_allowed(ALTER):
        return _answer(
            ctx.version, names, ErrorCode.cluster_authorization_failed, "ALTER on the cluster"
        )
    if len(set(names)) != len(names):
        return _answer(ctx.version, names, ErrorCode.invalid_request, "a feature may appear once")
    updates = {u.feature: [int(u.max_version_level), _upgrade_type(u)] for u in req.feature_updates}
    try:
        reply = await deps.control(
            "update_features",
            {"updates": updates, "validate_only": bool(getattr(req, "validate_only", False))},
        )
    except KafkaError as e:
        return _answer(ctx.version, names, e.code, e.message)
    errors: dict[str, list] = reply.get("errors", {})
    if not errors:
        return _answer(ctx.version, names, ErrorCode.none, None)
    first_code, first_message = next(iter(errors.values()))
    results = [
        {
            "feature": n,
            "error_code": errors[n][0] if n in errors else first_code,
            "error_message": errors[n][1] if n in errors else f"not applied: {first_message}",
        }
        for n in names
    ]
    return _answer(ctx.version, names, first_code, first_message, results)


def _upgrade_type(update: Any) -> int:
    """v1+ say the upgrade type; v0 says allow_downgrade (Kafka reads it as a safe
    downgrade, UpdateFeaturesRequest.upgradeTypeFromAllowDowngrade)."""
    kind = getattr(update, "upgrade_type", None)
    if kind is not None:
        return int(kind)
    return SAFE_DOWNGRADE if update.allow_downgrade else UPGRADE


def _answer(
    version: int,
    names: list[str],
    code: int,
    message: str | None,
    results: list[dict] | None = None,
) -> dict:
    out: dict = {"throttle_time": 0, "error_code": code, "error_message": message}
    if version < 2:  # v2 answers with the top-level error only
        out["results"] = results or [
            {"feature": n, "error_code": code, "error_message": message} for n in names
        ]
    return out
