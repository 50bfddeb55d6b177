"""Merge whole-model results, write them as JSON and Markdown, draw the charts.

The Markdown has, per phase, fuseml against Inductor (GPU time and wall time) for each model;
every cell's figures; the GPU-time breakdown by kernel class, fuseml beside Inductor; and the
ATen ops that ran unfused under fuseml, costliest first (what the coverage work reads)."""

import collections
import json
import os

KEY = ("model", "size", "mode", "phase")
FIGURES = (
    "wall_ms",
    "gpu_ms",
    "kernels",
    "peak_mem_gb",
    "compile_cold_s",
    "compile_warm_s",
    "rel_err",
    "eager_bf16_rel_err",
)


def device_slug(dev=None):
    """The device part of a result's file name: "nvidia-h200", "nvidia-h100", or "cpu"."""
    import torch

    if dev is None:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type != "cuda":
        return "cpu"
    return "-".join(torch.cuda.get_device_name(dev).lower().replace("_", " ").split()[:2])


def merge(docs):
    """One document from several: rows keyed by model, size, mode and phase (a later one
    replaces an earlier one), the per-model breakdowns likewise; device, date and torch from
    the last document that has them."""
    rows, models, head = {}, {}, {}
    for d in docs:
        for k in ("device", "date", "torch"):
            if d.get(k):
                head[k] = d[k]
        for r in d.get("rows", []):
            rows[tuple(r[k] for k in KEY)] = r
        for name, m in d.get("models", {}).items():
            models.setdefault(name, {"describe": m.get("describe"), "breakdown": {}})
            models[name]["describe"] = m.get("describe") or models[name]["describe"]
            for mode, phases in m.get("breakdown", {}).items():
                models[name]["breakdown"].setdefault(mode, {}).update(phases)
    return {
        "device": head.get("device", "unknown"),
        "date": head.get("date", ""),
        "torch": head.get("torch", ""),
        "rows": list(rows.values()),
        "models": models,
    }


def _cell(rows, model, size, mode, phase):
    for r in rows:
        if (r["model"], r["size"], r["mode"], r["phase"]) == (model, size, mode, phase):
            return r
    return None


def _fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        if v != 0 and abs(v) < 10**-digits:
            return f"{v:.1e}"
        return f"{v:.{digits}f}"
    return str(v)


def _ratio(a, b):
    if not a or not b or "error" in a or "error" in b:
        return None
    return a, b


def model_sizes(rows):
    seen = []
    for r in rows:
        if (r["model"], r["size"]) not in seen:
            seen.append((r["model"], r["size"]))
    return seen


def ratio_table(doc, phase):
    """fuseml's GPU time and wall time over Inductor's, per model, for one phase; the graph
    modes against each other beside them; eager's wall over fuseml's."""
    rows = doc["rows"]
    out = [
        "| model | fuseml / Inductor GPU time | fuseml / Inductor wall | fuseml_graphs / inductor_graphs wall "
        "| fuseml_inductor / Inductor wall | eager / fuseml wall |",
        "|---|---|---|---|---|---|",
    ]
    for model, size in model_sizes(rows):
        c = {
            m: _cell(rows, model, size, m, phase)
            for m in ("eager", "inductor", "inductor_graphs", "fuseml", "fuseml_graphs", "fuseml_inductor")
        }

        def q(a, b, key):
            pair = _ratio(c[a], c[b])
            if not pair or not pair[0].get(key) or not pair[1].get(key):
                return "-" if not (c[a] and "error" in c[a]) else "error"
            return f"{pair[0][key] / pair[1][key]:.2f}"

        out.append(
            f"| {model}/{size} | {q('fuseml', 'inductor', 'gpu_ms')} | {q('fuseml', 'inductor', 'wall_ms')} | "
            f"{q('fuseml_graphs', 'inductor_graphs', 'wall_ms')} | {q('fuseml_inductor', 'inductor', 'wall_ms')} | "
            f"{q('eager', 'fuseml', 'wall_ms')} |"
        )
    return "\n".join(out)


