#!/usr/bin/env python3
"""Helpers for bench/run.sh (standard library only).

Subcommands:
  parse-wrk FILE                      -> "rps p50_us p99_us requests non2xx errors" (one TSV line)
  segs SSFILE                         -> "peer<TAB>data_segs_in" per established socket
  delta-cmdstats BEFORE AFTER N       -> markdown cells: Redis commands per request
  delta-segs BEFORE AFTER N           -> data segments received by the store per request
  strace-summary FILE N               -> syscalls per request and the top five (strace -c output)
  openloop --url U --control C ...    -> constant-rate (open-loop) client for the retry
                                         amplification scenario; prints one JSON line
  fixed --port P --count N ...        -> exactly N requests over keep-alive connections
                                         (bench/callgrind.sh, bench/queue.sh backlog);
                                         prints "sent ok other"
  summarize OUTDIR                    -> the markdown report of a run
"""

import asyncio
import json
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict
from urllib.parse import urlsplit

# ---------------------------------------------------------------------------- wrk output


def _to_us(text):
    m = re.match(r"([\d.]+)(us|ms|s|m)$", text.strip())
    if not m:
        return float("nan")
    v, unit = float(m.group(1)), m.group(2)
    return v * {"us": 1, "ms": 1e3, "s": 1e6, "m": 60e6}[unit]


def parse_wrk(path):
    rps = p50 = p99 = float("nan")
    requests = non2xx = errors = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            s = line.strip()
            if s.startswith("Requests/sec:"):
                rps = float(s.split()[1])
            elif re.match(r"^50%\s", s):
                p50 = _to_us(s.split()[1])
            elif re.match(r"^99%\s", s):
                p99 = _to_us(s.split()[1])
            elif re.match(r"^\d+ requests in", s):
                requests = int(s.split()[0])
            elif s.startswith("Non-2xx or 3xx responses:"):
                non2xx = int(s.split(":")[1])
            elif s.startswith("Socket errors:"):
                errors = sum(int(x) for x in re.findall(r"\d+", s))
    return rps, p50, p99, requests, non2xx, errors


# ---------------------------------------------------------------------------- store counters


def read_cmdstats(path):
    stats = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"cmdstat_([^:]+):calls=(\d+)", line.strip())
            if m:
                stats[m.group(1)] = int(m.group(2))
    return stats


def read_segs(path):
    """`ss -Htin` output -> {peer: data_segs_in}. Info lines follow their socket line."""
    segs = {}
    peer = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            if not line[0].isspace():
                fields = line.split()
                # state recv-q send-q local peer  (state omitted when filtered by state)
                peer = fields[-1] if len(fields) >= 4 else None
                continue
            m = re.search(r"data_segs_in:(\d+)", line)
            if peer and m:
                segs[peer] = int(m.group(1))
    return segs


def delta_segs(before, after, n):
    b, a = read_segs(before), read_segs(after)
    total = sum(v - b.get(k, 0) for k, v in a.items())
    return total / n if n else float("nan"), total


# ---------------------------------------------------------------------------- open-loop client


