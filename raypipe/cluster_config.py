"""Offline checks for the cluster definitions shipped with raypipe (``cluster.yaml``, KubeRay).

Nothing here talks to a cloud or a Kubernetes API server. ``raypipe cluster-check`` runs these checks
on the files a user names (``raypipe/cli/cluster_check.py``); the rest of the package does not import
this module.

``validate_cluster_config`` checks a cluster-launcher config against the JSON schema Ray ships
(``ray/autoscaler/ray-schema.json``, the contract ``ray up`` validates against) with ``jsonschema``,
then does what the schema cannot say, on public ground only:

- ``head_node_type`` is present and names one of ``available_node_types`` (left out, Ray silently
  uses ``ray.head.default`` from its defaults);
- no node type has ``min_workers > max_workers`` (Ray accepts it and quietly uses the smaller);
- the node types' ``min_workers`` add up to at most the global ``max_workers`` (``ray up`` refuses
  this only after it has read the file);
- the head advertises ``CPU: 0`` (raypipe's layout: no training or preprocessing there).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["validate_cluster_config", "check_kuberay_manifest", "ray_schema_path"]

KUBERAY_API_VERSION = "ray.io/v1"
DEFAULT_PREPROCESS_RESOURCE = "preprocess"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_PUBLIC_SERVICE_TYPES = ("LoadBalancer", "NodePort")


def ray_schema_path() -> Path:
    """Path of the cluster-config JSON schema shipped inside the installed ray package."""
    from importlib.resources import files

    return Path(str(files("ray.autoscaler").joinpath("ray-schema.json")))


# --------------------------------------------------------------------------------------------------
# Ray cluster launcher config (cluster.yaml)


def _load_mapping(path_or_dict: str | Path | Mapping) -> tuple[dict, str]:
    if isinstance(path_or_dict, Mapping):
        return copy.deepcopy(dict(path_or_dict)), "<dict>"
    where = str(path_or_dict)
    try:
        data = yaml.safe_load(Path(path_or_dict).read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{where}: cannot read cluster config: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    return data, where


def _schema_error(e: Any) -> str:
    """One line from a ``jsonschema.ValidationError``: where in the document, and what is wrong."""
    at = "/".join(str(p) for p in e.absolute_path) or "<top level>"
    return f"schema violation at {at}: {e.message}"


def _validate_with_schema(config: dict, where: str) -> None:
    import jsonschema

    schema = json.loads(ray_schema_path().read_text(encoding="utf-8"))
    try:
        jsonschema.validate(config, schema)
    except jsonschema.ValidationError as e:
        raise ValueError(f"{where}: {_schema_error(e)}") from e


def _check_node_types(config: dict, where: str, *, head_cpu_zero: bool) -> None:
    """What the schema cannot say (see the module docstring)."""
    if "head_node_type" not in config:
        raise ValueError(
            f"{where}: missing head_node_type (Ray would silently use 'ray.head.default' from its "
            "defaults); name the head's entry in available_node_types"
        )
    types_ = config.get("available_node_types")
    if not isinstance(types_, Mapping) or not types_:
        raise ValueError(f"{where}: available_node_types must be a non-empty mapping")
    head = config["head_node_type"]
    if head not in types_:
        raise ValueError(f"{where}: head_node_type {head!r} is not one of available_node_types {sorted(types_)}")
    for name, spec in types_.items():
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}: available_node_types.{name} must be a mapping")
        lo, hi = spec.get("min_workers"), spec.get("max_workers")
        if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
            raise ValueError(f"{where}: available_node_types.{name}: min_workers={lo} > max_workers={hi}")
    total = config.get("max_workers")
    least = sum(spec.get("min_workers") or 0 for spec in types_.values())
    if isinstance(total, int) and least > total:
        raise ValueError(
            f"{where}: the node types' min_workers add up to {least}, more than the global max_workers={total}"
        )
    head_cpu = (types_[head].get("resources") or {}).get("CPU")
    if head_cpu_zero and head_cpu != 0:
        raise ValueError(
            f"{where}: available_node_types.{head}.resources.CPU must be 0 (got {head_cpu!r}) so that no "
            "training worker or preprocessing task is scheduled on the head"
        )


def validate_cluster_config(path_or_dict: str | Path | Mapping[str, Any], *, head_cpu_zero: bool = True) -> dict:
    """Validate a Ray cluster-launcher config offline; return it (a copy, as written).

    ``head_cpu_zero``: also require the head node type to advertise ``CPU: 0`` (raypipe's layout).
    Raises ``ValueError`` naming the file and the problem. Example::

        >>> cfg = validate_cluster_config("cluster.yaml")          # doctest: +SKIP
        >>> cfg["available_node_types"]["head"]["resources"]       # doctest: +SKIP
        {'CPU': 0}
    """
    config, where = _load_mapping(path_or_dict)
    if not isinstance(config.get("provider"), Mapping) or "type" not in config["provider"]:
        raise ValueError(f"{where}: missing provider.type")
    # The schema first, so a misspelt key is named as such rather than as a missing one.
    _validate_with_schema(config, where)
    _check_node_types(config, where, head_cpu_zero=head_cpu_zero)
    return config


# --------------------------------------------------------------------------------------------------
# KubeRay manifests (RayCluster, RayJob)


def _fail(where: str, msg: str) -> None:
    raise ValueError(f"{where}: {msg}")


def _parse_ray_resources(value: Any, where: str) -> dict:
    """Decode KubeRay's rayStartParams ``resources`` string ``'"{\\"preprocess\\": 1000}"'``.

    KubeRay passes the value to ``ray start --resources=<value>`` verbatim, hence the extra outer
    quotes; Ray's autoscaler strips them and the backslashes the same way, and wants ints.
    """
    if not isinstance(value, str) or len(value) < 2 or value[0] != '"' or value[-1] != '"':
        _fail(
            where,
            f"rayStartParams.resources must be a quoted JSON string like "
            f'\'"{{\\"preprocess\\": 1000}}"\', got {value!r}',
        )
    try:
        parsed = json.loads(value[1:-1].replace("\\", ""))
    except json.JSONDecodeError as e:
        _fail(where, f"rayStartParams.resources is not JSON after unquoting: {e}")
    if not isinstance(parsed, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in parsed.items()
    ):
        _fail(where, f"rayStartParams.resources must map names to ints >= 0, got {parsed!r}")
    return parsed


def _group_resources(group: Mapping, where: str) -> dict:
    """Custom Ray resources a group advertises: top-level ``resources`` or rayStartParams."""
    top = group.get("resources")
    if isinstance(top, Mapping) and top:
        return dict(top)
    params = group.get("rayStartParams") or {}
    return _parse_ray_resources(params["resources"], where) if "resources" in params else {}


def _containers(group: Mapping, where: str) -> list:
    try:
        containers = group["template"]["spec"]["containers"]
    except (KeyError, TypeError):
        _fail(where, "missing template.spec.containers")
    if not isinstance(containers, list) or not containers:
        _fail(where, "template.spec.containers must be a non-empty list")
    return containers


def _requests_gpu(group: Mapping, where: str) -> bool:
    for c in _containers(group, where):
        res = c.get("resources") or {}
        for part in ("limits", "requests"):
            amount = (res.get(part) or {}).get("nvidia.com/gpu")
            if amount is None:
                continue
            try:
                if int(str(amount)) > 0:
                    return True
            except ValueError:
                _fail(where, f"nvidia.com/gpu must be a whole number of GPUs, got {amount!r}")
    return False


def _check_ray_cluster_spec(spec: Any, where: str, *, resource: str, loopback_dashboard: bool) -> None:
    if not isinstance(spec, Mapping):
        _fail(where, "spec must be a mapping")
    # GCS (6379) is reachable from every pod in the cluster network whatever the dashboard does.
    if ((spec.get("authOptions") or {}).get("mode")) != "token":
        _fail(
            where,
            "authOptions.mode must be 'token' (KubeRay >= 1.5.1 creates the Secret and sets "
            "RAY_AUTH_MODE / RAY_AUTH_TOKEN on every Ray container)",
        )
    if spec.get("enableInTreeAutoscaling") is not True:
        _fail(where, "enableInTreeAutoscaling must be true (the autoscaler sidecar scales worker groups)")

    head = spec.get("headGroupSpec")
    if not isinstance(head, Mapping):
        _fail(where, "missing headGroupSpec")
    hw = f"{where}.headGroupSpec"
    params = head.get("rayStartParams") or {}
    if str(params.get("num-cpus")) != "0":
        _fail(
            hw,
            f"rayStartParams.num-cpus must be '0' (no training/preprocessing on the head), "
            f"got {params.get('num-cpus')!r}",
        )
    host = params.get("dashboard-host")
    if loopback_dashboard and host not in _LOOPBACK:
        _fail(
            hw,
            f"rayStartParams.dashboard-host must be 127.0.0.1 (got {host!r}; left out, KubeRay uses "
            "0.0.0.0); reach the dashboard with `kubectl port-forward`",
        )
    svc_type = head.get("serviceType")
    svc_type = svc_type or ((head.get("headService") or {}).get("spec") or {}).get("type")
    if svc_type in _PUBLIC_SERVICE_TYPES:
        _fail(
            hw,
            f"serviceType {svc_type} exposes the head (GCS 6379, dashboard/job API 8265) outside the "
            "cluster; use ClusterIP",
        )
    for c in _containers(head, hw):
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                _fail(hw, f"container {c.get('name')!r} binds hostPort {port['hostPort']}; remove it")

    groups = spec.get("workerGroupSpecs")
    if not isinstance(groups, list) or not groups:
        _fail(where, "workerGroupSpecs must be a non-empty list")
    has_gpu = has_preprocess = False
    for i, group in enumerate(groups):
        gw = f"{where}.workerGroupSpecs[{i}]({group.get('groupName', '?')})"
        lo, hi = group.get("minReplicas"), group.get("maxReplicas")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (lo, hi)):
            _fail(gw, f"minReplicas and maxReplicas must be ints >= 0, got {lo!r}, {hi!r}")
        if lo > hi:
            _fail(gw, f"minReplicas={lo} > maxReplicas={hi}")
        gpu = _requests_gpu(group, gw)
        custom = _group_resources(group, gw)
        has_gpu |= gpu
        has_preprocess |= (not gpu) and custom.get(resource, 0) > 0
    if not has_gpu:
        _fail(where, "no worker group requests nvidia.com/gpu (trainer nodes)")
    if not has_preprocess:
        _fail(
            where,
            f"no CPU worker group advertises the custom resource {resource!r} "
            f'(rayStartParams.resources: \'"{{\\"{resource}\\": 1000}}"\')',
        )


def check_kuberay_manifest(path: str | Path, *, resource: str = DEFAULT_PREPROCESS_RESOURCE) -> list[dict]:
    """Check the RayCluster / RayJob documents in a KubeRay manifest; return all documents.

    Both kinds: ``apiVersion: ray.io/v1``, in-tree autoscaling, head ``num-cpus: "0"``, worker groups
    with ``minReplicas <= maxReplicas``, a GPU group requesting ``nvidia.com/gpu``, a CPU group
    advertising ``resource``, token auth (``authOptions.mode: token``), no LoadBalancer/NodePort
    Service and no hostPort. ``RayCluster``: the dashboard must listen on loopback (reach it with
    ``kubectl port-forward``). ``RayJob`` with ``rayClusterSpec``: the submitter pod and the operator
    call the job API through the head's Service, so loopback is impossible there; token auth and a
    ClusterIP-only head protect it; ``shutdownAfterJobFinishes`` and ``ttlSecondsAfterFinished`` are
    required. Raises ``ValueError`` naming the file, the document and the field.
    """
    where = str(path)
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text(encoding="utf-8")) if d is not None]
    except OSError as e:
        raise ValueError(f"{where}: cannot read manifest: {e}") from e
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML: {e}") from e
    ray_docs = 0
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            _fail(where, f"document {i} is not a mapping")
        kind = doc.get("kind")
        dw = f"{where}[{i}] {kind}/{(doc.get('metadata') or {}).get('name', '?')}"
        if kind == "Service" and (doc.get("spec") or {}).get("type") in _PUBLIC_SERVICE_TYPES:
            _fail(dw, f"Service type {doc['spec']['type']} exposes Ray outside the cluster; use ClusterIP")
        if kind not in ("RayCluster", "RayJob"):
            continue
        ray_docs += 1
        if doc.get("apiVersion") != KUBERAY_API_VERSION:
            _fail(dw, f"apiVersion must be {KUBERAY_API_VERSION!r}, got {doc.get('apiVersion')!r}")
        spec = doc.get("spec")
        if not isinstance(spec, Mapping):
            _fail(dw, "missing spec")
        if kind == "RayCluster":
            _check_ray_cluster_spec(spec, dw, resource=resource, loopback_dashboard=True)
            continue
        if not isinstance(spec.get("entrypoint"), str) or not spec["entrypoint"].strip():
            _fail(dw, "spec.entrypoint must be a command string")
        if "rayClusterSpec" in spec:
            cluster = spec["rayClusterSpec"]
            # The submitter pod and the operator reach the job API through the head Service, so the
            # dashboard cannot be loopback-only here; token auth + ClusterIP are what protect it.
            _check_ray_cluster_spec(cluster, f"{dw}.rayClusterSpec", resource=resource, loopback_dashboard=False)
            if spec.get("shutdownAfterJobFinishes") is not True:
                _fail(dw, "shutdownAfterJobFinishes must be true (GPU nodes otherwise idle after the job)")
            ttl = spec.get("ttlSecondsAfterFinished")
            if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0:
                _fail(dw, f"ttlSecondsAfterFinished must be an int >= 0, got {ttl!r}")
        elif not isinstance(spec.get("clusterSelector"), Mapping) or not spec["clusterSelector"]:
            _fail(dw, "needs rayClusterSpec or a non-empty clusterSelector")
    if not ray_docs:
        _fail(where, "no RayCluster or RayJob document found")
    return docs