def cell_table(doc):
    out = [
        "| model | phase | mode | wall ms | GPU ms | kernels | peak GB | first calls' peak GB | cold s | warm s | rel err "
        "| eager bf16 err |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, size in model_sizes(doc["rows"]):
        for phase in ("fwd", "train"):
            for r in doc["rows"]:
                if (r["model"], r["size"], r["phase"]) != (model, size, phase):
                    continue
                if "error" in r:
                    out.append(
                        f"| {model}/{size} | {phase} | {r['mode']} | error: "
                        f"{r['error'][:140].replace('|', '/').replace(chr(10), ' ')} | | | | | | | | |"
                    )
                    continue
                # measured before every background tune arrived: not the steady state
                left = r.get("untuned_left") or 0
                mode = f"{r['mode']} ({left} kernels untuned)" if left else r["mode"]
                out.append(
                    f"| {model}/{size} | {phase} | {mode} | {_fmt(r['wall_ms'])} | {_fmt(r['gpu_ms'])} | "
                    f"{_fmt(r['kernels'], 0)} | {_fmt(r['peak_mem_gb'])} | {_fmt(r.get('first_call_peak_gb'))} | "
                    f"{_fmt(r['compile_cold_s'], 1)} | "
                    f"{_fmt(r['compile_warm_s'], 1)} | {_fmt(r['rel_err'], 4)} | {_fmt(r['eager_bf16_rel_err'], 4)} |"
                )
    return "\n".join(out)


def breakdown_table(doc, phase, modes=("inductor", "fuseml")):
    """GPU ms per step by kernel class, fuseml beside Inductor, per model."""
    import kernel_classes

    classes = kernel_classes.ORDER
    head = "| model | mode | " + " | ".join(classes) + " | total |"
    out = [head, "|" + "---|" * (len(classes) + 3)]
    for name, m in doc["models"].items():
        for mode in modes:
            b = m["breakdown"].get(mode, {}).get(phase)
            if not b or b.get("gpu_ms") is None:
                continue
            cells = " | ".join(_fmt(b["breakdown_ms"].get(c)) for c in classes)
            out.append(f"| {name} | {mode} | {cells} | {_fmt(b['gpu_ms'])} |")
    return "\n".join(out)


def unfused_ops(doc, mode="fuseml"):
    """The ATen ops that ran under `mode` with their own GPU time, summed over every model and
    phase (ms per step), costliest first: [(op, ms, calls, [models])]."""
    total = collections.defaultdict(lambda: [0.0, 0.0, set()])
    for name, m in doc["models"].items():
        for phase, b in m["breakdown"].get(mode, {}).items():
            for o in b.get("aten_ops", []):
                t = total[o["op"]]
                t[0] += o["ms"]
                t[1] += o["calls"]
                t[2].add(f"{name} {phase}")
    return sorted(((op, ms, calls, sorted(where)) for op, (ms, calls, where) in total.items()), key=lambda x: -x[1])


def unfused_table(doc, top=20):
    out = [
        "| ATen op under fuseml | ms per step (sum over models and phases) | calls per step | where |",
        "|---|---|---|---|",
    ]
    for op, ms, calls, where in unfused_ops(doc)[:top]:
        shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        out.append(f"| `{op}` | {ms:.3f} | {calls:.0f} | {shown} |")
    return "\n".join(out)


def markdown(doc):
    parts = [
        f"# Whole models: {doc['device']}, {doc['date']} (torch {doc['torch']})",
        "",
        "Ratios below 1 favour fuseml in the first four columns; above 1 in the last. GPU time is the sum "
        "of kernel, memcpy and memset time from the profiler (host excluded); wall time is the median of "
        "interleaved samples. A training step is loss forward + backward (no optimizer step). Method: "
        "bench/models/README.md.",
        "",
    ]
    for phase, title in (("fwd", "Inference (forward under no_grad)"), ("train", "Training step")):
        parts += [f"## {title}: fuseml against Inductor", "", ratio_table(doc, phase), ""]
    parts += ["## Every cell", "", cell_table(doc), ""]
    for phase in ("fwd", "train"):
        parts += [f"## GPU time by kernel class, {phase} (ms per step)", "", breakdown_table(doc, phase), ""]
    parts += ["## ATen ops that ran unfused under fuseml (own GPU time)", "", unfused_table(doc), ""]
    errors = [r for r in doc["rows"] if "error" in r]
    if errors:
        parts += ["## Cells that failed", ""]
        parts += [
            f"- {r['model']}/{r['size']} {r['mode']} {r['phase']}: {' '.join(r['error'].split())[:300]}" for r in errors
        ]
        parts.append("")
    return "\n".join(parts)


def write(doc, out_dir, charts=True):
    """<device>-<date>.json and .md in out_dir; the charts beside them when matplotlib is there."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{doc['device']}-{doc['date']}")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    if charts:
        try:
            import model_charts as charts_mod
        except ImportError:  # matplotlib missing: the JSON and .md are the result
            return stem
        charts_mod.draw(doc, stem)
    return stem
