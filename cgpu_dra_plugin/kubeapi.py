"""The API server as the plugin and ``kubectl-inspect-cgpu`` use it: the official ``kubernetes`` client.

Objects go in and come out as plain JSON dicts (``_preload_content=False``), so the code reads
them with the field names of the ``resource.k8s.io/v1`` reference, not the client's models.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiException

__all__ = ["ApiException", "KubeApi", "api_client"]


def api_client(kubeconfig: str | None = None, server: str | None = None) -> Any:
    """An ApiClient: ``server`` (tests), else ``kubeconfig``, else in-cluster, else ``~/.kube/config``."""
    if server is not None:
        cfg = client.Configuration()
        cfg.host = server
        return client.ApiClient(cfg)
    if kubeconfig is None:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return client.ApiClient()
        except config.ConfigException:
            pass
    return config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]


def _json(resp: Any) -> dict[str, Any]:
    doc = json.loads(resp.data)
    if not isinstance(doc, dict):
        raise ValueError("the API server answered with something that is not a JSON object")
    return doc


@dataclass
class KubeApi:
    """``resource.k8s.io/v1`` ResourceSlices and ResourceClaims, and the pods claims are reserved for."""

    api_client: Any
    timeout: float = 10.0

    @property
    def _resource(self) -> Any:
        return client.ResourceV1Api(self.api_client)

    @property
    def _core(self) -> Any:
        return client.CoreV1Api(self.api_client)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when there is none of that name."""
        try:
            return _json(self._core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                        _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The claim, or None when there is none of that name."""
        try:
            return _json(self._resource.read_namespaced_resource_claim(name, namespace, _preload_content=False,
                                                                       _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list_claims(self) -> list[dict[str, Any]]:
        doc = _json(self._resource.list_resource_claim_for_all_namespaces(_preload_content=False,
                                                                          _request_timeout=self.timeout))
        return list(doc.get("items") or [])

    def list_slices(self, driver: str | None = None) -> list[dict[str, Any]]:
        kw = {"field_selector": f"spec.driver={driver}"} if driver else {}
        doc = _json(self._resource.list_resource_slice(_preload_content=False, _request_timeout=self.timeout, **kw))
        return list(doc.get("items") or [])

    def apply_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create the slice, or replace the one of that name (with its resourceVersion)."""
        name = body["metadata"]["name"]
        try:
            old = _json(self._resource.read_resource_slice(name, _preload_content=False,
                                                           _request_timeout=self.timeout))
        except ApiException as exc:
            if exc.status != 404:
                raise
            return _json(self._resource.create_resource_slice(client.V1ResourceSlice.from_dict(body),
                                                              _preload_content=False,
                                                              _request_timeout=self.timeout))
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]}}
        return _json(self._resource.replace_resource_slice(name, client.V1ResourceSlice.from_dict(body),
                                                           _preload_content=False,
                                                           _request_timeout=self.timeout))
