"""The common part of the Python end-to-end checks, as shell_checks.sh is
for the shell ones:

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "testing"))
    import checks
    checks.check("what holds", ok, "what to show when it does not")
    sys.exit(checks.finish())   # prints "N passed, N failed"; 1 if any failed
"""
import sys

passed = failed = 0


def check(name, ok, detail=""):
    """Counts `ok` (true: "ok   NAME"; false: "FAIL NAME" and the detail,
    indented) and returns it."""
    global passed, failed
    if ok:
        passed += 1
        print("ok   " + name)
    else:
        failed += 1
        print("FAIL " + name + (("\n     " + str(detail).replace("\n", "\n     ")) if detail else ""))
    sys.stdout.flush()
    return ok


def finish():
    """Prints "N passed, N failed"; returns the exit code (1 if any failed)."""
    print("%d passed, %d failed" % (passed, failed))
    sys.stdout.flush()
    return 0 if failed == 0 else 1
