"""The paths a trainer's batches can take, in one run: local workers, Ray on one node (the README's API),
Ray tasks across simulated nodes, node workers (the default there) across the same nodes, and timm's
loader, on the same images, each in a fresh process, in turn::

    python bench/photolike.py /tmp/photo4k --classes 8 --per-class 500
    python bench/cluster_paths.py /tmp/photo4k --rounds 2 --timm-workers 2 4

Every path is a trainer reading fp32 batches through ``DeviceLoader`` on the CPU, RandomResizedCrop
224 + flip, batch 128 (``raypipe.benchmark.paths``). Per path: the median round's images/s over the
measured epochs (after one unmeasured epoch), the machine's CPU per image and how busy its cores were
(``/proc/stat``), the ratio to the local path of the same round, and where the CPU went by the role of
each process (trainer, feeder, augmentation workers, Ray's daemons, other: whatever else ran).

``--compression`` prints what compressing a chunk's images losslessly for the network would cost (bytes
and CPU per image). ``--scaling 1 2 4 --node-cpus 3`` runs a cross-node path alone (``--scaling-path``:
``ray-nodes``, Ray tasks, or ``nodes``, node workers) with each number of CPU nodes, and prints the
images/s per augmentation CPU against one node's (the device machine's 16 cores: ``bench/gpu_session.sh``'s
``scaling`` and ``scaling_nodes`` steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RESULT = "RESULT "  # the line a measuring process prints its figures on


def _one(a: argparse.Namespace) -> None:
    from raypipe.benchmark.paths import run_path, run_timm

    common = dict(epochs=a.epochs, batch_size=a.batch_size, img_size=a.img_size)
    if a.one.startswith("timm-"):
        r = run_timm(a.data, workers=int(a.one.split("-")[1]), **common)
    else:
        path, _, nodes = a.one.partition(":")
        r = run_path(
            path,
            a.data,
            nodes=int(nodes or a.nodes),
            node_cpus=a.node_cpus,
            chunk_rows=a.chunk_rows,
            ray_tasks=a.ray_tasks,
            **common,
        )
    print(RESULT + json.dumps(r.as_dict()), flush=True)


def _measure(a: argparse.Namespace, what: str) -> dict:
    cmd = (
        [
            sys.executable,
            str(Path(__file__).resolve()),
            a.data,
            "--one",
            what,
            "--epochs",
            str(a.epochs),
            "-b",
            str(a.batch_size),
            "--img-size",
            str(a.img_size),
            "--nodes",
            str(a.nodes),
            "--node-cpus",
            str(a.node_cpus),
        ]
        + (["--chunk-rows", str(a.chunk_rows)] if a.chunk_rows else [])
        + (["--ray-tasks"] if a.ray_tasks else [])
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]
    if out.returncode or not lines:
        raise SystemExit(f"{what} failed (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    r = json.loads(lines[-1][len(RESULT) :])
    print(
        f"  {what}: {r['images_per_s']:.0f} img/s, {r['cpu_ms_per_image']:.2f} ms CPU per image, machine "
        f"{100 * r['busy']:.0f} % busy",
        flush=True,
    )
    return r


def _median_round(runs: list[dict]) -> dict:
    """The middle round by images/s (of an even count, the slower of the two middle ones)."""
    return sorted(runs, key=lambda r: r["images_per_s"])[(len(runs) - 1) // 2]


def _paths_table(rounds: list[dict[str, dict]]) -> str:
    names = list(rounds[0])
    roles = sorted({k for rnd in rounds for r in rnd.values() for k in r["roles_ms_per_image"]})
    head = (
        "| path | img/s | x local (rounds) | CPU per image | x local | machine busy | "
        + " | ".join(f"{role} ms" for role in roles)
        + " |"
    )
    rows = [head, "|" + "---|" * (6 + len(roles))]
    for name in names:
        runs = [rnd[name] for rnd in rounds]
        med = _median_round(runs)
        speed = [rnd[name]["images_per_s"] / rnd["local"]["images_per_s"] for rnd in rounds] if "local" in names else []
        cpu = (
            [rnd[name]["cpu_ms_per_image"] / rnd["local"]["cpu_ms_per_image"] for rnd in rounds]
            if "local" in names
            else []
        )
        ratio = f"{statistics.median(speed):.2f} ({', '.join(f'{x:.2f}' for x in speed)})" if speed else ""
        cpu_ratio = f"{statistics.median(cpu):.2f}" if cpu else ""
        rows.append(
            f"| {name} | {med['images_per_s']:.0f} | {ratio} | {med['cpu_ms_per_image']:.2f} ms | "
            f"{cpu_ratio} | {100 * med['busy']:.0f} % | "
            + " | ".join(f"{med['roles_ms_per_image'].get(role, 0.0):.2f}" for role in roles)
            + " |"
        )
    return "\n".join(rows)


def _scaling_table(results: dict[int, dict], node_cpus: int) -> str:
    base = results[min(results)]
    per_cpu_base = base["images_per_s"] / (min(results) * node_cpus)
    rows = [
        "| CPU nodes | augmentation CPUs | img/s | img/s per CPU | x fewest nodes' | machine busy |",
        "|---|---|---|---|---|---|",
    ]
    for n, r in sorted(results.items()):
        per_cpu = r["images_per_s"] / (n * node_cpus)
        rows.append(
            f"| {n} | {n * node_cpus} | {r['images_per_s']:.0f} | {per_cpu:.0f} | "
            f"{per_cpu / per_cpu_base:.2f} | {100 * r['busy']:.0f} % |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a folder of images (timm's loader reads it too)")
    p.add_argument("--epochs", type=int, default=4, help="measured epochs, after an unmeasured one")
    p.add_argument("-b", "--batch-size", type=int, default=128)
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--chunk-rows", type=int, help="ExecutionConfig.chunk_rows of the raypipe paths (default: auto)")
    p.add_argument(
        "--ray-tasks",
        action="store_true",
        help="ray-node's augmentation as Ray tasks (backend='ray', as a rank on a cluster it joined), "
        "not the private local Ray's local worker processes",
    )
    p.add_argument("--rounds", type=int, default=2, help="each path this many times, in turn")
    p.add_argument("--paths", nargs="+", default=["local", "ray-node", "ray-nodes", "nodes"])
    p.add_argument("--timm-workers", type=int, nargs="*", default=[], help="also timm's loader with N workers")
    p.add_argument("--nodes", type=int, default=1, help="CPU nodes of the ray-nodes path")
    p.add_argument("--node-cpus", type=int, default=2, help="CPUs of each simulated CPU node")
    p.add_argument("--scaling", type=int, nargs="*", help="run a cross-node path alone with each of these node counts")
    p.add_argument(
        "--scaling-path",
        choices=["ray-nodes", "nodes"],
        default="ray-nodes",
        help="the path --scaling runs: Ray tasks, or node workers (backend='nodes')",
    )
    p.add_argument(
        "--compression", action="store_true", help="only what compressing a chunk's images for the network would cost"
    )
    p.add_argument("--timeout", type=float, default=900, help="seconds one measuring process may take")
    p.add_argument("--json", help="write every round's figures here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # a measuring process: one path, a RESULT line
    a = p.parse_args()
    if a.one:
        return _one(a)

    if a.compression:
        from raypipe.benchmark.paths import compression_cost

        figures: object = compression_cost(a.data, img_size=a.img_size, batch_size=a.batch_size)
        for name, r in figures.items():
            print(
                f"{name}: {r['ratio']:.3f} of the bytes, {r['compress_ms_per_image']:.2f} ms per image to compress, "
                f"{r['decompress_ms_per_image']:.2f} ms to decompress"
            )
    elif a.scaling:
        results = {n: _measure(a, f"{a.scaling_path}:{n}") for n in a.scaling}
        print(_scaling_table(results, a.node_cpus))
        figures = results
    else:
        names = a.paths + [f"timm-{w}" for w in a.timm_workers]
        rounds = []
        for i in range(a.rounds):
            print(f"round {i + 1}/{a.rounds}", flush=True)
            rounds.append({name: _measure(a, name) for name in names})
        print(_paths_table(rounds))
        figures = rounds
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
