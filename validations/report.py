"""``icelog report``: one HTML page per log table that people look at.

Per partition: offset range, rows, files. The commit history as a chart (the snapshots the
table still keeps). The validation status and the latest violations. A link to the Great
Expectations Data Docs, copied next to the page so the folder is self-contained.
Everything is inline (no CDN, no network): an SVG chart and a little script.
"""

from __future__ import annotations

import html
import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pyiceberg.table import Table

from storage.maintenance import files_by_partition
from storage.state import LogState
from validations.checks import run_checks


def commit_history(table: Table) -> list[dict[str, Any]]:
    """Retained snapshots, oldest first: time, rows added, total rows, operation."""
    history = []
    for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms):
        summary = snapshot.summary
        props = summary.additional_properties if summary else {}
        ranges = json.loads(props.get("icelog.ranges", "{}"))
        history.append({
            "snapshot_id": snapshot.snapshot_id,
            "time": datetime.fromtimestamp(snapshot.timestamp_ms / 1000, timezone.utc).isoformat(timespec="seconds"),
            "timestamp_ms": snapshot.timestamp_ms,
            "operation": summary.operation.value if summary else "",
            "added": sum(r[1] - r[0] for r in ranges.values()),
            "total": int(props.get("total-records", 0)),
            "partitions": sorted(int(p) for p in ranges),
        })
    return history


def _chart(history: list[dict[str, Any]], width: int = 760, height: int = 220) -> str:
    if not history:
        return '<svg id="commit-history" width="760" height="40"><text x="10" y="25">no commits yet</text></svg>'
    pad = 48
    t0, t1 = history[0]["timestamp_ms"], history[-1]["timestamp_ms"]
    top = max(h["total"] for h in history) or 1
    def x(t: int) -> float:
        return pad + (width - 2 * pad) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)
    def y(v: int) -> float:
        return height - pad + (-(height - 2 * pad) * v / top)
    points = " ".join(f"{x(h['timestamp_ms']):.1f},{y(h['total']):.1f}" for h in history)
    dots = "".join(
        f'<circle cx="{x(h["timestamp_ms"]):.1f}" cy="{y(h["total"]):.1f}" r="3"><title>{html.escape(h["time"])}: {h["operation"]} +{h["added"]:,} rows (total {h["total"]:,})</title></circle>'
        for h in history
    )
    return (
        f'<svg id="commit-history" role="img" aria-label="rows over time" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" class="axis"/>'
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" class="axis"/>'
        f'<text x="{pad}" y="{pad - 8}">{top:,} rows</text>'
        f'<text x="{pad}" y="{height - pad + 18}">{html.escape(history[0]["time"])}</text>'
        f'<text x="{width - pad}" y="{height - pad + 18}" text-anchor="end">{html.escape(history[-1]["time"])}</text>'
        f'<polyline points="{points}" class="line"/>{dots}</svg>'
    )


CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1d2330;max-width:1000px}
h1{font-size:1.6rem;margin-bottom:.2rem} .meta{color:#5b6475}
.badge{display:inline-block;padding:.2rem .6rem;border-radius:1rem;font-weight:600}
.ok{background:#d9f5e1;color:#11602d}.bad{background:#fde0e0;color:#8c1c1c}
table{border-collapse:collapse;margin:1rem 0}td,th{padding:.3rem .8rem;border-bottom:1px solid #e3e6ec;text-align:right}
th:first-child,td:first-child,#violations th:last-child{text-align:left}
svg .axis{stroke:#9aa3b2}svg .line{fill:none;stroke:#2f6fde;stroke-width:2}svg circle{fill:#2f6fde}svg text{font-size:11px;fill:#5b6475}
"""


def build_report(table: Table, out: str | Path, *, gx: bool = True, expectations_file: str | None = None) -> Path:
    """Write ``out/index.html`` (and ``out/data-docs/`` when GX runs); return the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    name = ".".join(table.name()[-2:])
    state = LogState.from_metadata(table.metadata)
    files = files_by_partition(table)
    checks = run_checks(table)
    quality = None
    if gx:
        from validations.quality import run_suite

        quality = run_suite(table, expectations_file=expectations_file)
        if quality.data_docs:
            target = out / "data-docs"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(Path(quality.data_docs).parent, target)
    history = commit_history(table)
    ok = checks.ok and (quality is None or quality.success)
    rows = "".join(
        f"<tr><td>{p}</td><td>{w.start:,}</td><td>{w.end:,}</td><td>{w.end - w.start:,}</td><td>{len(files.get(p, []))}</td></tr>"
        for p, w in sorted(state.watermarks.items())
    )
    violations = "".join(
        f"<tr><td>{html.escape(v.kind)}</td><td>{'' if v.partition is None else v.partition}</td><td>{'' if v.first is None else v.first}</td><td>{'' if v.last is None else v.last}</td><td style='text-align:left'>{html.escape(v.detail)}</td></tr>"
        for v in checks.violations[:50]
    ) or "<tr><td colspan=5>none</td></tr>"
    quality_html = "<p>Great Expectations not run.</p>"
    if quality is not None:
        failed = "".join(f"<li>{html.escape(f['expectation'])} {html.escape(json.dumps(f['kwargs']))}: {f['unexpected_count']} unexpected</li>" for f in quality.failed)
        docs_link = '<a id="data-docs" href="data-docs/index.html">Great Expectations Data Docs</a>' if (out / "data-docs").exists() else ""
        quality_html = f"<p><span class='badge {'ok' if quality.success else 'bad'}'>{'passed' if quality.success else 'failed'}</span> {quality.evaluated} expectations. {docs_link}</p><ul>{failed}</ul>"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>icelog report: {html.escape(name)}</title><style>{CSS}</style></head>
<body>
<h1>{html.escape(name)} <span id="status" class="badge {'ok' if ok else 'bad'}">{'OK' if ok else 'VIOLATIONS'}</span></h1>
<p class="meta">snapshot {state.snapshot_id} · {sum(w.end - w.start for w in state.watermarks.values()):,} rows in {state.partitions} partitions · generated {datetime.now(timezone.utc).isoformat(timespec='seconds')}</p>
<h2>Partitions</h2>
<table id="partitions"><tr><th>partition</th><th>log start</th><th>log end</th><th>rows</th><th>files</th></tr>{rows}</table>
<h2>Commit history</h2>
<p class="meta">Rows over the {len(history)} snapshots the table keeps (older ones are expired to keep commits fast).</p>
{_chart(history)}
<h2>Validation</h2>
<p>Checks: {html.escape(', '.join(checks.checks))} ({checks.rows:,} rows, {checks.seconds:.2f} s)</p>
<table id="violations"><tr><th>kind</th><th>partition</th><th>first</th><th>last</th><th>detail</th></tr>{violations}</table>
<h2>Data quality</h2>
{quality_html}
<script>
  // Hover a commit to see it; the page marks itself rendered for tests and tools.
  const dots = document.querySelectorAll('#commit-history circle');
  dots.forEach(d => d.addEventListener('mouseenter', () => d.setAttribute('r', '5')));
  dots.forEach(d => d.addEventListener('mouseleave', () => d.setAttribute('r', '3')));
  document.body.dataset.rendered = String(dots.length);
</script>
</body></html>
"""
    page_path = out / "index.html"
    page_path.write_text(page)
    (out / "report.json").write_text(json.dumps({"table": name, "ok": ok, "checks": checks.to_dict(), "quality": quality.to_dict() if quality else None, "history": history, "seconds": time.perf_counter() - started}, default=str, indent=1))
    return page_path
