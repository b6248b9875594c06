#!/usr/bin/env python3
"""Claims in docs/ about which formats the product reads, held against the
DataLoadJob's declaration (planner/api/dataloadjob.yaml):

- no page says the sidecar "does not read" a format the declaration offers;
- every paragraph that explains ragged batches ("differ in size") names every
  format whose batches can be ragged: MegatronIndexed, and WebDataset and MDS
  (their fields without a dtype).

    docs_claims_check.py REPO_ROOT     (prints `N passed, N failed`)
"""
import glob
import os
import re
import sys

import yaml

root = sys.argv[1]
results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok or not detail else "\n     " + str(detail)[:2000]))


def find_enum(node, cpp_enum):
    if isinstance(node, dict):
        if node.get("x-cpp-enum") == cpp_enum:
            return node["enum"]
        for v in node.values():
            found = find_enum(v, cpp_enum)
            if found:
                return found
    elif isinstance(node, list):
        for v in node:
            found = find_enum(v, cpp_enum)
            if found:
                return found
    return None


formats = find_enum(yaml.safe_load(open(os.path.join(root, "planner", "api", "dataloadjob.yaml"))), "DatasetFormat")
check("the declaration lists the dataset formats", bool(formats), formats)
ragged_formats = ["MegatronIndexed", "WebDataset", "MDS"]
for page in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
    name = os.path.relpath(page, root)
    paragraphs = re.split(r"\n\s*\n", open(page).read())
    denied = [p for p in paragraphs for f in formats
              if re.search(r"does not (yet )?read %s\b" % f, p.replace("\n", " "))]
    check("%s says the sidecar reads every format it offers" % name, not denied, denied)
    for p in paragraphs:
        flat = p.replace("\n", " ")
        if "differ in size" in flat and "ragged" in flat.lower():
            absent = [f for f in ragged_formats if f not in flat]
            check("%s: the paragraph on ragged batches names %s" % (name, ", ".join(ragged_formats)), not absent,
                  "missing %s in: %s" % (absent, flat[:300]))
print("%d passed, %d failed" % (results["passed"], results["failed"]))
sys.exit(1 if results["failed"] else 0)
