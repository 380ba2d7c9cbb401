"""``raypipe cluster-check``: check cluster definitions offline, before ``ray up`` or ``kubectl apply``.

A Ray cluster-launcher config (``cluster.yaml``) is checked by ``validate_cluster_config``, a KubeRay
manifest (a YAML file whose documents carry a Kubernetes ``kind``) by ``check_kuberay_manifest``
(``raypipe.cluster_config``). Nothing talks to a cloud or a Kubernetes API server.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from raypipe.cli.common import check_json_path, write_json

DEFAULT_PATH = "cluster.yaml"
LAUNCHER, KUBERAY = "Ray cluster launcher config", "KubeRay manifest"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "cluster-check",
        help="check cluster.yaml or KubeRay manifests offline, before `ray up`",
        description="Check Ray cluster-launcher configs (against the schema the installed Ray ships, plus "
        "raypipe's layout: a head that advertises CPU: 0) and KubeRay manifests (recognised by their "
        "documents' kind: RayCluster, RayJob) offline. One line per file: ok, or what is wrong. Exit "
        "status 2 when any file is invalid.",
    )
    p.add_argument(
        "paths", nargs="*", metavar="PATH", help=f"files to check (default: {DEFAULT_PATH} in the current directory)"
    )
    p.add_argument(
        "--preprocess-resource",
        default="preprocess",
        help="the custom resource a KubeRay CPU worker group must advertise",
    )
    p.add_argument("--json", help="write a machine-readable report here")
    p.set_defaults(func=main)


def kind_of(path: str | Path) -> str:
    """``KUBERAY`` when any YAML document in the file has a ``kind`` (a Kubernetes manifest; a cluster-
    launcher config has no such key), else ``LAUNCHER``. A file that cannot be read or parsed counts
    as a launcher config, whose check then says why."""
    import yaml

    try:
        docs = list(yaml.safe_load_all(Path(path).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return LAUNCHER
    return KUBERAY if any(isinstance(doc, dict) and "kind" in doc for doc in docs) else LAUNCHER


def check_file(path: str, *, resource: str) -> str:
    """What the file holds, once checked; raises ``ValueError`` naming the file and what is wrong."""
    from raypipe.cluster_config import check_kuberay_manifest, validate_cluster_config

    if kind_of(path) == KUBERAY:
        docs = check_kuberay_manifest(path, resource=resource)
        names = [
            f"{d['kind']} {(d.get('metadata') or {}).get('name', '?')}"
            for d in docs
            if isinstance(d, dict) and d.get("kind") in ("RayCluster", "RayJob")
        ]
        return ", ".join(names)
    config = validate_cluster_config(path)
    return f"provider {config['provider']['type']}, node types {', '.join(config['available_node_types'])}"


def main(args: argparse.Namespace) -> int:
    import sys

    paths = list(args.paths)
    if not paths:
        if not Path(DEFAULT_PATH).is_file():
            raise ValueError(f"no {DEFAULT_PATH} in {Path.cwd()}: name the file(s) to check")
        paths = [DEFAULT_PATH]
    check_json_path(args.json)
    report = []
    for path in paths:
        entry = {"path": path, "kind": kind_of(path), "ok": True}
        try:
            entry["summary"] = check_file(path, resource=args.preprocess_resource)
            print(f"{path}: ok ({entry['kind']}: {entry['summary']})")
        except ValueError as e:  # the checks' errors name the file; a YAML error's own lines are joined
            entry.update(ok=False, error=" ".join(line.strip() for line in str(e).splitlines() if line.strip()))
            print(f"raypipe cluster-check: error: {entry['error']}", file=sys.stderr)
        report.append(entry)
    ok = all(entry["ok"] for entry in report)
    write_json(args.json, {"files": report, "ok": ok})
    return 0 if ok else 2
