"""The table's files: merging rows into bench/results/<device>-<date>.json (a list of rows,
one per device x workload x preset; a newer row replaces an older one) and the Markdown
table written beside it, with a closing list of the rows where fuseml loses."""

import json
import os

import workloads as W

COLUMNS = [
    ("eager", "Eager"),
    ("inductor", "Inductor"),
    ("inductor_max_autotune", "Inductor MA"),
    ("inductor_cudagraphs", "Inductor RO"),
    ("fuseml_nographs", "fuseml, no graphs"),
    ("fuseml", "fuseml"),
]


def _key(r):
    return (r.get("device"), r.get("workload"), r.get("preset"))


def _order(r):
    w = r.get("workload")
    p = r.get("preset")
    return (
        r.get("device") or "",
        W.WORKLOADS.index(w) if w in W.WORKLOADS else 99,
        list(W.PRESETS).index(p) if p in W.PRESETS else 99,
    )


NOT_MEASURED = "not measured (--no-compile-time)"


def merge(rows_lists):
    """Rows of several runs as one list: the last row for each (device, workload, preset).
    A row timed with --no-compile-time keeps the compile times of the row it replaces, with
    a note saying they come from that earlier run."""
    by = {}
    for rows in rows_lists:
        for r in rows:
            prev = by.get(_key(r))
            notes = r.get("notes") or {}
            if (
                prev
                and notes.get("compile_time") == NOT_MEASURED
                and (prev.get("compile_cold_s") is not None or prev.get("compile_warm_s") is not None)
            ):
                r = dict(r, compile_cold_s=prev.get("compile_cold_s"), compile_warm_s=prev.get("compile_warm_s"))
                r["notes"] = dict(
                    notes,
                    compile_time=(
                        f"from an earlier run of this row ({prev.get('date')}; this one ran with " "--no-compile-time)"
                    ),
                )
            by[_key(r)] = r
    return sorted(by.values(), key=_order)


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, list) else data.get("rows", [])


def save(rows, json_path):
    tmp = json_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, json_path)
    with open(os.path.splitext(json_path)[0] + ".md", "w") as f:
        f.write(markdown(rows))


def _ms(v):
    if v is None:
        return "—"
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def _x(v):
    return "—" if v is None else f"{v:.2f}x"


def _mb(v):
    return "—" if v is None else f"{v / 1e6:,.1f}"


def _n(v):
    return "—" if v is None else (f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}")


def _s(v):
    return "—" if v is None else f"{v:.1f}"


def markdown(rows):
    out = []
    devices = sorted({r.get("device_name") or r.get("device") for r in rows})
    for dev in devices:
        rs = [r for r in rows if (r.get("device_name") or r.get("device")) == dev]
        r0 = rs[0]
        c = r0.get("ceilings") or {}
        dates = sorted({r.get("date") for r in rs if r.get("date")})
        out.append(f"# fuseml benchmark table: {dev}, {', '.join(dates)}\n")
        out.append(
            f"bf16; torch {r0.get('torch')}; ceilings measured in the same run: copy "
            f"{c.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s, bf16 GEMM "
            f"{c.get('bf16_gemm_flops_per_s', 0) / 1e12:.0f} TFLOP/s. Times are medians "
            "(ms per step) of interleaved, order-rotated repetitions in one process; "
            "speedups are fuseml against eager and against the best of eager, Inductor "
            "and Inductor max-autotune-no-cudagraphs (MA). HBM: analytical model, MB per "
            "step. Compile: fuseml, seconds, cold (empty fusemld cache) / warm (a second "
            "process on the filled cache).\n"
        )
        if any(r.get("fuseml_cudagraphs") for r in rs):
            out.append(
                "fuseml runs with CUDA graphs (`mode=\"reduce-overhead\"`); the three "
                "peers do not. So that the graphs are not mistaken for fusion, two more "
                "columns were timed in the same run: Inductor with CUDA graphs "
                "(`mode=\"reduce-overhead\"`, RO; \"vs RO\" is fuseml against it) and "
                "fuseml without graphs.\n"
            )
            plain = [f"{r['workload']}/{r['preset']}" for r in rs if not r.get("fuseml_cudagraphs")]
            if plain:
                out.append(
                    "Rows whose fuseml column ran without graphs (`--fuseml-graphs off`; "
                    "their Inductor RO column is still measured): " + ", ".join(plain) + ".\n"
                )
        out.append(
            "| Workload | Preset | Eager | Inductor | Inductor MA | Inductor RO "
            "| fuseml, no graphs | fuseml | vs eager | vs best peer | vs RO | floor "
            "| HBM eager → fused (saved) | kernels eager → fuseml "
            "| rel err | compile cold / warm | strategy |"
        )
        out.append("|" + "---|" * 17)
        for r in rs:
            hbm = f"{_mb(r.get('hbm_bytes_eager'))} → {_mb(r.get('hbm_bytes_fused'))}"
            if r.get("hbm_saved") is not None:
                hbm += f" ({100 * r['hbm_saved']:.1f}%)"
            err = "—" if r.get("fuseml_rel_err") is None else f"{r['fuseml_rel_err']:.1e}"
            out.append(
                f"| {W.LABELS.get(r['workload'], r['workload'])} | {r['preset']} "
                f"| {_ms(r.get('eager_ms'))} | {_ms(r.get('inductor_ms'))} "
                f"| {_ms(r.get('inductor_max_autotune_ms'))} | {_ms(r.get('inductor_cudagraphs_ms'))} "
                f"| {_ms(r.get('fuseml_nographs_ms'))} | {_ms(r.get('fuseml_ms'))} "
                f"| {_x(r.get('speedup_vs_eager'))} | {_x(r.get('speedup_vs_best_peer'))} "
                f"| {_x(r.get('speedup_vs_inductor_cudagraphs'))} "
                f"| {_ms(r.get('floor_ms'))} | {hbm} "
                f"| {_n(r.get('kernels_eager'))} → {_n(r.get('kernels_fuseml'))} | {err} "
                f"| {_s(r.get('compile_cold_s'))} / {_s(r.get('compile_warm_s'))} "
                f"| {r.get('strategy') or '—'} |"
            )
        out.append("")
        lose = [r for r in rs if r.get("speedup_vs_best_peer") is not None and r["speedup_vs_best_peer"] < 1.0]
        if lose:
            out.append("Rows where fuseml is slower than the best peer:\n")
            for r in lose:
                out.append(
                    f"- {r['workload']} / {r['preset']}: {r['speedup_vs_best_peer']:.2f}x "
                    f"of {r.get('best_peer')} ({_ms(r.get('fuseml_ms'))} vs "
                    f"{_ms(r.get(r.get('best_peer', '') + '_ms'))} ms); "
                    f"{r.get('why_slower') or ''}"
                )
            out.append("")
        nulls = [(r, k, v) for r in rs for k, v in sorted((r.get("notes") or {}).items())]
        if nulls:
            out.append("Notes (empty cells and fallbacks):\n")
            for r, k, v in nulls:
                out.append(f"- {r['workload']} / {r['preset']}, {k}: {v}")
            out.append("")
    return "\n".join(out) + "\n"
