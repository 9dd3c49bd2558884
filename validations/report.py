"""``icelog report``: one HTML page per log table, with what a data engineer looks at first.

* **At a glance:** status, rows, partitions, files, small files, freshness (time since the
  table's last commit), what the last data-quality run covered.
* **Partitions:** rows and files per partition as a chart (skew shows at once), the small-file
  count per partition, and a note when compaction is due (the same rule ``storage.log.maintenance``
  compacts by: a run of at least ``COMPACT_MIN_FILES`` adjoining small files).
* **Rows per day**, by event time where the table has an event-time column (its one timestamp
  payload column, e.g. the flights' ``time_hour``), else by append time, the chart saying which;
  and the **commit history** (cumulative rows by commit time, labelled axes), both from durable
  sources (``validations.history``), not only the retained snapshots.
* **Validation** (the registered checks) and **data quality** (Great Expectations, incremental
  by default; ``full=True`` re-validates everything), with a link to the Data Docs site copied
  next to the page; Data Docs load local copies of their assets (``quality.offline_data_docs``).

Every page is self-contained: inline CSS, inline SVG charts, a few lines of inline script. No
CDN, no network. ``build_index`` writes one page per log table plus an index with each table's
status.
"""

from __future__ import annotations

import html
import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from icelog.storage.core.commit import is_system_table, load
from icelog.storage.errors import IcelogError
from icelog.storage.log.maintenance import COMPACT_MIN_FILES, Compaction, _small_runs, files_by_partition
from icelog.storage.log.scan import planned_paths
from icelog.storage.log.state import LogState
from icelog.storage.log.table import list_log_tables
from icelog.validations.checks import run_checks
from icelog.validations.history import commit_log, event_time_column, freshness_ms, human_age, iso, rows_per_day
from icelog.validations.verdict import OK, VIOLATIONS, WARNINGS, Verdict, severity_of

#: A file with fewer rows than compaction's target counts as small.
SMALL_FILE_ROWS = Compaction(table="").target_rows


def partition_files(table: Table) -> list[dict[str, Any]]:
    """Per partition: offsets, rows, files, small files, and whether compaction is due."""
    state = LogState.from_metadata(table.metadata)
    files = files_by_partition(table)
    out = []
    for p, w in sorted(state.watermarks.items()):
        entries = files.get(p, [])
        out.append(
            {
                "partition": p,
                "log_start": w.start,
                "log_end": w.end,
                "rows": w.end - w.start,
                "files": len(entries),
                "small_files": sum(1 for e in entries if e[2].record_count < SMALL_FILE_ROWS),
                "compaction_due": any(True for _ in _small_runs(entries, SMALL_FILE_ROWS)),
            }
        )
    return out


# --- charts (inline SVG) ------------------------------------------------------------------


def nice_ticks(top: float, count: int = 4) -> list[float]:
    """Round axis ticks from 0 to at least ``top``."""
    if top <= 0:
        return [0, 1]
    raw = top / count
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [0.0]
    while ticks[-1] < top:
        ticks.append(ticks[-1] + step)
    return ticks


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v == int(v) else f"{v:,.1f}"


def _frame(
    chart_id: str,
    label: str,
    width: int,
    height: int,
    ticks: list[float],
    x_title: str,
    y_title: str,
    body: str,
    pad: tuple[int, int, int, int],
) -> str:
    left, top_pad, right, bottom = pad
    top = ticks[-1]
    grid = "".join(
        f'<line x1="{left}" x2="{width - right}" y1="{_y(t, top, height, top_pad, bottom):.1f}" y2="{_y(t, top, height, top_pad, bottom):.1f}" class="grid"/>'
        f'<text x="{left - 6}" y="{_y(t, top, height, top_pad, bottom) + 4:.1f}" text-anchor="end" class="tick">{_fmt(t)}</text>'
        for t in ticks
    )
    return (
        f'<svg id="{chart_id}" class="chart" role="img" aria-label="{html.escape(label)}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"{grid}"
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" class="axis"/>'
        f'<line x1="{left}" y1="{top_pad}" x2="{left}" y2="{height - bottom}" class="axis"/>'
        f'<text class="axis-title x-title" x="{(left + width - right) / 2:.0f}" y="{height - 6}" text-anchor="middle">{html.escape(x_title)}</text>'
        f'<text class="axis-title y-title" transform="translate(14,{(top_pad + height - bottom) / 2:.0f}) rotate(-90)" text-anchor="middle">{html.escape(y_title)}</text>'
        f"{body}</svg>"
    )


