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
        figures = {k: v for k, v in p["figures"].items() if k != "rows"}
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
            ref = REFERENCE_TF.get(r["batch"])
            md.append(
                f"| {r['batch']} | {f'{ref[0]} / {ref[1]} / {ref[2]:.2f}' if ref else '-'} | "
                f"{r['exclusive']} | {r['weight1']} | {r['weight2']} | **{r['ratio']}** | "
                f"{r['aggregate_pct']} % | {r['slice_ms']} / {r['handover_ms']} ms |"
            )
    return "\n".join([*md, "", doc["summary"]]) + "\n"


def record(doc: dict[str, Any]) -> None:
    """A real GPU run's section of bench/RESULTS.md, labelled with its GPU and driver."""
    if doc["fake"]:
        raise ValueError("a run on the fake driver is not a GPU measurement")
    results.update("gpu", doc["command"], render(doc), on=doc["machine"])
