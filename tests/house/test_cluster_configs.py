"""The shipped cluster definitions validate offline, and broken copies fail with clear errors."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from raypipe.cluster_config import check_kuberay_manifest, ray_schema_path, validate_cluster_config
from raypipe.config import ExecutionConfig

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_YAML = ROOT / "cluster.yaml"
RAYCLUSTER = ROOT / "deploy" / "kuberay" / "raycluster.yaml"
RAYJOB = ROOT / "deploy" / "kuberay" / "rayjob.yaml"
RESOURCE = "preprocess"


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _write(tmp_path: Path, data, name: str = "broken.yaml") -> Path:
    path = tmp_path / name
    if isinstance(data, list):
        path.write_text(yaml.safe_dump_all(data, sort_keys=False), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _node_types(cfg: dict) -> tuple[str, dict, dict]:
    types_ = cfg["available_node_types"]
    head = cfg["head_node_type"]
    workers = {k: v for k, v in types_.items() if k != head}
    return head, types_[head], workers


# --------------------------------------------------------------------------------------------------
# cluster.yaml


def test_cluster_yaml_validates():
    cfg = validate_cluster_config(CLUSTER_YAML)
    head, head_spec, workers = _node_types(cfg)
    assert cfg == _load(CLUSTER_YAML)  # returned as written
    assert head_spec["resources"]["CPU"] == 0
    assert {"gpu", "preprocess"} <= set(workers)


def test_cluster_yaml_validates_against_ray_schema_directly():
    schema = json.loads(ray_schema_path().read_text(encoding="utf-8"))
    jsonschema.validate(_load(CLUSTER_YAML), schema)


def test_schema_is_the_one_in_the_installed_ray():
    import ray

    path = ray_schema_path()
    assert path.is_file() and Path(ray.__file__).parent in path.parents
    assert "available_node_types" in json.loads(path.read_text(encoding="utf-8"))["properties"]


def test_head_runs_no_training_or_preprocessing():
    head, head_spec, _ = _node_types(_load(CLUSTER_YAML))
    assert head_spec["resources"]["CPU"] == 0
    assert head_spec["resources"].get("GPU", 0) == 0
    assert RESOURCE not in head_spec["resources"]


def test_gpu_and_preprocess_node_types():
    cfg = _load(CLUSTER_YAML)
    _, _, workers = _node_types(cfg)
    gpu = {k: v for k, v in workers.items() if v["resources"].get("GPU", 0) > 0}
    cpu = {k: v for k, v in workers.items() if v["resources"].get("GPU", 0) == 0}
    assert gpu and cpu
    for name, spec in gpu.items():
        # Trainer nodes must not attract augmentation workers that request the custom resource.
        assert RESOURCE not in spec["resources"], name
    for name, spec in cpu.items():
        amount = spec["resources"].get(RESOURCE)
        assert isinstance(amount, int) and amount >= 1000, name
    for name, spec in workers.items():
        assert 0 <= spec["min_workers"] <= spec["max_workers"], name
    assert cfg["max_workers"] >= sum(s["max_workers"] for s in workers.values())
    assert cfg["idle_timeout_minutes"] > 0 and cfg["upscaling_speed"] > 0
    # The per-worker request raypipe documents is a valid pipeline setting and fits 1000x per node.
    execution = ExecutionConfig(resources={RESOURCE: 0.001})
    assert min(s["resources"][RESOURCE] for s in cpu.values()) / execution.resources[RESOURCE] >= 1000


def _start_args(commands: list[str]) -> list[str]:
    return [tok for cmd in commands for tok in shlex.split(cmd.replace(";", " ; "))]


def test_dashboard_on_loopback_and_token_auth():
    cfg = _load(CLUSTER_YAML)
    head_args = _start_args(cfg["head_start_ray_commands"])
    worker_args = _start_args(cfg["worker_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_args
    assert not any("0.0.0.0" in a for a in head_args + worker_args)
    assert "RAY_AUTH_MODE=token" in head_args and "RAY_AUTH_MODE=token" in worker_args
    # The same token on every node: mounted from the operator's ~/.ray/auth_token.
    assert any(r.endswith("/.ray/auth_token") for r in cfg["file_mounts"])
    # Ray's security group opens only SSH; nothing in the config adds dashboard/GCS ports.
    assert "security_group" not in cfg["provider"]


def test_workers_start_at_normal_priority_and_stay_alive():
    """raypipe.runtime.worker_pool_env's settings, which `ray start` takes from the environment."""
    cfg = _load(CLUSTER_YAML)
    for commands in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        assert "RAY_worker_niceness=0" in _start_args(commands)
    assert any(a.startswith("RAY_num_workers_soft_limit=") for a in _start_args(cfg["worker_start_ray_commands"]))


