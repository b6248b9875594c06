#!/usr/bin/env python3
"""The checkout stays as documented and as the tests found it.

  source_tree_check.py layout ROOT
      Every file and folder committed at the top of the repository is in the
      layout the README documents (the first column of its "What is here"
      table) or is one of the usual top-level files (README.md, LICENSE, the
      dot files of git and the editors); and every path that table names
      exists.
  source_tree_check.py snapshot ROOT FILE
  source_tree_check.py compare ROOT FILE
      What is in the checkout that git does not track (ignored files
      included, build and environment folders as one entry), before and
      after the suite (scripts/test.sh, around every configuration): a test
      that writes into the source tree instead of its own temporary
      directory fails the second, which names what it left.

Prints `N passed, N failed`.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checks  # noqa: E402
from checks import check  # noqa: E402

USUAL = {"README.md", "LICENSE", "LICENSE.txt", "NOTICE", "CONTRIBUTING.md", "SECURITY.md", "CHANGELOG.md",
         ".gitignore", ".gitattributes", ".gitmodules", ".clang-format", ".clang-tidy", ".dockerignore",
         ".editorconfig", ".github"}
# Not what a test writes: Python's byte-code caches, and the build folders
# and the environment scripts/test.sh itself makes (.gitignore lists them).
TRANSIENT = re.compile(r"(^|/)(__pycache__/|[^/]*\.pyc$)|^(build[^/]*|\.venv|\.cache)/$")



def git(root, *args):
    return subprocess.run(["git", "-C", root] + list(args), check=True, stdout=subprocess.PIPE, text=True).stdout


def documented(root):
    """The paths the README's "What is here" table names in its first column."""
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    m = re.search(r"^## What is here\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return None
    paths = set()
    for line in m.group(1).splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            paths.update(p.rstrip("/") for p in re.findall(r"`([^`]+)`", cells[1]))
    return paths


def layout(root):
    paths = documented(root)
    if not check("README.md has a \"What is here\" table", bool(paths)):
        return
    top = sorted({p.split("/")[0] for p in git(root, "ls-files", "-z").split("\0") if p})
    extra = [p for p in top if p not in paths and p not in USUAL]
    check("every committed top-level entry (%d) is in README's layout or a usual top-level file" % len(top),
          not extra, "not documented: %s\n(add a row to README.md's \"What is here\", or remove it)" % ", ".join(extra))
    missing = sorted(p for p in paths if "/" not in p and not os.path.exists(os.path.join(root, p)))
    check("every top-level path README's layout names exists", not missing, "missing: %s" % ", ".join(missing))


def untracked(root):
    out = git(root, "status", "--porcelain=v1", "-z", "--ignored=matching", "--untracked-files=all")
    return sorted({e[3:] for e in out.split("\0") if e[:2] in ("??", "!!") and not TRANSIENT.search(e[3:])})


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("layout", "snapshot", "compare"):
        print(__doc__)
        return 2
    mode, root = sys.argv[1], os.path.realpath(sys.argv[2])
    if mode == "layout":
        layout(root)
    elif mode == "snapshot":
        with open(sys.argv[3], "w") as f:
            f.write("\n".join(untracked(root)) + "\n")
        check("what git does not track in the checkout, before the tests (%d entries)" % len(untracked(root)), True)
    else:
        try:
            with open(sys.argv[3]) as f:
                before = set(f.read().split("\n")) - {""}
        except OSError:
            before = None
        if check("the snapshot from before the tests is there", before is not None, sys.argv[3]):
            left = [p for p in untracked(root) if p not in before]
            check("the tests left nothing in the source tree", not left,
                  "new since the tests started (a test must write under its own temporary directory):\n" +
                  "\n".join(left))
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