async def _http_get(host, port, path, timeout):
    """One GET on a fresh connection (Connection: close); returns (status, body)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
    return status, body


async def _openloop(args):
    loop = asyncio.get_running_loop()
    u, c = urlsplit(args.url), urlsplit(args.control)
    total = args.warmup + args.outage + args.after
    n = int(total * args.rate)
    results = []  # (sent, done, status)
    events = {}

    # Every request is a distinct operation (its own query string): identical GETs from one
    # address within `client_retry_window` are what the gateway treats as a client's retries
    # of one operation (one attempt each), which is another scenario (bench/multiplication.sh).
    async def one(sent, seq):
        try:
            status, _ = await _http_get(u.hostname, u.port, f"{u.path or '/'}?op={seq}", args.timeout)
        except Exception:  # noqa: BLE001 - any failure is "no answer"
            status = 0
        results.append((sent, loop.time(), status))

    async def control(name, command):
        status, body = await _http_get(c.hostname, c.port, f"{c.path}/{command}", 5)
        if status != 200:
            raise RuntimeError(f"control {command} answered {status}")
        events[name] = (loop.time(), json.loads(body))

    start = loop.time()
    tasks = []
    plan = [(args.warmup, "fail", "fail"), (args.warmup + args.outage, "ok", "ok")]
    for i in range(n):
        at = start + i / args.rate
        while plan and start + plan[0][0] <= at:
            when, name, command = plan.pop(0)
            delay = start + when - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            await control(name, command)
        delay = at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(loop.time(), i)))
    for when, name, command in plan:  # only if the schedule ends before an event
        await control(name, command)
    await asyncio.wait(tasks, timeout=args.timeout + 5)
    final = (await _http_get(c.hostname, c.port, f"{c.path}/stats", 5))[1]

    t_fail, s_fail = events["fail"]
    t_ok, s_ok = events["ok"]
    pre = [r for r in results if r[0] < t_fail]
    outage = [r for r in results if t_fail <= r[0] < t_ok]
    post = [r for r in results if r[0] >= t_ok]
    attempts = s_ok["hits"] - s_fail["hits"]
    by_attempt = [a - b for a, b in zip(s_ok["attempts"], s_fail["attempts"])]
    successes_after = sorted(r[1] for r in results if r[2] == 200 and r[1] >= t_ok)
    first_success = successes_after[0] - t_ok if successes_after else None
    # Full recovery: after this point every request sent after recovery succeeded.
    bad_after = [r[1] for r in post if r[2] != 200]
    full = (max(bad_after) - t_ok) if bad_after else 0.0
    outage_lat = sorted(r[1] - r[0] for r in outage)

    def pct(xs, p):
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None

    out = {
        "label": args.label,
        "rate": args.rate,
        "requests_total": len(results),
        "unfinished": n - len(results),
        "pre_ok": sum(1 for r in pre if r[2] == 200),
        "pre_total": len(pre),
        "outage_requests": len(outage),
        "outage_attempts": attempts,
        "amplification": attempts / len(outage) if outage else None,
        "outage_attempts_by_number": by_attempt,
        "outage_client_statuses": dict(Counter(r[2] for r in outage)),
        "outage_client_p50_s": pct(outage_lat, 0.5),
        "outage_client_p99_s": pct(outage_lat, 0.99),
        "first_success_after_recovery_s": first_success,
        "all_ok_after_s": full,
        "post_statuses": dict(Counter(r[2] for r in post)),
        "backend_final": json.loads(final),
    }
    print(json.dumps(out))


# ---------------------------------------------------------------------------- report


def _median(xs):
    xs = [x for x in xs if x == x]  # drop NaN
    return statistics.median(xs) if xs else float("nan")


def _ratios(by, rounds, a, b, key="rps"):
    """Same-round ratios of `key`, target `a` over target `b`, for the rounds that ran both."""
    return [by[(k, a)][key] / by[(k, b)][key] for k in rounds if (k, a) in by and (k, b) in by]


def _fmt(x, spec):
    if x is None or x != x:
        return "–"
    return format(x, spec)


def _us(x):
    if x != x:
        return "–"
    return f"{x / 1000:.2f} ms" if x >= 1000 else f"{x:.0f} µs"


def summarize(outdir):
    raw = os.path.join(outdir, "raw")
    meta = {}
    with open(os.path.join(raw, "meta.env"), encoding="utf-8") as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            meta[k] = v
    rows = []
    with open(os.path.join(raw, "runs.tsv"), encoding="utf-8") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 10 or p[0] == "phase":
                continue
            rows.append(
                dict(
                    phase=p[0], round=int(p[1]), target=p[2], group=p[3], rps=float(p[4]),
                    p50=float(p[5]), p99=float(p[6]), requests=int(p[7]), non2xx=int(p[8]),
                    errors=int(p[9]),
                )
            )
    # A wrk run that completed no request at all (seen when the shared machine stalls the
    # client for seconds) carries no measurement: dropped from medians and ratios, listed below.
    failed = [r for r in rows if r["requests"] == 0]
    rows = [r for r in rows if r["requests"] > 0]
    ref = {"get": ("nginx", "direct"), "post": ("nginx-post", "direct-post")}
    out = []
    w = out.append
    w(f"## Portcullis benchmark — {meta.get('date', '?')}\n")
    if failed:
        w("Runs that completed no request (excluded): "
          + ", ".join(f"{r['phase']} round {r['round']} {r['target']}" for r in failed) + ".\n")
    w(
        f"HEAD at run time `{meta.get('commit', '?')}`{' (+ uncommitted changes in the work tree)' if meta.get('dirty') == '1' else ''}, "
        f"`portcullis` binary built {meta.get('binary_built', '?')}; "
        f"{meta.get('cpu', '?')}, nproc {meta.get('nproc', '?')}; load generator `taskset -c "
        f"{meta.get('client_cpu')}`, system under test `taskset -c {meta.get('sut_cpu')}`; "
        f"Portcullis `worker_threads = 1`, nginx `worker_processes 1`, HAProxy `nbthread 1`, Caddy "
        f"`GOMAXPROCS=1`, pingora `threads: 1`, bench-upstream 1 thread (peers present: "
        f"{meta.get('peers', 'nginx')}; {meta.get('nginx', '')}; {meta.get('haproxy', '') or 'no HAProxy'}; "
        f"Caddy {meta.get('caddy', '') or 'absent'}; pingora {meta.get('pingora', '?')}).\n"
    )

    for phase, title, note in (
        (
            "tput",
            "Throughput (closed loop)",
            f"wrk -t1 -c{meta.get('conns')} -d{meta.get('duration')}s --latency, "
            f"{meta.get('rounds')} rounds, targets rotated each round (order reversed on even rounds). "
            "Values are medians over rounds; ratios are medians of same-round ratios. "
            "Closed loop: p50 ≈ connections / throughput, so latency here mostly mirrors throughput.",
        ),
        (
            "lat",
            "Latency at equal offered load (paced)",
            f"wrk -t1 -c{meta.get('lat_conns')} with a {meta.get('lat_delay_ms')} ms pause before each "
            f"request on a connection (offered ≈ {int(meta.get('lat_conns', 0)) * 1000 // max(1, int(meta.get('lat_delay_ms', 1)))} req/s), "
            f"{meta.get('lat_rounds')} rounds × {meta.get('lat_duration')} s. Not a true open loop "
            "(no wrk2/oha here): a stalled connection stops offering load, so tails are understated.",
        ),
    ):
        prow = [r for r in rows if r["phase"] == phase]
        if not prow:
            continue
        w(f"\n### {title}\n\n{note}\n")
        w("| target | req/s | p50 | p99 | × nginx (req/s) | × direct (req/s) | p99 × nginx | non-2xx / socket errors |")
        w("|---|---:|---:|---:|---:|---:|---:|---:|")
        targets = []
        for r in prow:
            if r["target"] not in targets:
                targets.append(r["target"])
        by = {(r["round"], r["target"]): r for r in prow}
        rounds = sorted({r["round"] for r in prow})
        for t in targets:
            mine = [r for r in prow if r["target"] == t]
            group = mine[0]["group"]
            ngx, direct = ref[group]
            rx_n = _ratios(by, rounds, t, ngx)
            rx_d = _ratios(by, rounds, t, direct)
            px_n = _ratios(by, rounds, t, ngx, "p99")
            bad = sum(r["non2xx"] for r in mine), sum(r["errors"] for r in mine)
            w(
                f"| {t} | {_median([r['rps'] for r in mine]):,.0f} | {_us(_median([r['p50'] for r in mine]))} | "
                f"{_us(_median([r['p99'] for r in mine]))} | {_fmt(_median(rx_n), '.2f')} | {_fmt(_median(rx_d), '.2f')} | "
                f"{_fmt(_median(px_n), '.2f')} | {bad[0]} / {bad[1]} |"
            )
        if phase == "tput":
            keyed = [t for t in targets if t.startswith("pc-keyed")]
            if keyed and "pc-unkeyed" in targets:
                w("\nKeyed POST (unique `Idempotency-Key` per request, every request a first execution) "
                  "vs unkeyed POST through the same route (same wrk script, an `X-Bench-Seq` header of the same size instead of the key):\n")
                w("| target | × pc-unkeyed (median of same-round ratios) | min–max over rounds | goal |")
                w("|---|---:|---:|---|")
                for t in keyed:
                    xs = _ratios(by, rounds, t, "pc-unkeyed")
                    goal = "≥ 0.80" if t == "pc-keyed-mem" else "(no goal; reported)"
                    verdict = ""
                    if t == "pc-keyed-mem" and xs:
                        verdict = " — met" if _median(xs) >= 0.8 else " — **missed**"
                    w(f"| {t} | {_median(xs):.2f} | {min(xs):.2f}–{max(xs):.2f} | {goal}{verdict} |")
            if "pc-pass-je" in targets and "pc-pass" in targets:
                xs = _ratios(by, rounds, "pc-pass-je", "pc-pass")
                w(f"\nAllocator A/B: pc-pass-je (same binary, `LD_PRELOAD` jemalloc) / pc-pass (glibc malloc) = "
                  f"{_median(xs):.2f} (median of same-round ratios, {min(xs):.2f}–{max(xs):.2f}).")
            if "pc-pass" in targets and "nginx" in targets:
                xs = _ratios(by, rounds, "pc-pass", "nginx")
                w(f"\nPass-through goal: req/s ≥ 1.00 × nginx → measured {_median(xs):.2f} × "
                  f"({'met' if _median(xs) >= 1.0 else '**missed**'}).")
            peers = [t for t in ("nginx", "haproxy", "caddy", "pingora", "floor-pooled", "floor-dedicated")
                     if t in targets]
            if "pc-pass" in targets and len(peers) > 1:
                w("\nPass-through against every peer (GET, same rounds; medians of same-round ratios, "
                  "min–max over rounds):\n")
                w("| proxy | req/s | p99 | × nginx | pc-pass × this proxy |")
                w("|---|---:|---:|---:|---:|")
                for t in peers + ["pc-pass"]:
                    mine = [r for r in prow if r["target"] == t]
                    xs = _ratios(by, rounds, t, "nginx")
                    ys = _ratios(by, rounds, "pc-pass", t)
                    span = lambda v: f"{_median(v):.2f} ({min(v):.2f}–{max(v):.2f})" if v else "–"
                    w(f"| {t} | {_median([r['rps'] for r in mine]):,.0f} | {_us(_median([r['p99'] for r in mine]))} | "
                      f"{span(xs)} | {span(ys) if t != 'pc-pass' else '1.00'} |")
            floors = [t for t in ("floor-pooled", "floor-dedicated") if t in targets and "nginx" in targets]
            if floors:
                w("\nThe floor (`--floor`: `bench-bareproxy`, hyper's server and client with nothing between "
                  "them), median of same-round ratios:\n")
                w("| target | × nginx | pc-pass × this floor |")
                w("|---|---:|---:|")
                for t in floors:
                    xs = _ratios(by, rounds, t, "nginx")
                    ys = _ratios(by, rounds, "pc-pass", t)
                    w(f"| {t} | {_median(xs):.2f} | {_median(ys):.2f} |")
        if phase == "lat" and "pc-pass" in targets and "nginx" in targets:
            xs = _ratios(by, rounds, "pc-pass", "nginx", "p99")
            w(f"\nPass-through goal: p99 ≤ 1.2 × nginx at equal load → measured {_median(xs):.2f} × "
              f"({'met' if _median(xs) <= 1.2 else '**missed**'}).")

    _rate_limit_section(w, rows, raw, meta)

    write_latency_svg(os.path.join(outdir, "latency.svg"), rows)
    w("\n![Latency percentiles by mode](latency.svg)\n")

    rss = os.path.join(raw, "rss.tsv")
    if os.path.exists(rss):
        w("\n### Peak memory (VmHWM at the end of the run)\n")
        w("| process | what it served | VmHWM | VmRSS at end |")
        w("|---|---|---:|---:|")
        with open(rss, encoding="utf-8") as f:
            for line in f:
                name, what, hwm, cur = line.rstrip("\n").split("\t")
                w(f"| {name} | {what} | {int(hwm) / 1024:.1f} MiB | {int(cur) / 1024:.1f} MiB |")

        m = meta
        try:
            recs = int(m.get("keyed_mem_requests") or 0)
            hwm = {}
            with open(rss, encoding="utf-8") as f:
                for line in f:
                    name, _, h, _ = line.rstrip("\n").split("\t")
                    hwm[name] = int(h) * 1024
            base = hwm.get("portcullis gw-pass", 0)
            grow = hwm.get("portcullis gw-mem", 0) - base
            stored = float(m.get("mem_stored_bytes") or "nan")
            w(
                f"\nMemory idempotency store: {recs:,} keyed first executions went to gw-mem (all keys unique, "
                f"kept 24 h); the store's own accounting (`idempotency_stored_bytes`) says {stored / 2**20:.1f} MiB "
                f"(bound `memory_max_bytes` = {int(m.get('memory_max_bytes') or 0) / 2**20:,.0f} MiB, set so that "
                f"nothing is refused), evictions {m.get('mem_evictions', '?')}; the process grew "
                f"{grow / 2**20:.0f} MiB over the pass-through gateway's peak, i.e. ≈ {grow / max(recs, 1):,.0f} B of "
                f"RSS per record vs ≈ {stored / max(recs, 1):,.0f} B accounted."
            )
            rl_recs = int(m.get("rl_mem_keyed_requests") or 0)
            if rl_recs and "portcullis gw-rl-mem" in hwm:
                rl_grow = hwm["portcullis gw-rl-mem"] - hwm.get("portcullis gw-rl", base)
                rl_stored = float(m.get("rl_mem_stored_bytes") or "nan")
                w(
                    f"gw-rl-mem (local rate limit + memory store): {rl_recs:,} keyed first executions, "
                    f"`idempotency_stored_bytes` {rl_stored / 2**20:.1f} MiB, peak RSS "
                    f"{hwm['portcullis gw-rl-mem'] / 2**20:.0f} MiB, {rl_grow / 2**20:.0f} MiB over the rate-limit-only "
                    f"gateway, ≈ {rl_grow / max(rl_recs, 1):,.0f} B of RSS per record."
                )
            rk, rm = int(m.get("redis_keys") or 0), int(m.get("redis_used_memory") or 0)
            if rk:
                w(f"Redis: {rk:,} keys, used_memory {rm / 2**20:.1f} MiB (≈ {rm / rk:,.0f} B per key). "
                  f"PostgreSQL: {m.get('pg_records', '?')} rows, table + indexes {int(m.get('pg_table_bytes') or 0) / 2**20:.1f} MiB.")
        except (ValueError, OSError):
            pass
        growth = os.path.join(raw, "mem-growth.tsv")
        if os.path.exists(growth):
            w("\nRSS of the memory-store gateways after each throughput run (cumulative keyed first "
              "executions, incl. the warm-up; VmRSS; the store's `idempotency_stored_bytes`):\n")
            w("| target | after round | records | VmRSS | stored (accounted) | RSS growth since previous row per new record |")
            w("|---|---:|---:|---:|---:|---:|")
            prev = {}
            with open(growth, encoding="utf-8") as f:
                for ln in f:
                    t, rd, n, rss_kb, stored = ln.rstrip("\n").split("\t")
                    n, rss_b, stored = int(n), int(rss_kb or 0) * 1024, float(stored or 0)
                    slope = "–"
                    if t in prev and n > prev[t][0]:
                        slope = f"{(rss_b - prev[t][1]) / (n - prev[t][0]):,.0f} B"
                    prev[t] = (n, rss_b)
                    w(f"| {t} | {rd} | {n:,} | {rss_b / 2**20:.1f} MiB | {stored / 2**20:.1f} MiB | {slope} |")
        w(f"\nLoad average (all processes on the machine, not only this benchmark): "
          f"{m.get('loadavg_start', '?')} at the start, {m.get('loadavg_end', '?')} at the end.")

    for frag in ("openloop.md", "roundtrips.md", "rl-roundtrips.md", "pg-anchor.md", "amplification.md", "profile.md"):
        p = os.path.join(outdir, frag)
        if os.path.exists(p):
            with open(p, encoding="utf-8") as f:
                w("\n" + f.read().rstrip("\n"))
    print("\n".join(out))


def write_latency_svg(path, rows):
    """Latency percentiles by mode as an SVG bar chart (no plotting library needed): for each
    phase, one row per target with its median p50 and p99 over rounds, on a log scale."""
    import math

    phases = [("tput", "closed loop, wrk -c64"), ("lat", "equal offered load (paced)")]
    blocks = []
    for phase, label in phases:
        prow = [r for r in rows if r["phase"] == phase]
        targets = []
        for r in prow:
            if r["target"] not in targets:
                targets.append(r["target"])
        if targets:
            stats = [(t, _median([r["p50"] for r in prow if r["target"] == t]),
                      _median([r["p99"] for r in prow if r["target"] == t])) for t in targets]
            blocks.append((label, stats))
    if not blocks:
        return
    lo, hi = 50.0, max(p99 for _, stats in blocks for _, _, p99 in stats) * 1.5
    left, width, row_h = 150, 560, 26
    def x(us):
        us = max(lo, us)
        return left + width * (math.log10(us) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    height = 60 + sum(40 + row_h * len(stats) for _, stats in blocks)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 120}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           '<text x="10" y="20" font-size="15">Latency by mode: p50 (dark) and p99 (light), µs, log scale</text>']
    y = 40
    for label, stats in blocks:
        out.append(f'<text x="10" y="{y + 14}" font-weight="bold">{label}</text>')
        y += 24
        for t, p50, p99 in stats:
            out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{t}</text>')
            out.append(f'<rect x="{left}" y="{y + 3}" width="{x(p99) - left:.1f}" height="16" fill="#9ecae1"/>')
            out.append(f'<rect x="{left}" y="{y + 7}" width="{x(p50) - left:.1f}" height="8" fill="#3182bd"/>')
            out.append(f'<text x="{x(p99) + 4:.1f}" y="{y + 15}">{p50:,.0f} / {p99:,.0f}</text>')
            y += row_h
        y += 16
    for tick in (100, 1000, 10000, 100000):
        if lo <= tick <= hi:
            out.append(f'<line x1="{x(tick):.1f}" y1="30" x2="{x(tick):.1f}" y2="{height - 10}" stroke="#ccc"/>')
            out.append(f'<text x="{x(tick):.1f}" y="{height - 2}" text-anchor="middle" fill="#666">{tick:,} µs</text>')
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


def _same_round(rows, phase, a, b, key="rps"):
    by = {(r["round"], r["target"]): r for r in rows if r["phase"] == phase}
    rounds = sorted({k for k, _ in by})
    return [by[(k, a)][key] / by[(k, b)][key] for k in rounds if (k, a) in by and (k, b) in by and by[(k, b)][key]]


def _rate_limit_section(w, rows, raw, meta):
    names = {r["target"] for r in rows}
    if "pc-rl-local" not in names:
        return
    w("\n### Rate limiting\n")
    w(
        "`pc-rl-local`: GET through a gateway whose one tenant (`Authorization: Bearer <key>`) and "
        "`[rate_limit] global` bucket have rate = burst = 10⁶ per second (far above the load; the limiter accepts up to 10⁹), state in memory — every request is "
        "decided (tenant + global bucket, all-or-nothing) and admitted. `pc-rl-keyed-mem`: keyed POSTs "
        "(unique `Idempotency-Key`) through the same kind of gateway with the memory idempotency store. "
        "`pc-rl-redis` / `pc-rl-keyed-redis`: the same two through one gateway with `storage.state` = "
        "Redis (rate limit and idempotency in the harness's own redis-server). `nginx-limit` / "
        "`nginx-limit-post`: nginx `proxy_pass` + `limit_req` (rate 10⁶ r/s, burst 100000 nodelay, one "
        "hot key), sent the same `Authorization` header. Ratios are medians of same-round ratios "
        "(min–max over rounds); p99 ratios under *paced* are at equal offered load.\n"
    )
    w("| comparison | measured | min–max | goal | verdict |")
    w("|---|---:|---:|---|---|")

    def line(label, xs, goal=None, le=False):
        if not xs:
            return
        med = _median(xs)
        verdict = ""
        if goal is not None:
            ok = med <= goal if le else med >= goal
            verdict = "met" if ok else "**missed**"
        g = "–" if goal is None else (f"≤ {goal:.2f} ×" if le else f"≥ {goal:.2f} ×")
        w(f"| {label} | {med:.2f} × | {min(xs):.2f}–{max(xs):.2f} | {g} | {verdict} |")

    line("local rate limit / pass-through (GET req/s)", _same_round(rows, "tput", "pc-rl-local", "pc-pass"), 0.9)
    line("local rate limit / nginx + limit_req (GET req/s)", _same_round(rows, "tput", "pc-rl-local", "nginx-limit"))
    line("local rate limit p99 / nginx + limit_req p99 (GET, paced)", _same_round(rows, "lat", "pc-rl-local", "nginx-limit", "p99"))
    line("local rate limit + idempotency (memory) / nginx + limit_req (POST req/s)",
         _same_round(rows, "tput", "pc-rl-keyed-mem", "nginx-limit-post"), 1.0)
    line("… p99 / nginx + limit_req p99 (POST, paced, equal offered load)",
         _same_round(rows, "lat", "pc-rl-keyed-mem", "nginx-limit-post", "p99"), 1.2, le=True)
    line("… p99 / nginx + limit_req p99 (POST, closed loop, each at its own saturation)",
         _same_round(rows, "tput", "pc-rl-keyed-mem", "nginx-limit-post", "p99"), 1.2, le=True)
    line("local rate limit + idempotency (memory) / idempotency (memory) without rate limit (POST req/s)",
         _same_round(rows, "tput", "pc-rl-keyed-mem", "pc-keyed-mem"))
    line("Redis rate limit + Redis idempotency / local rate limit + memory idempotency (keyed POST req/s)",
         _same_round(rows, "tput", "pc-rl-keyed-redis", "pc-rl-keyed-mem"), 0.6)
    line("Redis rate limit / local rate limit (GET req/s)", _same_round(rows, "tput", "pc-rl-redis", "pc-rl-local"))

    load = os.path.join(raw, "rl-redis-load.tsv")
    if os.path.exists(load):
        recs = []
        with open(load, encoding="utf-8") as f:
            for ln in f:
                p = ln.rstrip("\n").split("\t")
                if p[0] == "round" or len(p) < 6:
                    continue
                recs.append([int(float(x)) for x in p])
        if recs:
            rps = [r["rps"] for r in rows if r["phase"] == "tput" and r["target"] == "pc-rl-redis"]
            w(
                f"\nDecisions/s through one gateway (Redis rate limiter, GET, wrk -c{meta.get('conns')}, one "
                f"decision per request, nothing rejected): **{_median(rps):,.0f}** (median over rounds, "
                f"{min(rps):,.0f}–{max(rps):,.0f}).\n"
            )
            w("Redis commands during each `pc-rl-redis` throughput run (`INFO commandstats` and the gateway's "
              "`http_requests_total` / `ratelimit_redis_decision_seconds` counts before and after the run; "
              "wrk's count misses the requests still in flight when it stops):\n")
            w("| round | wrk requests | gateway requests | Redis decisions | EVALSHA | EVALSHA / gateway request | EVALSHA / decision | all Redis commands / request (incl. inside Lua) |")
            w("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for rd, wreq, greq, dec, ev, cmds in recs:
                w(f"| {rd} | {wreq:,} | {greq:,} | {dec:,} | {ev:,} | {ev / max(greq, 1):.4f} | "
                  f"{ev / max(dec, 1):.4f} | {cmds / max(greq, 1):.2f} |")
    w(f"\nRejections (429) by any rate-limited gateway over the whole run: {meta.get('rl_rejected', '?')}; "
      f"fail-open/closed fallback decisions: {meta.get('rl_fallback', '?')}.")


# ---------------------------------------------------------------------------- main


def openloop_summary(tsv, spec, conns, duration, rounds):
    """Markdown table of the open-loop runs: medians over rounds per (target, load), and the
    median of same-round p99 ratios Portcullis / nginx."""
    runs = {}
    with open(tsv, encoding="utf-8") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            if len(p) < 5:
                continue
            try:
                d = json.loads(p[4])
            except ValueError:
                continue
            runs[(int(p[0]), p[1], int(p[2]))] = d
    out = ["### Latency at equal offered load (open loop)", "",
           f"`bench-openloop` (`tests/support/src/bin/bench-openloop.rs`, CPU 0, {conns} connections, 1 s warm-up then "
           f"{duration} s measured, {rounds} round(s)): requests at a fixed rate, connection k of C sending its j-th "
           "request at start + (j·C + k) / rate; latency from that *intended* time to the end of the response, so "
           "a stall is charged to every request it delayed (coordinated omission corrected, as wrk2 does). Rates are "
           "25, 50 and 75 % of the saturation rate the nginx reference reached in this run's throughput rounds "
           "(median). Medians over rounds; p99 × nginx = median of same-round ratios. *Missed* = requests due "
           "before the end but never sent (their connection was still waiting), counted with their wait so far.", "",
           "| mode | load | offered req/s | nginx p50 / p99 / p99.9 | Portcullis p50 / p99 / p99.9 | p99 × nginx | Portcullis achieved req/s | non-2xx / errors / missed (nginx; Portcullis) |",
           "|---|---:|---:|---|---|---:|---:|---|"]
    rnds = sorted({k[0] for k in runs})
    for item in filter(None, spec.split(";")):
        mode, ref, pc, sat = item.split("|")
        for pct in sorted({k[2] for k in runs}):
            def med(t, key):
                return _median([runs[(r, t, pct)][key] for r in rnds if (r, t, pct) in runs])
            def bad(t):
                xs = [runs[(r, t, pct)] for r in rnds if (r, t, pct) in runs]
                return f"{sum(x['non2xx'] for x in xs)} / {sum(x['errors'] for x in xs)} / {sum(x['missed'] for x in xs)}"
            ratio = [runs[(r, pc, pct)]["p99_us"] / runs[(r, ref, pct)]["p99_us"] for r in rnds
                     if (r, pc, pct) in runs and (r, ref, pct) in runs and runs[(r, ref, pct)]["p99_us"] > 0]
            offered = med(ref, "offered_rps")
            if offered != offered:
                continue
            trip = lambda t: " / ".join(_us(med(t, k)) for k in ("p50_us", "p99_us", "p999_us"))
            out.append(f"| {mode} ({pc} vs {ref}) | {pct} % of {int(sat):,} | {offered:,.0f} | {trip(ref)} | {trip(pc)} | "
                       f"{_fmt(_median(ratio), '.2f')} | {med(pc, 'achieved_rps'):,.0f} | {bad(ref)}; {bad(pc)} |")
    print("\n".join(out))


# ---------------------------------------------------------------------------- fixed-count client

# A JSON body of exactly 62 bytes, as round 1 of the hot-path session measured.
FIXED_BODY = b'{"item":"widget","quantity":3,"note":"portcullis bench 00001"}'


async def _read_response(reader):
    """Reads one HTTP/1.1 response (Content-Length or chunked); returns the status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length, chunked = 0, False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        for _ in range(1_000_000):  # bounded: a chunked body of at most 10^6 chunks
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _fixed(args):
    """Exactly args.count requests over args.conns keep-alive connections, one at a time each."""
    counts = Counter()
    next_seq = iter(range(args.count))
    auth = f"Authorization: Bearer {args.auth}\r\n" if args.auth else ""
    body = FIXED_BODY
    if args.body is not None:
        head, tail = b'{"event":"bench","data":"', b'"}'
        body = head + b"x" * max(0, args.body - len(head) - len(tail)) + tail

    def ok(status):
        return status == args.status if args.status else 200 <= status < 300

    def request(seq):
        if args.method == "GET":
            return f"GET {args.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode()
        key = f"Idempotency-Key: {args.key_prefix}-{seq}\r\n" if args.key_prefix else ""
        return (
            f"POST {args.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{key}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    async def conn():
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
        try:
            for seq in next_seq:
                writer.write(request(seq))
                status = await asyncio.wait_for(_read_response(reader), args.timeout)
                counts["ok" if ok(status) else "other"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(conn() for _ in range(args.conns)))
    print(f"{args.count}\t{counts['ok']}\t{counts['other']}")
    if counts["ok"] != args.count:
        sys.exit(f"fixed: {counts['other']} of {args.count} answers were not {args.status or '2xx'}")



def main():
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "parse-wrk":
        rps, p50, p99, req, non2xx, err = parse_wrk(args[0])
        print(f"{rps:.1f}\t{p50:.1f}\t{p99:.1f}\t{req}\t{non2xx}\t{err}")
    elif cmd == "delta-cmdstats":
        b, a, n = read_cmdstats(args[0]), read_cmdstats(args[1]), int(args[2])
        d = {k: a.get(k, 0) - b.get(k, 0) for k in a}
        d = {k: v for k, v in d.items() if v > 0 and k != "info"}
        evals = sum(v for k, v in d.items() if k in ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"))
        detail = ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
        print(f"{evals / n:.2f}\t{sum(d.values()) / n:.2f}\t{detail}")
    elif cmd == "delta-segs":
        per, total = delta_segs(args[0], args[1], int(args[2]))
        print(f"{per:.2f}\t{total}")
    elif cmd == "strace-summary":
        calls = {}
        with open(args[0], encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 5 and re.match(r"^[\d.]+$", fields[0]) and fields[3].isdigit():
                    if fields[-1] != "total":
                        calls[fields[-1]] = int(fields[3])
        n = int(args[1])
        top = sorted(calls.items(), key=lambda kv: -kv[1])[:5]
        print(f"{sum(calls.values()) / n:.2f}\t" + ", ".join(f"{k} {v / n:.2f}" for k, v in top))
    elif cmd == "openloop-summary":
        openloop_summary(args[0], args[1], args[2], args[3], args[4])
    elif cmd == "openloop":
        import argparse

        ap = argparse.ArgumentParser(prog="benchtool.py openloop")
        ap.add_argument("--url", required=True)
        ap.add_argument("--control", required=True, help="http://127.0.0.1:P/__bench")
        ap.add_argument("--rate", type=float, default=200)
        ap.add_argument("--warmup", type=float, default=5)
        ap.add_argument("--outage", type=float, default=20)
        ap.add_argument("--after", type=float, default=15)
        ap.add_argument("--timeout", type=float, default=10)
        ap.add_argument("--label", default="")
        a = ap.parse_args(args)
        if a.rate <= 0 or a.rate > 2000 or a.warmup + a.outage + a.after > 300:
            sys.exit("openloop: rate must be in (0, 2000] and the schedule ≤ 300 s")
        asyncio.run(_openloop(a))
    elif cmd == "fixed":
        import argparse

        ap = argparse.ArgumentParser(prog="benchtool.py fixed")
        ap.add_argument("--port", type=int, required=True)
        ap.add_argument("--count", type=int, required=True)
        ap.add_argument("--conns", type=int, default=8)
        ap.add_argument("--method", choices=("GET", "POST"), default="GET")
        ap.add_argument("--path", default="/x")
        ap.add_argument("--auth", default="", help="bearer token")
        ap.add_argument("--key-prefix", default="", help="send Idempotency-Key: PREFIX-SEQ")
        ap.add_argument("--timeout", type=float, default=60)
        ap.add_argument("--body", type=int, default=None,
                        help="POST a JSON body of this many bytes instead of the fixed 62")
        ap.add_argument("--status", type=int, default=0, help="count only this status as ok")
        a = ap.parse_args(args)
        if not (0 < a.count <= 1_000_000 and 0 < a.conns <= 256):
            sys.exit("fixed: count must be in 1..=10^6 and conns in 1..=256")
        asyncio.run(_fixed(a))
    elif cmd == "summarize":
        summarize(args[0])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
