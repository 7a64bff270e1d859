"""The few Kubernetes API calls the operator makes (the client is synchronous: threads)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

from straitmq.node_identity import ordinal_from_hostname

from . import names as n


def api_client() -> client.ApiClient:
    """In a pod: its service account; elsewhere: KUBECONFIG / ~/.kube/config."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self._dynamic: DynamicClient | None = None

    def _dyn(self) -> DynamicClient:
        if self._dynamic is None:  # discovery: a burst of requests, once
            self._dynamic = DynamicClient(self.api)
        return self._dynamic

    def _resource(self, api_version: str, kind: str) -> Any:
        return self._dyn().resources.get(api_version=api_version, kind=kind)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the operator's field manager (forcing: we own these)."""

        def call() -> dict[str, Any]:
            res = self._resource(obj["apiVersion"], obj["kind"])
            meta = obj["metadata"]
            out = res.server_side_apply(
                body=obj,
                name=meta["name"],
                namespace=meta.get("namespace"),
                field_manager=n.FIELD_MANAGER,
                force_conflicts=True,
            )
            return out.to_dict()

        return await asyncio.to_thread(call)

    async def get(
        self, api_version: str, kind: str, namespace: str | None, name: str
    ) -> dict | None:
        """None if it is not there; namespace None for a cluster-scoped kind."""

        def call() -> dict | None:
            try:
                res = self._resource(api_version, kind)
                return res.get(name=name, namespace=namespace).to_dict()
            except NotFoundError:
                return None

        return await asyncio.to_thread(call)

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        """False if it was not there."""

        def call() -> bool:
            try:
                self._resource(api_version, kind).delete(name=name, namespace=namespace)
            except NotFoundError:
                return False
            return True

        return await asyncio.to_thread(call)

    async def list_objects(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        """The objects of a kind in a namespace that match a label selector."""

        def call() -> list[dict[str, Any]]:
            found = self._resource(api_version, kind).get(
                namespace=namespace, label_selector=selector
            )
            return [item.to_dict() for item in found.items]

        return await asyncio.to_thread(call)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        def call() -> list[dict[str, Any]]:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
            return [self.api.sanitize_for_serialization(p) for p in pods.items]

        return await asyncio.to_thread(call)

    async def delete_pod(self, namespace: str, name: str) -> None:
        def call() -> None:
            try:
                self.core.delete_namespaced_pod(name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise

        await asyncio.to_thread(call)

    async def annotate_pod(self, namespace: str, name: str, key: str, value: str | None) -> None:
        """Set (None: remove) one annotation of a pod; a pod already gone is no error."""

        def call() -> None:
            body = {"metadata": {"annotations": {key: value}}}
            try:
                self.core.patch_namespaced_pod(name, namespace, body)
            except ApiException as e:
                if e.status != 404:
                    raise

        await asyncio.to_thread(call)

    async def patch_config_map_data(
        self, namespace: str, name: str, data: dict[str, str | None]
    ) -> bool:
        """Merge `data` into a ConfigMap's (None removes a key); False if it is not there."""

        def call() -> bool:
            try:
                self.core.patch_namespaced_config_map(name, namespace, {"data": data})
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
            return True

        return await asyncio.to_thread(call)

    async def create_config_map(self, obj: dict[str, Any]) -> bool:
        """False if one of that name is already there (someone made it meanwhile)."""

        def call() -> bool:
            try:
                self.core.create_namespaced_config_map(obj["metadata"]["namespace"], cast(Any, obj))
            except ApiException as e:
                if e.status == 409:
                    return False
                raise
            return True

        return await asyncio.to_thread(call)

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        def call() -> list[dict[str, Any]]:
            out = self.custom.list_namespaced_custom_object(n.GROUP, n.VERSION, namespace, plural)
            return list(cast(dict, out).get("items") or [])

        return await asyncio.to_thread(call)

    async def remove_annotation(self, plural: str, namespace: str, name: str, key: str) -> None:
        """Drop one annotation of a custom object; gone meanwhile is no error."""

        def call() -> None:
            try:
                self.custom.patch_namespaced_custom_object(
                    n.GROUP,
                    n.VERSION,
                    namespace,
                    plural,
                    name,
                    {"metadata": {"annotations": {key: None}}},
                )
            except ApiException as e:
                if e.status != 404:
                    raise

        await asyncio.to_thread(call)

    async def list_rack_bindings(self) -> list[dict[str, Any]]:
        """The rack ClusterRoleBindings the operator made, of every MQCluster."""

        def call() -> list[dict[str, Any]]:
            res = self._resource("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")
            found = res.get(label_selector=f"{n.CLUSTER_NAMESPACE_LABEL}").to_dict()
            return list(found.get("items") or [])

        return await asyncio.to_thread(call)

    async def get_custom(self, plural: str, namespace: str, name: str) -> dict | None:
        def call() -> dict | None:
            try:
                # The client types it as object; a custom object comes back as a dict.
                return cast(
                    dict,
                    self.custom.get_namespaced_custom_object(
                        n.GROUP, n.VERSION, namespace, plural, name
                    ),
                )
            except ApiException as e:
                if e.status == 404:
                    return None
                raise

        return await asyncio.to_thread(call)

    async def patch_status(
        self, plural: str, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        def call() -> None:
            try:
                self.custom.patch_namespaced_custom_object_status(
                    n.GROUP, n.VERSION, namespace, plural, name, {"status": status}
                )
            except ApiException as e:
                if e.status != 404:  # deleted meanwhile: nothing to report on
                    raise

        await asyncio.to_thread(call)


# What a person can do about a refusal, by HTTP status (the API server's message says what).
_API_HINTS = {
    401: "check the operator's service account token",
    403: "grant the operator's service account that permission (the Helm chart's RBAC)",
    404: "check that the object and its CRD exist",
    409: "another client changed the object meanwhile; the operator retries",
    422: "correct the field the message names",
    429: "the API server is overloaded; the operator retries",
}


def api_message(e: ApiException) -> str:
    """The `message` of the Status the API server answered with (the body if not JSON)."""
    body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else e.body
    if not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return " ".join(str(body).split())[:300]
    if isinstance(status, dict) and status.get("message"):
        return " ".join(str(status["message"]).split())
    return ""


def explain(e: BaseException) -> str:
    """One line for a condition or an Event: what went wrong and, if known, what to do.

    A Kubernetes client error's own text carries the HTTP response headers and body;
    this keeps the status, the reason and the API server's message."""
    if isinstance(e, ApiException):
        what = f"the Kubernetes API refused a request (HTTP {e.status} {e.reason or ''}".rstrip()
        what += ")"
        message = api_message(e)
        if message:
            what += f": {message.rstrip('.')}"
        code = int(e.status or 0)
        hint = _API_HINTS.get(code) or (
            "the API server is unavailable; the operator retries" if code >= 500 else None
        )
        return f"{what}; {hint}" if hint else what
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return False


def ordinal(pod: dict[str, Any]) -> int:
    return ordinal_from_hostname(pod["metadata"]["name"])
