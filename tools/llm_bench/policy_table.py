#!/usr/bin/env python3
"""Markdown tables from wm_llm_bench --json files: accuracy per task, budget and policy.

    python3 tools/llm_bench/policy_table.py RUN.json [RUN.json ...] [--metrics]

Prints one table of accuracy (Wilson 95% interval in brackets) with a row per task, context and
budget and a column per policy (the full cache in its own column), and with --metrics a second
table per policy and budget: KL from the full cache, peak KV tokens per layer, window MiB, TTFT
and decode speed, averaged over the tasks given. Standard library only.
"""
import argparse
import json
import sys
from collections import OrderedDict


def load(paths):
    rows, split = [], set()
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                j = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit(f"policy_table: cannot read {p}: {e}")
        if not isinstance(j, dict) or not isinstance(j.get("results"), list):
            sys.exit(f"policy_table: {p} is not a wm_llm_bench --json file (no 'results' list)")
        rows.extend(j["results"])
        s = j.get("samples", {})
        if isinstance(s, dict) and "split" in s:
            split.add(str(s["split"]))
    return rows, split


def pct(r):
    lo, hi = r["wilson95"]
    return f"{100 * r['accuracy']:.0f}% [{100 * lo:.0f}-{100 * hi:.0f}]"


def accuracy_table(rows):
    policies = list(OrderedDict.fromkeys(r["policy"] for r in rows if r["policy"] != "full"))
    full = {(r["task"], r["context"]): r for r in rows if r["policy"] == "full"}
    cells = {(r["task"], r["context"], r["budget"], r["policy"]): r for r in rows}
    keys = list(OrderedDict.fromkeys((r["task"], r["context"], r["budget"]) for r in rows if r["policy"] != "full"))
    if not policies:  # the full cache alone: a row per task and context
        out = ["| task | context | answers | full |", "|---|---|---|---|"]
        out += [f"| {t} | {c} | {r['answers']} | {pct(r)} |" for (t, c), r in full.items()]
        return "\n".join(out)
    out = ["| task | context | budget | answers | full | " + " | ".join(policies) + " |",
           "|---|---|---|---|---|" + "---|" * len(policies)]
    for task, ctx, budget in keys:
        f = full.get((task, ctx))
        n = next(cells[(task, ctx, budget, p)]["answers"] for p in policies if (task, ctx, budget, p) in cells)
        line = [task, str(ctx), budget, str(n), pct(f) if f else "-"]
        line += [pct(cells[(task, ctx, budget, p)]) if (task, ctx, budget, p) in cells else "-" for p in policies]
        out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def metrics_table(rows):
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["policy"], r["budget"]), []).append(r)

    def mean(rs, key):
        v = [r[key] for r in rs if r.get(key) is not None]
        return sum(v) / len(v) if v else None

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    out = ["| policy | budget | accuracy (mean over tasks) | KL from full | peak KV tokens | window MiB | TTFT ms | decode tok/s |",
           "|---|---|---|---|---|---|---|---|"]
    for (policy, budget), rs in groups.items():
        mib = mean(rs, "peak_window_bytes")
        out.append("| " + " | ".join([
            policy, budget, fmt(100 * mean(rs, "accuracy"), ".1f") + "%", fmt(mean(rs, "kl_from_full"), ".3f"),
            fmt(mean(rs, "peak_kv_tokens"), ".0f"), fmt(mib / 2**20 if mib is not None else None, ".1f"),
            fmt(mean(rs, "ttft_ms"), ".0f"), fmt(mean(rs, "decode_tokens_per_s"), ".0f")]) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="wm_llm_bench --json files")
    ap.add_argument("--metrics", action="store_true", help="also the per-policy metrics table")
    a = ap.parse_args()
    rows, split = load(a.runs)
    if not rows:
        sys.exit("policy_table: no results in the files given")
    if split:
        print(f"split: {', '.join(sorted(split))}\n")
    print(accuracy_table(rows))
    if a.metrics:
        print()
        print(metrics_table(rows))


if __name__ == "__main__":
    main()