@pytest.mark.parametrize("path", [RAYCLUSTER, RAYJOB], ids=lambda p: p.name)
def test_kuberay_workers_start_at_normal_priority_and_stay_alive(path):
    spec = _load(path)["spec"]
    groups = (spec.get("rayClusterSpec") or spec)["workerGroupSpecs"]
    for group in groups:
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container.get("env", [])}
        cpus = int(container["resources"]["limits"]["cpu"])
        assert env.get("RAY_worker_niceness") == "0", group["groupName"]
        assert env.get("RAY_num_workers_soft_limit") == str(2 * cpus + 4), group["groupName"]


def _unknown_key(cfg):
    cfg["dashbaord_host"] = "127.0.0.1"


def _min_above_max(cfg):
    cfg["available_node_types"]["preprocess"]["min_workers"] = 5
    cfg["available_node_types"]["preprocess"]["max_workers"] = 2


def _no_head_type(cfg):
    del cfg["head_node_type"]


def _head_type_unknown(cfg):
    cfg["head_node_type"] = "nope"


def _head_has_cpus(cfg):
    cfg["available_node_types"]["head"]["resources"] = {"CPU": 8}


def _fractional_resource(cfg):
    cfg["available_node_types"]["preprocess"]["resources"][RESOURCE] = 0.5


def _unknown_node_type_key(cfg):
    cfg["available_node_types"]["gpu"]["max_worker"] = 3


def _min_workers_over_global_max(cfg):
    cfg["available_node_types"]["preprocess"]["min_workers"] = 10
    cfg["available_node_types"]["preprocess"]["max_workers"] = 10
    cfg["max_workers"] = 4


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (_unknown_key, "dashbaord_host"),
        (_min_above_max, "min_workers=5 > max_workers=2"),
        (_no_head_type, "missing head_node_type"),
        (_head_type_unknown, "'nope'"),
        (_head_has_cpus, "resources.CPU must be 0"),
        (_fractional_resource, "preprocess"),
        (_unknown_node_type_key, "max_worker"),
        (_min_workers_over_global_max, "max_workers"),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
def test_broken_cluster_yaml_fails_clearly(tmp_path, mutate, needle):
    cfg = _load(CLUSTER_YAML)
    mutate(cfg)
    path = _write(tmp_path, cfg)
    with pytest.raises(ValueError) as info:
        validate_cluster_config(path)
    msg = str(info.value)
    assert str(path) in msg and needle in msg, msg


def test_schema_alone_accepts_what_validate_cluster_config_adds():
    """Why validate_cluster_config has checks of its own: Ray's schema lets each of these through."""
    schema = json.loads(ray_schema_path().read_text(encoding="utf-8"))
    for mutate in (_min_above_max, _no_head_type, _head_type_unknown, _head_has_cpus, _min_workers_over_global_max):
        cfg = _load(CLUSTER_YAML)
        mutate(cfg)
        jsonschema.validate(cfg, schema)


