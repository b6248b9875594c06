"""Checks the Grafana dashboard (charts/meshload/files/dashboards/meshload.json).

Static checks: the dashboard's shape (ids, grid, data source variable,
targets), and every meshload_ metric it reads is one the docs list.
With --prometheus URL, against a real Prometheus that scrapes live sidecars:
every query (the template variables set to match everything) is valid
PromQL, and returns data whenever every metric it reads is being scraped.

usage: dashboard_check.py REPO_ROOT [--prometheus http://127.0.0.1:PORT]
Prints one line per check and "N passed, N failed"; exits 1 on a failure.
"""
import json
import os
import re
import sys
import urllib.parse
import urllib.request

ROOT = sys.argv[1]
PROM = sys.argv[sys.argv.index("--prometheus") + 1] if "--prometheus" in sys.argv else None
results = {"passed": 0, "failed": 0}


def check(name, problems):
    ok = not problems
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name)
    for p in problems if not ok else []:
        print("     " + str(p))


dash = json.load(open(os.path.join(ROOT, "charts/meshload/files/dashboards/meshload.json")))
panels = dash["panels"]
targets = [(p["title"], t) for p in panels for t in p.get("targets", [])]
variables = {v["name"]: v for v in dash["templating"]["list"]}


def shape_problems():
    p = []
    ids = [x["id"] for x in panels]
    if len(set(ids)) != len(ids):
        p.append("panel ids repeat")
    if not dash.get("uid") or not dash.get("title"):
        p.append("no uid or title")
    if variables.get("datasource", {}).get("type") != "datasource":
        p.append("no data source variable")
    for x in panels:
        g = x["gridPos"]
        if g["x"] < 0 or g["w"] <= 0 or g["x"] + g["w"] > 24:
            p.append("%s: gridPos %r is outside the 24 columns" % (x["title"], g))
        if x["type"] == "row":
            continue
        if x.get("datasource", {}).get("uid") != "${datasource}":
            p.append("%s: not on the data source variable" % x["title"])
        if not x.get("targets"):
            p.append("%s: no query" % x["title"])
        if not x.get("description"):
            p.append("%s: no description" % x["title"])
    for title, t in targets:
        if not t.get("expr") or not t.get("refId"):
            p.append("%s: a target without expr or refId" % title)
    # Panels must not overlap.
    cells = {}
    for x in panels:
        g = x["gridPos"]
        for yy in range(g["y"], g["y"] + g["h"]):
            for xx in range(g["x"], g["x"] + g["w"]):
                if (xx, yy) in cells:
                    p.append("%s overlaps %s" % (x["title"], cells[(xx, yy)]))
                    break
                cells[(xx, yy)] = x["title"]
            else:
                continue
            break
    return p


check("the dashboard has unique panel ids, a data source variable, panels inside the grid that do not overlap, "
      "a query and a description on every panel", shape_problems())

def metrics_of(expr):
    names = set()
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)", expr):
        names.add(m.group(1))
    for m in re.finditer(r"\b(meshload_[a-z_]+)\b", expr):
        names.add(m.group(1))
    return {n for n in names if n not in ("by", "on", "without", "group_left", "group_right", "ignoring")}


def base(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.startswith("meshload_") and "_seconds" in name:
            return name[: -len(suffix)]
    return name


docs = ""
for f in ("docs/operations.md", "docs/controller.md"):
    docs += open(os.path.join(ROOT, f)).read()
documented = set(re.findall(r"`(meshload_[a-z_]+)`", docs))
used = {base(n) for _, t in targets for n in metrics_of(t["expr"]) if n.startswith("meshload_")}
used |= {base(n) for v in variables.values() for n in metrics_of(json.dumps(v.get("query", ""))) if n.startswith("meshload_")}
check("every meshload_ metric the dashboard reads is documented in docs/operations.md or docs/controller.md "
      "(%d metrics)" % len(used), sorted(used - documented))

if PROM:
    def query(expr):
        url = PROM + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    def get(path):
        with urllib.request.urlopen(PROM + path, timeout=10) as r:
            return json.load(r)

    live = set(get("/api/v1/label/__name__/values")["data"])

    def substitute(expr):
        for var in ("namespace", "dataloadjob", "pod"):
            expr = expr.replace("$" + var, ".*")
        return expr.replace("$__rate_interval", "10s")

    invalid, empty = [], []
    for title, t in targets:
        expr = substitute(t["expr"])
        r = query(expr)
        if r.get("status") != "success":
            invalid.append("%s: %s: %s" % (title, r.get("error"), expr))
            continue
        needed = metrics_of(t["expr"])
        if needed and needed <= live and not r["data"]["result"]:
            empty.append("%s: no data although %s are scraped: %s" % (title, sorted(needed), expr))
    check("every dashboard query is valid PromQL for a real Prometheus (%d queries)" % len(targets), invalid)
    answered = sum(1 for _, t in targets if metrics_of(t["expr"]) <= live)
    absent = sorted({n for _, t in targets for n in metrics_of(t["expr"])} - live)
    print("note metrics the dashboard reads that this Prometheus does not scrape: " + ", ".join(absent))
    check("every query whose metrics are scraped returns data (%d of %d queries)" % (answered, len(targets)), empty)

    def variable_problems():
        p = []
        for name in ("namespace", "dataloadjob", "pod"):
            q = substitute(variables[name]["query"]["query"])
            m = re.fullmatch(r"label_values\((.*), (\w+)\)", q)
            if not m:
                p.append("%s: not label_values(selector, label): %s" % (name, q))
                continue
            r = get("/api/v1/series?" + urllib.parse.urlencode({"match[]": m.group(1)}))
            values = {s.get(m.group(2)) for s in r["data"]} - {None}
            if not values:
                p.append("%s: %s has no values" % (name, q))
        return p
    check("the namespace, dataloadjob and pod variables list the live sidecars", variable_problems())

print("%d passed, %d failed" % (results["passed"], results["failed"]))
sys.exit(1 if results["failed"] else 0)