def _y(v: float, top: float, height: int, top_pad: int, bottom: int) -> float:
    return height - bottom - (height - top_pad - bottom) * (v / top if top else 0)


def bar_chart(
    chart_id: str,
    labels: list[str],
    series: list[tuple[str, list[float], str]],
    *,
    x_title: str,
    y_title: str,
    width: int = 900,
    height: int = 240,
) -> str:
    """Vertical bars, one group per label; series are drawn stacked (each ``(name, values, css class)``)."""
    pad = (70, 16, 16, 58)
    if not labels:
        return f'<svg id="{chart_id}" class="chart" width="{width}" height="40"><text x="10" y="25">nothing yet</text></svg>'
    totals = [sum(s[1][i] for s in series) for i in range(len(labels))]
    ticks = nice_ticks(max(totals))
    slot = (width - pad[0] - pad[2]) / len(labels)
    bars, every = [], max(1, len(labels) // 16)
    for i, label in enumerate(labels):
        x, base = pad[0] + i * slot + slot * 0.15, 0.0
        for name, values, css in series:
            v = values[i]
            y0, y1 = _y(base, ticks[-1], height, pad[1], pad[3]), _y(base + v, ticks[-1], height, pad[1], pad[3])
            bars.append(
                f'<rect class="bar {css}" x="{x:.1f}" y="{y1:.1f}" width="{slot * 0.7:.1f}" height="{max(0.0, y0 - y1):.1f}"><title>{html.escape(label)}: {_fmt(v)} {html.escape(name)}</title></rect>'
            )
            base += v
        if i % every == 0:
            bars.append(
                f'<text class="tick" x="{x + slot * 0.35:.1f}" y="{height - pad[3] + 14}" text-anchor="middle">{html.escape(label)}</text>'
            )
    return _frame(chart_id, y_title, width, height, ticks, x_title, y_title, "".join(bars), pad)


def line_chart(
    chart_id: str, points: list[tuple[int, float, str]], *, x_title: str, y_title: str, width: int = 900, height: int = 260
) -> str:
    """Values over time: ``(timestamp_ms, value, tooltip)``, with time ticks on the x axis."""
    pad = (70, 16, 24, 58)
    if not points:
        return f'<svg id="{chart_id}" class="chart" width="{width}" height="40"><text x="10" y="25">no commits yet</text></svg>'
    ticks = nice_ticks(max(p[1] for p in points))
    t0, t1 = points[0][0], points[-1][0]

    def x(t: int) -> float:
        return pad[0] + (width - pad[0] - pad[2]) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)

    line = " ".join(f"{x(t):.1f},{_y(v, ticks[-1], height, pad[1], pad[3]):.1f}" for t, v, _ in points)
    dots = "".join(
        f'<circle cx="{x(t):.1f}" cy="{_y(v, ticks[-1], height, pad[1], pad[3]):.1f}" r="3"><title>{html.escape(tip)}</title></circle>'
        for t, v, tip in points
    )
    times = sorted({t0, t1, *([t0 + (t1 - t0) * k // 4 for k in (1, 2, 3)] if t1 > t0 else [])})
    # Within a day the time of day says enough; a label equal to its neighbour's is dropped.
    labels = {t: (iso(t) or "").replace("T", " ")[:16] if t1 - t0 >= 86_400_000 else (iso(t) or "")[11:19] for t in times}
    kept = [t for i, t in enumerate(times) if i == 0 or labels[t] != labels[times[i - 1]]]
    xticks = "".join(
        f'<text class="tick" x="{x(t):.1f}" y="{height - pad[3] + 14}" text-anchor="middle">{html.escape(labels[t])}</text>'
        for t in kept
    )
    return _frame(
        chart_id, y_title, width, height, ticks, x_title, y_title, f'<polyline points="{line}" class="line"/>{dots}{xticks}', pad
    )


CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1d2330;max-width:1000px}
h1{font-size:1.6rem;margin-bottom:.2rem} .meta{color:#5b6475} h2{margin-top:2rem}
.badge{display:inline-block;padding:.2rem .6rem;border-radius:1rem;font-weight:600}
.ok{background:#d9f5e1;color:#11602d}.bad{background:#fde0e0;color:#8c1c1c}.warn{background:#fff1cc;color:#7a5200}
.tiles{display:flex;flex-wrap:wrap;gap:.8rem;margin:1rem 0}.tile{border:1px solid #e3e6ec;border-radius:.5rem;padding:.6rem 1rem;min-width:8rem}
.tile b{display:block;font-size:1.3rem}.tile span{color:#5b6475;font-size:.85rem}
table{border-collapse:collapse;margin:1rem 0}td,th{padding:.3rem .8rem;border-bottom:1px solid #e3e6ec;text-align:right}
th:first-child,td:first-child,td.text{text-align:left}
svg .axis{stroke:#9aa3b2}svg .grid{stroke:#eef0f4}svg .line{fill:none;stroke:#2f6fde;stroke-width:2}svg circle{fill:#2f6fde}
svg text{font-size:11px;fill:#5b6475}svg .axis-title{font-size:12px;fill:#1d2330}
svg .bar{fill:#2f6fde}svg .bar.small{fill:#e0a100}svg .bar.large{fill:#7fa7ef}svg rect:hover{opacity:.75}
.legend i{display:inline-block;width:.8rem;height:.8rem;margin:0 .3rem 0 1rem;vertical-align:middle}
"""

SCRIPT = """
// Hover a point or bar to see it; the page marks itself rendered for tests and tools.
document.querySelectorAll('svg.chart circle').forEach(d => {
  d.addEventListener('mouseenter', () => d.setAttribute('r', '5'));
  d.addEventListener('mouseleave', () => d.setAttribute('r', '3'));
});
document.body.dataset.rendered = String(document.querySelectorAll('#commit-history circle').length);
document.body.dataset.charts = String(document.querySelectorAll('svg.chart').length);
"""


# --- the page -----------------------------------------------------------------------------


def build_report(
    table: Table,
    out: str | Path,
    *,
    gx: bool = True,
    expectations_file: str | None = None,
    full: bool = False,
    engine: str = "auto",
    spark: Any | Callable[[], Any] | None = None,
    docs_root: Path | None = None,
    now_ms: int | None = None,
) -> Path:
    """Write ``out/index.html`` and ``out/report.json`` (and ``out/data-docs/`` when GX runs).

    Args:
        table: The log table.
        out: The folder to write.
        gx: Run the Great Expectations suite.
        expectations_file: Payload expectations (default ``expectations/<table>.json``).
        full: Re-validate every row (default: only rows committed since the last pass).
        engine: GX engine: ``auto``, ``pandas`` or ``spark``.
        spark: A SparkSession or a function returning one (for the Spark engine).
        docs_root: The GX project folder (default ``$ICELOG_HOME/quality``).
        now_ms: The clock for freshness (tests).

    Returns:
        The page's path.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    name = ".".join(table.name()[-2:])
    state = LogState.from_metadata(table.metadata)
    partitions = partition_files(table)
    checks = run_checks(table)
    quality = None
    if gx:
        from icelog.validations.quality import run_suite  # imports great_expectations (~14 s): only when asked for

        quality = run_suite(
            table, expectations_file=expectations_file, full=full, engine=engine, spark=spark, docs_root=docs_root
        )
        if quality.data_docs:
            target = out / "data-docs"
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(Path(quality.data_docs).parent, target)
    paths = planned_paths(table)
    commits = commit_log(table, paths)
    event_time = event_time_column(table)
    per_day = rows_per_day(table, paths, event_time)
    verdict = Verdict.of(checks.to_dict(), quality.to_dict() if quality else None)
    summary = {
        "table": name,
        "ok": verdict.ok,
        "status": verdict.status,
        "verdict": verdict.describe(),
        "snapshot_id": state.snapshot_id,
        "rows": sum(p["rows"] for p in partitions),
        "partitions": len(partitions),
        "files": sum(p["files"] for p in partitions),
        "small_files": sum(p["small_files"] for p in partitions),
        "compaction_due": [p["partition"] for p in partitions if p["compaction_due"]],
        "last_commit_ms": table.metadata.last_updated_ms,
        "freshness_ms": freshness_ms(table, now_ms),
        "violations": len(checks.violations),
        "quality_ok": quality.success if quality else None,
        "quality_scope": quality.scope if quality else None,
    }
    page = _page(name, summary, partitions, (event_time, per_day), commits, checks, quality, out, now_ms)
    page_path = out / "index.html"
    page_path.write_text(page)
    doc = {
        **summary,
        "checks": checks.to_dict(),
        "quality": quality.to_dict() if quality else None,
        "partition_files": partitions,
        "rows_per_day": per_day,
        "rows_per_day_by": event_time or "append time",
        "history": [c.to_dict() for c in commits],
        "seconds": time.perf_counter() - started,
    }
    (out / "report.json").write_text(json.dumps(doc, default=str, indent=1))
    return page_path


def _page(
    name: str,
    s: dict[str, Any],
    partitions: list[dict[str, Any]],
    per_day_by: tuple[str | None, list[dict[str, Any]]],
    commits: list[Any],
    checks: Any,
    quality: Any,
    out: Path,
    now_ms: int,
) -> str:
    esc = html.escape
    due = s["compaction_due"]
    compaction_note = (
        f'<p id="compaction-note" class="badge warn">Compaction is due in partition{"s" if len(due) > 1 else ""} {", ".join(map(str, due[:20]))}{" …" if len(due) > 20 else ""}: '
        f"runs of {COMPACT_MIN_FILES}+ adjoining files under {SMALL_FILE_ROWS:,} rows (<code>icelog maintain {esc(s['table'])}</code>).</p>"
        if due
        else '<p id="compaction-note" class="meta">No compaction due.</p>'
    )
    timed = [c for c in commits if c.timestamp_ms is not None]
    total, points = 0, []
    for c in commits:
        total += c.rows
        if c.timestamp_ms is not None:
            points.append(
                (
                    c.timestamp_ms,
                    total,
                    f"{iso(c.timestamp_ms)}: +{c.rows:,} rows (total appended {total:,}), commit {c.commit_id[:8]}",
                )
            )
    points.sort()
    rows = "".join(
        f"<tr><td>{p['partition']}</td><td>{p['log_start']:,}</td><td>{p['log_end']:,}</td><td>{p['rows']:,}</td><td>{p['files']}</td><td>{p['small_files']}</td><td>{'yes' if p['compaction_due'] else ''}</td></tr>"
        for p in partitions
    )
    violations = (
        "".join(
            f"<tr><td>{esc(v.kind)}</td><td>{'' if v.partition is None else v.partition}</td><td>{'' if v.first is None else v.first}</td><td>{'' if v.last is None else v.last}</td><td class='text'>{esc(v.detail)}</td></tr>"
            for v in checks.violations[:50]
        )
        or "<tr><td colspan=5>no check violations</td></tr>"
    )
    quality_html, quality_tile = "<p>Great Expectations not run.</p>", ("not run", "")
    if quality is not None:
        failed = "".join(
            f"<li class='{severity_of(f)}'>{'warning' if severity_of(f) == 'warn' else 'failed'}: {esc(f['expectation'])} "
            f"{esc(json.dumps(f['kwargs']))}: {f['unexpected_count']} unexpected</li>"
            for f in quality.failed
        )
        docs_link = (
            '<a id="data-docs" href="data-docs/index.html">Great Expectations Data Docs</a>'
            if (out / "data-docs").exists()
            else ""
        )
        if quality.docs_not_offline:
            docs_link += (
                f' <span id="docs-not-offline" class="badge warn">needs the network: {esc(quality.docs_not_offline)}</span>'
            )
        scope = quality.scope or {}
        covered = _covered(scope, quality.engine)
        word = _quality_word(quality)
        quality_html = (
            f"<p><span id='quality-status' class='badge {BADGE[word]}'>{word}</span> "
            f"{quality.evaluated} expectations. {docs_link}</p>"
            f"<p id='quality-scope' class='meta'>{esc(covered)}</p><ul>{failed}</ul>"
        )
        shown = scope.get("last_run") or scope
        quality_tile = (
            word,
            f"{shown.get('mode', '')}, {shown.get('rows', 0):,} rows" + (" (last run)" if "last_run" in scope else ""),
        )
    labels = [str(p["partition"]) for p in partitions]
    tiles = [
        ("rows", f"{s['rows']:,}", "", "tile-rows"),
        ("partitions", str(s["partitions"]), "", "tile-partitions"),
        ("data files", f"{s['files']:,}", f"{s['small_files']:,} small", "tile-files"),
        ("since last commit", human_age(s["freshness_ms"]), esc(iso(s["last_commit_ms"]) or ""), "freshness"),
        ("data quality", quality_tile[0], quality_tile[1], "tile-quality"),
    ]
    tiles_html = "".join(
        f'<div class="tile" id="{i}"><span>{label}</span><b>{value}</b><span>{sub}</span></div>' for label, value, sub, i in tiles
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>icelog report: {esc(s["table"])}</title><style>{CSS}</style></head>
<body>
<h1>{esc(s["table"])} <span id="status" class="badge {BADGE[s["status"]]}" title="{esc(s["verdict"])}">{s["status"]}</span></h1>
<p class="meta">snapshot {s["snapshot_id"]} · generated {esc(iso(now_ms) or "")}</p>
<div class="tiles">{tiles_html}</div>
<h2>Partitions</h2>
<p class="meta legend">Rows per partition (skew shows as uneven bars) and data files per partition:<i style="background:#e0a100"></i>small<i style="background:#7fa7ef"></i>other</p>
{bar_chart("partitions-rows", labels, [("rows", [p["rows"] for p in partitions], "rows")], x_title="partition", y_title="rows")}
{bar_chart("partitions-files", labels, [("small files", [p["small_files"] for p in partitions], "small"), ("other files", [p["files"] - p["small_files"] for p in partitions], "large")], x_title="partition", y_title="data files", height=200)}
{compaction_note}
<table id="partitions"><tr><th>partition</th><th>log start</th><th>log end</th><th>rows</th><th>files</th><th>small files</th><th>compaction due</th></tr>{rows}</table>
{_per_day_section(*per_day_by)}
<h2>Commit history</h2>
<p class="meta">Rows appended, cumulative, over the last {len(commits):,} commits the table's commit registry keeps ({len(timed):,} with a time; a commit's time is the append time of its rows).</p>
{line_chart("commit-history", points, x_title="commit time (UTC)", y_title="rows appended (cumulative)")}
<h2>Validation</h2>
<p id="verdict"><b>{esc(s["verdict"])}</b>: check violations fail the gate, and so do failed expectations of severity error; warnings are findings.</p>
<p>Checks: {esc(", ".join(checks.checks))} ({checks.rows:,} rows, {checks.seconds:.2f} s)</p>
<table id="violations"><tr><th>kind</th><th>partition</th><th>first</th><th>last</th><th>detail</th></tr>{violations}</table>
<h2>Data quality</h2>
{quality_html}
<script>{SCRIPT}</script>
</body></html>
"""


#: The badge's colour for each verdict status and data-quality word.
BADGE = {OK: "ok", WARNINGS: "warn", VIOLATIONS: "bad", "passed": "ok", "warnings": "warn", "failed": "bad"}


def _quality_word(quality: Any) -> str:
    """``passed``, ``warnings`` (the gate passed; warn-severity expectations failed) or ``failed``."""
    return "failed" if not quality.success else "warnings" if quality.failed else "passed"


def _per_day_section(event_time: str | None, per_day: list[dict[str, Any]]) -> str:
    """Rows per day by event time (``event_time``, a payload column) or, without one, by append time."""
    esc = html.escape
    dated = [d for d in per_day if d["day"] is not None]
    undated = sum(d["rows"] for d in per_day if d["day"] is None)
    if event_time is None:
        heading, x_title, y_title = "Rows added per day, by append time", "day appended (UTC)", "rows added"
        meta = "By the day each row was appended (UTC): the table has no event-time column (one timestamp payload column)."
    else:
        heading, x_title, y_title = "Rows per day, by event time", f"day of {event_time} (UTC)", "rows"
        meta = f"By each row's event time, <code>{esc(event_time)}</code> (UTC), not by when it was loaded."
        if undated:
            meta += f" {undated:,} {'row' if undated == 1 else 'rows'} without a {esc(event_time)} not shown."
    chart = bar_chart(
        "rows-per-day",
        [d["day"] for d in dated],
        [("rows", [d["rows"] for d in dated], "rows")],
        x_title=x_title,
        y_title=y_title,
    )
    return f'<h2 id="rows-per-day-title">{heading}</h2>\n<p class="meta" id="rows-per-day-by">{meta} For the rows the table still holds.</p>\n{chart}'


def _covered(scope: dict[str, Any], engine: str) -> str:
    """What the data-quality result covers; with nothing new, what the repeated last run covered."""
    last = scope.get("last_run")
    if last is None:
        return f"{scope.get('mode', '')} validation of {scope.get('rows', 0):,} rows on {engine}: {scope.get('reason', '')}."
    reason = scope.get("reason", "")
    return (
        f"{reason[:1].upper()}{reason[1:]}: this is the result of the last validation "
        f"({iso(last.get('at_ms')) or 'time unknown'}), a {last.get('mode', '')} validation of {last.get('rows', 0):,} rows "
        f"on {last.get('engine', engine)}: {last.get('reason', '')}."
    )


# --- every table at once ------------------------------------------------------------------


def build_index(
    catalog: Catalog, out: str | Path, *, tables: list[str] | None = None, now_ms: int | None = None, **report: Any
) -> Path:
    """Report every log table (``out/<table>/index.html``) and write ``out/index.html`` linking them.

    icelog's system tables (``icelog_system.*``) are reported only when ``tables`` names them.
    A table whose report fails is listed with its error; the others are still written.
    """

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    entries = []
    names = tables if tables is not None else [n for n in list_log_tables(catalog) if not is_system_table(n)]
    for name in names:
        try:
            page = build_report(load(catalog, name), out / name, now_ms=now_ms, **report)
            entries.append(json.loads((page.parent / "report.json").read_text()))
        except IcelogError as e:
            entries.append({"table": name, "error": str(e)})
    (out / "index.json").write_text(
        json.dumps([{k: v for k, v in e.items() if k in INDEX_KEYS} for e in entries], default=str, indent=1)
    )
    (out / "index.html").write_text(_index_page(entries, now_ms))
    return out / "index.html"


DUE = '<span class="badge warn">due</span>'
INDEX_KEYS = (
    "table",
    "ok",
    "rows",
    "partitions",
    "files",
    "small_files",
    "compaction_due",
    "freshness_ms",
    "violations",
    "quality_ok",
    "status",
    "error",
)


def _index_page(entries: list[dict[str, Any]], now_ms: int) -> str:
    esc = html.escape

    def status(e: dict[str, Any]) -> str:
        if "error" in e:
            return '<span class="badge bad status">ERROR</span>'
        word = e.get("status") or (OK if e["ok"] else VIOLATIONS)
        return f'<span class="badge {BADGE[word]} status">{word}</span>'

    rows = (
        "".join(
            f'<tr><td><a href="{esc(e["table"])}/index.html">{esc(e["table"])}</a></td><td>{status(e)}</td>'
            + (
                f'<td colspan=6 class="text">{esc(e["error"])}</td>'
                if "error" in e
                else f"<td>{e['rows']:,}</td><td>{e['partitions']}</td><td>{e['files']:,} ({e['small_files']:,} small)</td>"
                f"<td>{DUE if e['compaction_due'] else ''}</td><td>{human_age(e['freshness_ms'])}</td>"
                f"<td>{'' if e['quality_ok'] is None else ('passed' if e['quality_ok'] else 'failed')}</td>"
            )
            + "</tr>"
            for e in entries
        )
        or "<tr><td colspan=8>no log tables</td></tr>"
    )
    bad = sum(1 for e in entries if "error" in e or not e.get("ok"))
    warned = sum(1 for e in entries if "error" not in e and e.get("ok") and e.get("status") == WARNINGS)
    # The page's badge says what its rows say: warnings are findings, not "all OK".
    headline, badge = (
        (f"{bad} need attention", "bad") if bad else (f"{warned} with warnings", "warn") if warned else ("all OK", "ok")
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>icelog reports</title><style>{CSS}</style></head>
<body>
<h1>icelog tables <span id="status" class="badge {badge}">{headline}</span></h1>
<p class="meta">{len(entries)} log tables · generated {esc(iso(now_ms) or "")}</p>
<table id="tables"><tr><th>table</th><th>status</th><th>rows</th><th>partitions</th><th>files</th><th>compaction</th><th>since last commit</th><th>data quality</th></tr>{rows}</table>
<script>document.body.dataset.rendered = String(document.querySelectorAll('#tables a').length);</script>
</body></html>
"""