def test_unreadable_cluster_yaml(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        validate_cluster_config(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="mapping at the top level"):
        validate_cluster_config(bad)


# --------------------------------------------------------------------------------------------------
# KubeRay


@pytest.mark.parametrize("path", [RAYCLUSTER, RAYJOB], ids=lambda p: p.name)
def test_kuberay_manifests_pass(path):
    docs = check_kuberay_manifest(path)
    assert docs[0]["apiVersion"] == "ray.io/v1"


def test_raycluster_dashboard_is_loopback():
    spec = _load(RAYCLUSTER)["spec"]
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"


def _advertised(group: dict) -> dict:
    """The custom resources a worker group's `ray start` advertises (KubeRay's quoted JSON string)."""
    value = (group.get("rayStartParams") or {}).get("resources", '"{}"')
    return json.loads(value[1:-1].replace("\\", ""))


@pytest.mark.parametrize("path", [RAYCLUSTER, RAYJOB], ids=lambda p: p.name)
def test_kuberay_groups_advertise_the_intended_resources(path):
    """The layout the autoscaler sees: the head no CPU, the GPU group GPUs and no preprocess resource,
    the CPU group the preprocess resource. Read from the manifest as KubeRay hands it to `ray start`;
    Ray's own translation of a RayCluster into autoscaler node types is a private module of Ray's, so
    it is not called here."""
    doc = _load(path)
    spec = doc["spec"].get("rayClusterSpec", doc["spec"])
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    limits = {
        name: g["template"]["spec"]["containers"][0]["resources"].get("limits") or {} for name, g in groups.items()
    }
    assert int(limits["gpu"]["nvidia.com/gpu"]) > 0 and RESOURCE not in _advertised(groups["gpu"])
    assert _advertised(groups["preprocess"]) == {RESOURCE: 1000}
    assert "nvidia.com/gpu" not in limits["preprocess"]


def _rc(doc):
    return doc["spec"].get("rayClusterSpec", doc["spec"])


def _group(doc, name):
    return next(g for g in _rc(doc)["workerGroupSpecs"] if g["groupName"] == name)


KUBERAY_BREAKAGES = {
    "api_version": (lambda d: d.update(apiVersion="ray.io/v1alpha1"), "apiVersion"),
    "no_autoscaling": (lambda d: _rc(d).update(enableInTreeAutoscaling=False), "enableInTreeAutoscaling"),
    "head_cpus": (lambda d: _rc(d)["headGroupSpec"]["rayStartParams"].update({"num-cpus": "4"}), "num-cpus"),
    "head_cpus_missing": (lambda d: _rc(d)["headGroupSpec"]["rayStartParams"].pop("num-cpus"), "num-cpus"),
    "load_balancer": (lambda d: _rc(d)["headGroupSpec"].update(serviceType="LoadBalancer"), "LoadBalancer"),
    "min_above_max": (lambda d: _group(d, "gpu").update(minReplicas=5, maxReplicas=2), "minReplicas=5"),
    "no_max": (lambda d: _group(d, "preprocess").pop("maxReplicas"), "maxReplicas"),
    "no_gpu": (
        lambda d: [
            c["resources"][part].pop("nvidia.com/gpu")
            for c in _group(d, "gpu")["template"]["spec"]["containers"]
            for part in ("limits", "requests")
        ],
        "nvidia.com/gpu",
    ),
    "no_custom_resource": (lambda d: _group(d, "preprocess")["rayStartParams"].pop("resources"), RESOURCE),
    "unquoted_resources": (
        lambda d: _group(d, "preprocess")["rayStartParams"].update(resources='{"preprocess": 1000}'),
        "quoted JSON",
    ),
    "float_resources": (
        lambda d: _group(d, "preprocess")["rayStartParams"].update(resources='"{\\"preprocess\\": 0.5}"'),
        "ints",
    ),
    "no_token_auth": (lambda d: _rc(d).pop("authOptions"), "authOptions"),
    "host_port": (
        lambda d: _rc(d)["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"][0].update(hostPort=8265),
        "hostPort",
    ),
}


@pytest.mark.parametrize("path", [RAYCLUSTER, RAYJOB], ids=lambda p: p.name)
@pytest.mark.parametrize("breakage", sorted(KUBERAY_BREAKAGES))
def test_broken_kuberay_manifest_fails_clearly(tmp_path, path, breakage):
    mutate, needle = KUBERAY_BREAKAGES[breakage]
    doc = copy.deepcopy(_load(path))
    mutate(doc)
    broken = _write(tmp_path, [doc])
    with pytest.raises(ValueError) as info:
        check_kuberay_manifest(broken)
    msg = str(info.value)
    assert str(broken) in msg and needle in msg, msg


def test_raycluster_dashboard_on_all_interfaces_fails(tmp_path):
    doc = _load(RAYCLUSTER)
    doc["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"] = "0.0.0.0"
    with pytest.raises(ValueError, match="dashboard-host must be 127.0.0.1"):
        check_kuberay_manifest(_write(tmp_path, [doc]))
    del doc["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-host"]  # KubeRay's default is 0.0.0.0
    with pytest.raises(ValueError, match="dashboard-host"):
        check_kuberay_manifest(_write(tmp_path, [doc]))


@pytest.mark.parametrize(
    "mutate, needle",
    [
        (lambda s: s.pop("shutdownAfterJobFinishes"), "shutdownAfterJobFinishes"),
        (lambda s: s.update(ttlSecondsAfterFinished="10m"), "ttlSecondsAfterFinished"),
        (lambda s: s.update(entrypoint=""), "entrypoint"),
        (lambda s: s.pop("rayClusterSpec"), "clusterSelector"),
    ],
)
def test_broken_rayjob_fails_clearly(tmp_path, mutate, needle):
    doc = _load(RAYJOB)
    mutate(doc["spec"])
    with pytest.raises(ValueError, match=needle):
        check_kuberay_manifest(_write(tmp_path, [doc]))


def test_rayjob_on_existing_cluster_is_accepted(tmp_path):
    doc = _load(RAYJOB)
    del doc["spec"]["rayClusterSpec"]
    doc["spec"]["clusterSelector"] = {"ray.io/cluster": "raypipe"}
    check_kuberay_manifest(_write(tmp_path, [doc]))


def test_public_service_document_fails(tmp_path):
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "ray-dashboard"},
        "spec": {"type": "NodePort", "ports": [{"port": 8265}]},
    }
    with pytest.raises(ValueError, match="NodePort"):
        check_kuberay_manifest(_write(tmp_path, [_load(RAYCLUSTER), svc]))


