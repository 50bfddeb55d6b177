"""PNG charts of a table run (matplotlib; runs anywhere, no GPU):

    python3 bench/table/charts.py bench/results/nvidia-h200-2026-11-22.json [--out DIR]

writes <stem>-speedup.png (fuseml's speedup per workload and preset, against eager and
against the best peer), <stem>-hbm.png (analytical HBM bytes per step, eager vs fused) and
<stem>-compile.png (fuseml compile time, cold vs warm cache). Empty cells are left out."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
import workloads as W  # noqa: E402


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(rows):
    """Device, the dates the rows were measured on (a merged table spans runs), torch."""
    r = rows[0]
    dates = sorted({x.get("date") for x in rows if x.get("date")})
    when = dates[0] if len(dates) <= 1 else f"{dates[0]} to {dates[-1]}"
    return f"{r.get('device_name', r.get('device'))}, {when}, bf16, torch {r.get('torch')}"


def _grouped(ax, labels, series, ylabel, log=False, hline=None):
    """Bars: one group per label, one bar per series (name, values; None = no bar)."""
    n = len(series)
    width = 0.8 / max(n, 1)
    for i, (name, vals) in enumerate(series):
        xs = [j + (i - (n - 1) / 2) * width for j, v in enumerate(vals) if v is not None]
        ys = [v for v in vals if v is not None]
        bars = ax.bar(xs, ys, width, label=name)
        if hline is not None:
            for b, y in zip(bars, ys):
                ax.annotate(f"{y:.2f}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    if hline is not None:
        ax.axhline(hline, color="k", linewidth=0.8, linestyle="--")
    ax.legend(fontsize=7)


def speedup(rows, path):
    plt = _plt()
    wls = [w for w in W.WORKLOADS if any(r["workload"] == w for r in rows)]
    fig, axes = plt.subplots(len(wls), 1, figsize=(8, 2.6 * len(wls)), squeeze=False)
    for ax, w in zip(axes[:, 0], wls):
        rs = [r for r in rows if r["workload"] == w]
        _grouped(
            ax,
            [r["preset"] for r in rs],
            [
                ("vs eager", [r.get("speedup_vs_eager") for r in rs]),
                ("vs best peer", [r.get("speedup_vs_best_peer") for r in rs]),
            ]
            + (
                [("vs Inductor with CUDA graphs", [r.get("speedup_vs_inductor_cudagraphs") for r in rs])]
                if any(r.get("speedup_vs_inductor_cudagraphs") for r in rs)
                else []
            ),
            "speedup (x)",
            hline=1.0,
        )
        ax.set_title(W.LABELS.get(w, w), fontsize=9)
    fig.suptitle("fuseml speedup: " + _title(rows), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _labels(rows):
    return [f"{r['workload']}/{r['preset']}" for r in rows]


def hbm(rows, path):
    plt = _plt()
    rows = [r for r in rows if r.get("hbm_bytes_eager") is not None]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
    _grouped(
        ax,
        _labels(rows),
        [
            ("eager", [r["hbm_bytes_eager"] / 1e6 for r in rows]),
            (
                "fused (fuseml groups)",
                [r["hbm_bytes_fused"] / 1e6 if r.get("hbm_bytes_fused") is not None else None for r in rows],
            ),
            ("floor (inputs + outputs once)", [r["floor_bytes"] / 1e6 if r.get("floor_bytes") else None for r in rows]),
        ],
        "MB per step (analytical)",
        log=True,
    )
    ax.set_title("HBM traffic per step\n" + _title(rows) if rows else "no HBM figures", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def compile_time(rows, path):
    plt = _plt()
    rows = [r for r in rows if r.get("compile_cold_s") is not None or r.get("compile_warm_s") is not None]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(rows) + 2), 4))
    _grouped(
        ax,
        _labels(rows),
        [
            ("cold (empty fusemld cache)", [r.get("compile_cold_s") for r in rows]),
            ("warm (second process, filled cache)", [r.get("compile_warm_s") for r in rows]),
        ],
        "seconds to the first step's end",
    )
    ax.set_title("fuseml compile time\n" + _title(rows) if rows else "no compile times", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="table JSON file(s); rows merged")
    ap.add_argument("--out", help="folder for the PNGs (default: beside the first JSON)")
    args = ap.parse_args(argv)
    rows = report.merge([report.load(p) for p in args.json])
    if not rows:
        sys.exit("no rows")
    stem = os.path.splitext(os.path.basename(args.json[0]))[0]
    out = args.out or os.path.dirname(os.path.abspath(args.json[0]))
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, f"{stem}-{k}.png") for k in ("speedup", "hbm", "compile")]
    speedup(rows, paths[0])
    hbm(rows, paths[1])
    compile_time(rows, paths[2])
    print("wrote " + " ".join(paths))
    return paths


if __name__ == "__main__":
    main()
