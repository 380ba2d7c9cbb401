"""Tables, ratios and the bar chart for ``raypipe bench``."""

from __future__ import annotations

from raypipe.benchmark.measure import Result

__all__ = ["best_timm", "ratios", "format_table", "plot", "caption", "machine"]


def best_timm(results: dict[str, Result]) -> Result | None:
    """timm at its fastest of the settings tried."""
    timm = [r for n, r in results.items() if n.startswith("timm")]
    return max(timm, key=lambda r: r.images_per_s, default=None)


def ratios(results: dict[str, Result]) -> dict[str, float | None]:
    """raypipe over timm's fastest setting, naive Ray Data, raypipe on Ray Data, DALI's CPU pipeline, SPDL
    and the decode limit (trainer view), the same with steady-state rates, and raypipe's cold first batch
    over timm's."""
    ours, timm = results.get("raypipe"), best_timm(results)
    others = {
        "timm": timm,
        "naive_ray_data": results.get("naive Ray Data"),
        "raypipe_on_ray_data": results.get("raypipe on Ray Data"),
        "dali_cpu": results.get("DALI (CPU)"),
        "spdl": results.get("SPDL"),
        "decode_limit": results.get("decode limit"),
    }

    def r(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    out = {f"raypipe/{k}": r(ours and ours.images_per_s, v and v.images_per_s) for k, v in others.items()}
    out["steady raypipe/timm"] = r(ours and ours.steady_per_s, timm and timm.steady_per_s)
    out["first_batch raypipe/timm"] = r(ours and ours.first_batch_s, timm and timm.first_batch_s)
    return out


def format_table(title: str, results: dict[str, Result]) -> str:
    head = (
        f"{'loader':<18} {'img/s':>7} {'CPU ms/img':>10} {'median':>7} {'spread':>6} {'steady':>7} "
        f"{'1st batch s':>11} {'epoch start s':>13} {'driver MB':>9} {'workers MB':>10} "
        f"{'store MB':>8}"
    )
    lines = [title, head, "-" * len(head)]
    for res in results.values():
        if res.skipped:
            lines.append(f"{res.name:<18} {'-':>7} {'-':>10}  {res.skipped.split(':')[0]}")
            continue
        store = "-" if res.peak_object_store_mb is None else f"{res.peak_object_store_mb:.0f}"
        first = f"{res.first_batch_s:.2f}" if res.first_batch_s else "-"
        start = f"{res.epoch_start_s:.2f}" if res.epoch_start_s else "-"
        steady = f"{res.steady_per_s:.0f}" if res.steady_per_s else "-"
        spread = f"{100 * res.spread:.0f} %" if len(res.epoch_rates) > 1 else "-"
        rss = f"{res.peak_rss_mb:.0f}" if res.peak_rss_mb else "-"
        kids = f"{res.peak_children_rss_mb:.0f}" if res.peak_children_rss_mb else "-"
        cpu = f"{res.cpu_ms_per_image:.2f}" if res.cpu_ms_per_image else "-"
        lines.append(
            f"{res.name:<18} {res.images_per_s:>7.0f} {cpu:>10} {res.median_rate:>7.0f} {spread:>6} "
            f"{steady:>7} {first:>11} {start:>13} {rss:>9} {kids:>10} {store:>8}"
        )
    lines.append(
        "img/s: the epochs after the first, each from the start of its loop to its last batch; CPU ms/img: "
        "the machine's busy CPU over those epochs per image (one process's for the decode limit and the "
        "kernel); median: of those epochs' rates; spread: (fastest - slowest) / median; steady: without "
        "each epoch's wait for its first batch; 1st batch: from the loader's start (its Ray, its "
        "workers)"
    )
    for res in results.values():
        if res.skipped:
            lines.append(f"  {res.name}: {res.skipped}")
        elif res.differs:
            lines.append(f"  {res.name}, where its images differ from raypipe's: {res.differs}")
    for k, v in ratios(results).items():
        lines.append(f"  {k}: {'-' if v is None else f'{v:.2f}x'}")
    return "\n".join(lines)


def machine() -> str:
    """'2 cores, Intel(R) Xeon(R) …, 24 GiB, Linux x86_64': what a figure was measured on."""
    import os
    import platform

    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    return f"{os.cpu_count()} cores, {cpu}, {mem:.0f} GiB, {platform.system()} {platform.machine()}"


def caption(*, data: str, images: int, batch_size: int, epochs: int, host: str) -> str:
    """The plot's caption: the machine, the data and how the figures were taken."""
    timed = f"{epochs - 1} epochs after a warm-up epoch" if epochs > 1 else "1 epoch"
    return (
        f"{host}. Data: {data} ({images} images), batch {batch_size}, {timed}, each from the start of its "
        "loop to its last batch; bars: images/s over those epochs, whiskers: the slowest and fastest "
        "epoch."
    )


def plot(path: str, suites: dict[str, dict[str, Result]], caption_text: str = "") -> None:
    """One bar chart per suite (its title names the augmentation): every contender's rate, with the
    spread of its epochs and its CPU per image, a row without a figure with why, and ``caption_text``
    below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(suites), figsize=(6.5 * len(suites), 4.6), squeeze=False)
    for ax, (title, results) in zip(axes[0], suites.items(), strict=True):
        names = list(results)
        values = [results[n].images_per_s for n in names]
        # the whiskers reach the slowest and fastest epoch (an aggregate over epochs lies between them,
        # or at one end when a contender reports a single rate)
        low = [max(0.0, v - min(results[n].epoch_rates, default=v)) for n, v in zip(names, values, strict=True)]
        high = [max(0.0, max(results[n].epoch_rates, default=v) - v) for n, v in zip(names, values, strict=True)]
        colors = ["tab:blue" if n.startswith("raypipe") else "tab:gray" for n in names]
        ax.barh(names, values, color=colors, xerr=[low, high], capsize=3)
        ax.invert_yaxis()
        ends = [v + h for v, h in zip(values, high, strict=True)]
        ax.set_xlim(0, 1.5 * max([*ends, 1.0]))  # room for the text beside the longest bar
        ax.set_xlabel("images / s")
        ax.set_title(f"augmentation: {title}")
        for y, n in enumerate(names):
            # a row without a figure says why in a word: "not installed", "not run"
            r = results[n]
            text = r.skipped.split(":")[0] if r.skipped else f"{values[y]:.0f}"
            if r.cpu_ms_per_image and not r.skipped:
                text += f" ({r.cpu_ms_per_image:.2f} CPU ms/image)"
            ax.text(values[y], y, f" {text}", va="bottom", fontsize=8)
    if caption_text:
        fig.text(0.01, 0.01, caption_text, fontsize=8, wrap=True, va="bottom")
    fig.tight_layout(rect=(0, 0.08 if caption_text else 0, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