def test_manifest_without_ray_documents_fails(tmp_path):
    with pytest.raises(ValueError, match="no RayCluster or RayJob"):
        check_kuberay_manifest(_write(tmp_path, [{"apiVersion": "v1", "kind": "ConfigMap"}]))


# --------------------------------------------------------------------------------------------------
# `raypipe cluster-check`: one line per file, exit 2 when any is invalid


def _cluster_check(capsys, *args: str) -> tuple[int, list[str], list[str]]:
    from raypipe.cli.main import main

    status = main(["cluster-check", *args])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err.splitlines()


def test_cluster_check_passes_the_shipped_definitions_one_line_each(tmp_path, capsys):
    report = tmp_path / "report.json"
    status, out, err = _cluster_check(capsys, str(CLUSTER_YAML), str(RAYCLUSTER), str(RAYJOB), "--json", str(report))
    assert (status, err) == (0, [])
    assert out == [
        f"{CLUSTER_YAML}: ok (Ray cluster launcher config: provider aws, node types head, gpu, preprocess)",
        f"{RAYCLUSTER}: ok (KubeRay manifest: RayCluster raypipe)",
        f"{RAYJOB}: ok (KubeRay manifest: RayJob raypipe-train)",
    ]
    files = json.loads(report.read_text())["files"]
    assert [(f["path"], f["kind"], f["ok"]) for f in files] == [
        (str(CLUSTER_YAML), "Ray cluster launcher config", True),
        (str(RAYCLUSTER), "KubeRay manifest", True),
        (str(RAYJOB), "KubeRay manifest", True),
    ]


def test_cluster_check_reads_cluster_yaml_here_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status, out, err = _cluster_check(capsys)
    assert status == 2 and out == [] and len(err) == 1
    assert err[0].startswith("raypipe cluster-check: error: no cluster.yaml in ") and "name the file" in err[0]

    (tmp_path / "cluster.yaml").write_text(CLUSTER_YAML.read_text(encoding="utf-8"), encoding="utf-8")
    status, out, err = _cluster_check(capsys)
    assert (status, err) == (0, []) and len(out) == 1 and out[0].startswith("cluster.yaml: ok (Ray cluster launcher")


def test_cluster_check_names_each_invalid_file_in_one_line_and_exits_2(tmp_path, capsys):
    cluster = _load(CLUSTER_YAML)
    _head_has_cpus(cluster)
    bad_cluster = _write(tmp_path, cluster, "cluster.yaml")
    manifest = copy.deepcopy(_load(RAYCLUSTER))
    _rc(manifest).pop("authOptions")
    bad_manifest = _write(tmp_path, [manifest], "raycluster.yaml")  # a KubeRay manifest by its kind, whatever its name
    unparsable = tmp_path / "torn.yaml"
    unparsable.write_text("provider: {type: aws\nhead_node_type: [\n", encoding="utf-8")
    report = tmp_path / "report.json"
    args = [str(bad_cluster), str(RAYJOB), str(bad_manifest), str(unparsable), "--json", str(report)]
    status, out, err = _cluster_check(capsys, *args)
    assert status == 2
    assert out == [f"{RAYJOB}: ok (KubeRay manifest: RayJob raypipe-train)"]  # the good file is still reported
    assert len(err) == 3 and all(line.startswith("raypipe cluster-check: error: ") for line in err), err
    assert str(bad_cluster) in err[0] and "CPU must be 0" in err[0]
    assert str(bad_manifest) in err[1] and "authOptions.mode must be 'token'" in err[1]
    assert str(unparsable) in err[2] and "not valid YAML" in err[2]
    files = json.loads(report.read_text())
    assert files["ok"] is False and [f["ok"] for f in files["files"]] == [False, True, False, False]


def test_cluster_check_runs_as_a_command():
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "raypipe", "cluster-check"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("cluster.yaml: ok"), proc.stdout + proc.stderr
