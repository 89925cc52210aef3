"""bench.gpu's report: a run's markdown, and its section of bench/RESULTS.md, labelled with its GPU and driver."""

from __future__ import annotations

import json
from typing import Any

from bench import results


def render(doc: dict[str, Any]) -> str:
    """A run's markdown: the parts, each with its outcome and figures, and ResNet-50 beside cGPU's published table."""
    md = [
        f"{'FAKE driver: ' if doc['fake'] else ''}{doc['machine']}; arbiterd at its defaults on NVML; "
        f"{doc['seconds']:.0f} s of a {doc['budget_s']:.0f} s budget.",
        "",
        "| part | outcome | seconds | figures |",
        "| --- | --- | ---: | --- |",
    ]
    for name, p in doc["parts"].items():
        figures = {k: v for k, v in p["figures"].items() if k not in ("rows", "notes")}
        md.append(
            f"| {name} | {p['status']}{': ' + p['why'] if p['why'] else ''} | {p['seconds']:.1f} | "
            f"{json.dumps(figures) if figures else ''} |"
        )
    rows = doc["info"].get("resnet")
    if rows:
        from bench.resnet50 import REFERENCE_TF

        md += [
            "",
            "| batch | reference TF (A10): w1 / w2 / ratio | exclusive img/s | weight 1 | weight 2 | "
            "**ratio** | sum / exclusive | slice / hand-over |",
            "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for r in rows:
            ref = REFERENCE_TF.get(r["batch"]) if r.get("mode", "inference") == "inference" else None
            md.append(
                f"| {r['batch']}{' training' * (r.get('mode') == 'training')} | "
                f"{f'{ref[0]} / {ref[1]} / {ref[2]:.2f}' if ref else '-'} | "
                f"{r['exclusive']} | {r['weight1']} | {r['weight2']} | **{r['ratio']}** | "
                f"{r['aggregate_pct']} % | {r['slice_ms']} / {r['handover_ms']} ms |"
            )
    for name, p in doc["parts"].items():
        md += frameworks_table(name, p["figures"])
    return "\n".join([*md, "", doc["summary"]]) + "\n"


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, int | float) else "-"


def frameworks_table(name: str, figures: dict[str, Any]) -> list[str]:
    """A framework part's table (bench.gpu_frameworks): per variant, each way of sharing; its notes below it. The
    limit part's rows, in a table of their own."""
    rows, notes = figures.get("rows") or [], figures.get("notes") or []
    if name == "limit" and rows:
        md = ["", f"**limit**: {figures.get('work', '')}", "",
              "| tenant | held (% of the GPU) | target | work (% of exclusive) | throttled s |",
              "| --- | ---: | ---: | ---: | ---: |"]
        return md + [f"| {r['tenant']} | {_num(r['held_pct'], '.2f')} | {r['target_pct']} | "
                     f"{_num(r['work_pct_of_exclusive'], '.1f')} | {_num(r.get('throttled_s'), '.3f')} |" for r in rows]
    if not rows or "sharing" not in rows[0]:
        return []
    unit = rows[0]["unit"]
    md = ["", f"**{name}**{' (stand-in: the CUDA job program)' * bool(rows[0].get('stand_in'))}, {unit}/s", "",
          "| variant | sharing | A alone | B alone | A in the pair (w1 / 33 %) | B (w2 / 67 %) | **work ratio B/A** | "
          "held ratio | sum / exclusive | shim loaded | ok |",
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        md.append(f"| {r['variant']} | {r['sharing']} | {_num(r['alone_a'], '.1f')} | {_num(r['alone_b'], '.1f')} | "
                  f"{_num(r['a'], '.1f')} | {_num(r['b'], '.1f')} | **{_num(r['ratio'], '.3f')}** | "
                  f"{_num(r.get('held_ratio'), '.3f')} | {_num(r.get('aggregate_pct'), '.1f')} % | "
                  f"{'yes' if r['shim'] else 'no'} | {('yes' if r['ok'] else 'NO') if 'ok' in r else ''} |")
    return md + [f"- {n}" for n in notes]


def summary_frameworks(parts_rows: list[list[dict[str, Any]]]) -> str:
    """``frameworks_ok=N/M worst_ratio=X``: of the framework rows through cgpu, those ok (the shim loaded in both
    tenants, the work ratio within 10 % of 2), and the ratio farthest from 2 (``na`` where none ran)."""
    rows = [r for rs in parts_rows for r in rs if r.get("mode") == "cgpu"]
    ratios = [r["ratio"] for r in rows if isinstance(r.get("ratio"), int | float)]
    worst = max(ratios, key=lambda x: abs(x - 2), default=None)
    return (f"frameworks_ok={sum(1 for r in rows if r.get('ok'))}/{len(rows)} "
            f"worst_ratio={'na' if worst is None else format(worst, '.3f')}")


def record(doc: dict[str, Any]) -> None:
    """A real GPU run's section of bench/RESULTS.md, labelled with its GPU and driver."""
    if doc["fake"]:
        raise ValueError("a run on the fake driver is not a GPU measurement")
    results.update("gpu", doc["command"], render(doc), on=doc["machine"])
