"""The two charts of a whole-model run (matplotlib, PNG beside the JSON):

- <stem>-speedup.png: each mode's speed against Inductor (Inductor's wall time over the
  mode's), per model, inference and training side by side;
- <stem>-breakdown.png: GPU time per step by kernel class, Inductor and fuseml for each model.

    python3 model_charts.py RESULTS.json"""

import json
import sys

import kernel_classes
import model_report as report

SHOWN = ("eager", "inductor_graphs", "fuseml", "fuseml_graphs", "fuseml_inductor")
COLOURS = {
    "eager": "#9e9e9e",
    "inductor_graphs": "#6a8caf",
    "fuseml": "#d9534f",
    "fuseml_graphs": "#f0ad4e",
    "fuseml_inductor": "#5cb85c",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def speedup(doc, path):
    plt = _plt()
    models = report.model_sizes(doc["rows"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), sharey=True)
    width = 0.8 / len(SHOWN)
    for ax, phase in zip(axes, ("fwd", "train")):
        for i, mode in enumerate(SHOWN):
            vals = []
            for model, size in models:
                ind = report._cell(doc["rows"], model, size, "inductor", phase)
                m = report._cell(doc["rows"], model, size, mode, phase)
                ok = ind and m and "error" not in ind and "error" not in m and m.get("wall_ms")
                vals.append(ind["wall_ms"] / m["wall_ms"] if ok else 0.0)
            xs = [j + (i - (len(SHOWN) - 1) / 2) * width for j in range(len(models))]
            ax.bar(xs, vals, width, label=mode, color=COLOURS[mode])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels([f"{m}\n{s}" for m, s in models], fontsize=8)
        ax.set_title("inference" if phase == "fwd" else "training step (fwd + bwd)")
    axes[0].set_ylabel("speed vs Inductor (wall time; > 1 is faster)")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"Whole models, bf16, {doc['device']} {doc['date']}: against torch.compile's Inductor")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def breakdown(doc, path, modes=("inductor", "fuseml")):
    plt = _plt()
    names = list(doc["models"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.5 + 0.55 * len(names) * len(modes)))
    cmap = plt.get_cmap("tab10")
    for ax, phase in zip(axes, ("fwd", "train")):
        labels, y = [], 0
        for name in names:
            for mode in modes:
                b = doc["models"][name]["breakdown"].get(mode, {}).get(phase)
                left = 0.0
                for ci, cls in enumerate(kernel_classes.ORDER):
                    v = (b or {}).get("breakdown_ms", {}).get(cls, 0.0)
                    ax.barh(y, v, left=left, color=cmap(ci), label=cls if y == 0 else None)
                    left += v
                labels.append(f"{name} {mode}")
                y += 1
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GPU ms per step")
        ax.set_title("inference" if phase == "fwd" else "training step")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"GPU time by kernel class, {doc['device']} {doc['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(doc, stem):
    speedup(doc, stem + "-speedup.png")
    breakdown(doc, stem + "-breakdown.png")


if __name__ == "__main__":
    path = sys.argv[1]
    draw(json.load(open(path)), path[:-5] if path.endswith(".json") else path)
