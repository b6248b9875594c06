#!/usr/bin/env python3
"""The README's set-up on a machine nobody prepared.

A Debian 12 root file system made by debootstrap (minbase, exactly as
scripts/build-images --local-bases makes its bases: scripts/lib/debian-base.sh)
gets what every machine of the project's kind has and nothing else:

  - the machine's own CA certificates: each file of /usr/local/share/
    ca-certificates (where update-ca-certificates takes local CAs from, so
    they survive the ca-certificates package regenerating the bundle), and
    the bundle itself for the clients that run before that package is
    installed;
  - its package-client settings: the files under /etc/apt (apt.conf.d,
    sources, keyrings, preferences, auth) that no Debian package owns, the
    keyrings its sources are signed by, pip's configuration files, and the
    environment variables of pip, the proxies and the CA bundles;
  - its resolver (/etc/resolv.conf, /etc/hosts);

then a fresh clone of the commit under test (plus the working tree's
uncommitted changes to tracked files, so it can be run before a commit), and
runs inside it, with chroot, as root, in a clean environment:

  1. `bash scripts/quickstart.sh`, which must install what it needs, build
     and run the main job (every byte verified); then a second time, which
     must install nothing (dpkg's database, .venv unchanged), rebuild
     nothing, and reach the build within seconds;
  2. the full installer without Go: one line saying which Go to install, and
     nothing installed;
  3. the full installer with the machine's Go (bind-mounted where Go's
     tarball puts it, /usr/local/go) and the machine's caches of the Go-built
     test tools (~/.cache/meshload): every Debian package of
     `scripts/install-deps.sh --print-packages` installs; a second run changes
     nothing and takes seconds.

Layers, cached under ~/.cache/meshload/fresh-machine (MESHLOAD_FRESH_MACHINE_CACHE)
as overlayfs directories, so a warm run does not download a Debian system
again:
  base-KEY        the debootstrap tree; KEY: scripts/lib/debian-base.sh, mirrors
  quickstart-KEY  what the first quickstart installed (the overlay's upper
                  directory, without the clone); KEY: the base, the installer,
                  requirements-build.txt, quickstart.sh, the machine's settings
  suite-KEY.passed  steps 2 and 3 passed for KEY: the quickstart layer, the
                  installer, the requirement files
A run whose quickstart layer is cached still runs step 1 on a new clone (its
.venv made by the installer, the build from scratch, the job run): only the
Debian packages come from the cache. MESHLOAD_FRESH_MACHINE_COLD=1 ignores
every layer. A removed package in the installer's lists changes the keys, so
the test runs cold and fails.

Needs root (debootstrap, mounts, chroot) and overlayfs. Runs in a mount
namespace of its own: nothing it mounts outlives it.
Prints `N passed, N failed`.

usage: fresh_machine_test.py --root REPO [--logs DIR]
"""
import argparse
import datetime
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checks  # noqa: E402
from checks import check  # noqa: E402

CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLONE = "/root/meshload"
# What is taken from this machine's environment into the chroot's: the
# package clients' settings and the CA bundles they use.
ENV_PATTERN = re.compile(r"^(PIP_[A-Z_]+|(HTTP|HTTPS|FTP|NO|ALL)_PROXY|(http|https|ftp|no|all)_proxy|"
                         r"SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|GIT_SSL_CAINFO|"
                         r"GOPROXY|GOSUMDB|GONOSUMDB|GOPRIVATE|GOFLAGS)$")


def say(msg):
    print("     " + msg)
    sys.stdout.flush()


def sha(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def tail(path, n=40):
    try:
        return "".join(read(path, "r").splitlines(True)[-n:])
    except OSError:
        return "(no log)"


# ---- the machine's settings ---------------------------------------------------

def owned_by_a_package(path):
    return subprocess.run(["dpkg", "-S", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def machine_settings():
    """(files, env): the files to copy in, as (host path, path in the root
    file system), and the environment variables."""
    files = []
    for f in sorted(glob.glob("/usr/local/share/ca-certificates/**/*", recursive=True)):
        if os.path.isfile(f):
            files.append((f, f))
    if os.path.isfile("/etc/ssl/certs/ca-certificates.crt"):
        files.append(("/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt"))
    apt = (glob.glob("/etc/apt/apt.conf.d/*") + glob.glob("/etc/apt/sources.list.d/*.sources") +
           glob.glob("/etc/apt/sources.list.d/*.list") + glob.glob("/etc/apt/sources.list") +
           glob.glob("/etc/apt/preferences.d/*") + glob.glob("/etc/apt/keyrings/*") +
           glob.glob("/etc/apt/trusted.gpg.d/*") + glob.glob("/etc/apt/auth.conf*") +
           glob.glob("/etc/apt/auth.conf.d/*"))
    for f in sorted(apt):
        if os.path.isfile(f) and not owned_by_a_package(f):
            files.append((f, f))
    # The keyrings the copied sources are signed by.
    for f, _ in list(files):
        if f.startswith("/etc/apt/sources.list"):
            for key in re.findall(r"^Signed-By:\s*(/\S+)\s*$|signed-by=(/[^\] ]+)", read(f, "r"), re.M):
                key = key[0] or key[1]
                if os.path.isfile(key) and (key, key) not in files:
                    files.append((key, key))
    home = os.path.expanduser("~")
    for f, to in (("/etc/pip.conf", "/etc/pip.conf"), ("/etc/xdg/pip/pip.conf", "/etc/xdg/pip/pip.conf"),
                  (home + "/.config/pip/pip.conf", "/root/.config/pip/pip.conf"),
                  (home + "/.pip/pip.conf", "/root/.pip/pip.conf")):
        if os.path.isfile(f):
            files.append((f, to))
    for f in ("/etc/resolv.conf", "/etc/hosts"):
        if os.path.exists(f):
            files.append((os.path.realpath(f), f))
    env = {k: v for k, v in sorted(os.environ.items()) if ENV_PATTERN.match(k)}
    return files, env


def copy_settings(rootfs, files):
    for src, to in files:
        dest = rootfs + to
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.lexists(dest) or os.path.islink(dest):
            os.unlink(dest)
        shutil.copy2(src, dest)


# ---- mounts and the chroot ----------------------------------------------------

def mounts_below(path):
    path = os.path.realpath(path)
    out = []
    for line in read("/proc/self/mountinfo", "r").splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == path or point.startswith(path + "/"):
            out.append(point)
    return out


def mount(*args):
    subprocess.run(["mount"] + list(args), check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def remove_tree(path):
    """rm -rf, refusing while anything is mounted below it."""
    if not os.path.lexists(path):
        return
    left = mounts_below(path)
    if left:
        raise RuntimeError("refusing to remove %s: still mounted: %s" % (path, left))
    subprocess.run(["rm", "-rf", "--one-file-system", path], check=True)


class Root:
    """An overlay root file system: the cached layers below, a new upper
    directory, /proc, /sys and /dev bound in."""

    def __init__(self, work, lowers):
        self.work = work
        self.upper, self.ovl_work, self.dir = work + "/upper", work + "/work", work + "/root"
        for d in (self.upper, self.ovl_work, self.dir):
            os.makedirs(d)
        mount("-t", "overlay", "overlay", "-o",
              "lowerdir=%s,upperdir=%s,workdir=%s" % (":".join(lowers), self.upper, self.ovl_work), self.dir)
        for d in ("proc", "sys", "dev"):
            os.makedirs(self.dir + "/" + d, exist_ok=True)
            mount("--rbind", "/" + d, self.dir + "/" + d)
            mount("--make-rslave", self.dir + "/" + d)
        self.binds = []

    def bind(self, host, inside, read_only=True):
        target = self.dir + inside
        os.makedirs(target, exist_ok=True)
        mount("--bind", host, target)
        if read_only:
            mount("-o", "remount,bind,ro", target)
        self.binds.append(target)

    def unbind(self):
        for t in reversed(self.binds):
            subprocess.run(["umount", "-l", t], stderr=subprocess.DEVNULL)
        self.binds = []

    def kill_leftovers(self):
        """Kills what is still running in this root (nothing should be)."""
        left = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if os.path.realpath("/proc/%s/root" % pid) == os.path.realpath(self.dir):
                    left.append(read("/proc/%s/cmdline" % pid).replace(b"\0", b" ").decode(errors="replace"))
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        return left

    def run(self, script, env, log, timeout, path=CLEAN_PATH):
        """Runs `bash -c script` in the chroot as root in a clean environment;
        every line goes to `log` with its time. Returns (rc, [(seconds, line)])."""
        full_env = {"HOME": "/root", "PATH": path, "LANG": "C.UTF-8", "TERM": "dumb", "USER": "root"}
        full_env.update(env)
        argv = ["chroot", self.dir, "/usr/bin/env", "-i"] + ["%s=%s" % kv for kv in full_env.items()] + \
               ["/bin/bash", "-c", script]
        lines = []
        t0 = time.monotonic()
        with open(log, "a") as out:
            out.write("\n$ %s\n" % script)
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            deadline = t0 + timeout
            for line in p.stdout:
                t = time.monotonic() - t0
                lines.append((t, line.rstrip("\n")))
                out.write("[%7.1f] %s" % (t, line))
                out.flush()
                if time.monotonic() > deadline:
                    p.kill()
                    out.write("(killed: over %d s)\n" % timeout)
                    break
            rc = p.wait()
        left = self.kill_leftovers()
        if left:
            with open(log, "a") as out:
                out.write("(left running, killed: %s)\n" % left)
        return rc, lines

    def close(self):
        self.kill_leftovers()
        self.unbind()
        for point in sorted(mounts_below(self.dir), key=len, reverse=True):
            if subprocess.run(["umount", point], stderr=subprocess.DEVNULL).returncode != 0:
                subprocess.run(["umount", "-l", point], stderr=subprocess.DEVNULL)


def clone_into(repo, dest):
    """A fresh clone of HEAD, plus the working tree's uncommitted changes to
    tracked files; returns a description of what it is."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", repo, dest], check=True)
    diff = subprocess.run(["git", "-C", repo, "diff", "HEAD", "--binary"], check=True, stdout=subprocess.PIPE).stdout
    head = subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"], check=True, stdout=subprocess.PIPE,
                          text=True).stdout.strip()
    if diff:
        subprocess.run(["git", "-C", dest, "apply", "--binary", "-"], input=diff, check=True)
        return head + " with the working tree's uncommitted changes"
    return head


def dpkg_state(rootfs):
    return sha(read(rootfs + "/var/lib/dpkg/status"))


def venv_state(rootfs):
    stamp = rootfs + CLONE + "/.venv/.requirements.sha256"
    if not os.path.exists(stamp):
        return None
    return read(stamp), os.stat(stamp).st_mtime_ns, os.stat(rootfs + CLONE + "/.venv/bin/python").st_mtime_ns


def line_time(lines, prefix):
    for t, line in lines:
        if line.startswith(prefix):
            return t
    return None


def text(lines):
    return "\n".join(l for _, l in lines)


# ---- the steps -----------------------------------------------------------------

def make_base(repo, cache, key, logs):
    final = "%s/base-%s" % (cache, key)
    if os.path.isdir(final + "/rootfs"):
        return final + "/rootfs", "cached"
    stage = tempfile.mkdtemp(prefix="stage-", dir=cache)
    t0 = time.monotonic()
    rc = subprocess.run(["bash", "-c", 'source "$1/scripts/lib/debian-base.sh" && debian_base_make "$2/rootfs" "$3"',
                         "-", repo, stage, logs + "/debootstrap.log"]).returncode
    if rc != 0:
        remove_tree(stage)
        return None, "debootstrap failed: " + tail(logs + "/debootstrap.log", 20)
    os.rename(stage, final)
    return final + "/rootfs", "made in %.0f s" % (time.monotonic() - t0)


def prune(cache, keep):
    for d in glob.glob(cache + "/*"):
        name = os.path.basename(d)
        if name in keep:
            continue
        if re.match(r"^(base|quickstart)-[0-9a-f]{16}$|^suite-[0-9a-f]{16}\.passed$|^(stage|run)-", name):
            if os.path.isdir(d):
                remove_tree(d)
            else:
                os.unlink(d)


def quickstart_twice(root, env, logs, repo, what):
    """Step 1 on `root`: returns True when the first run passed."""
    log = logs + "/quickstart.log"
    rc, lines = root.run("cd %s && bash scripts/quickstart.sh" % CLONE, env, log, timeout=1800)
    total = lines[-1][0] if lines else 0
    ok = check("quickstart on a fresh Debian 12 (%s): installs, builds, runs the main job (%.0f s)" % (what, total),
               rc == 0 and "\nOK" in "\n" + text(lines) and " 0 mismatches" in text(lines),
               "exit %d; the end of %s:\n%s" % (rc, log, tail(log)))
    if not ok:
        return False
    # The machine's local CAs survived the ca-certificates package's
    # regeneration of the bundle.
    bundle = read(root.dir + "/etc/ssl/certs/ca-certificates.crt", "r")
    local = sorted(glob.glob("/usr/local/share/ca-certificates/**/*.crt", recursive=True))
    missing = []
    for f in local:
        body = "".join(l for l in read(f, "r").splitlines() if l and not l.startswith("-----"))
        if body and body not in bundle.replace("\n", ""):
            missing.append(f)
    check("the machine's %d local CA certificate(s) are in the regenerated bundle" % len(local), not missing,
          "missing: %s" % missing)
    before = (dpkg_state(root.dir), venv_state(root.dir))
    rc, lines2 = root.run("cd %s && bash scripts/quickstart.sh" % CLONE, env, log, timeout=900)
    t_build = line_time(lines2, "== build:")
    out2 = text(lines2)
    check("a second quickstart passes", rc == 0 and "\nOK" in "\n" + out2, "exit %d:\n%s" % (rc, tail(log)))
    check("a second quickstart installs nothing (dpkg's database and .venv unchanged)",
          before == (dpkg_state(root.dir), venv_state(root.dir)) and "install-deps: all " in out2 and
          ".venv matches" in out2, out2[:2000])
    check("a second quickstart reaches the build in seconds (%.1f s) and rebuilds nothing" % (t_build or -1),
          t_build is not None and t_build < 20 and "no work to do" in out2, out2[:2000])
    return True


def suite_packages(root, env, logs, repo):
    """Steps 2 and 3 on `root`; returns True when they passed."""
    log = logs + "/suite.log"
    ok = True
    before = dpkg_state(root.dir)
    rc, lines = root.run("cd %s && bash scripts/install-deps.sh" % CLONE, env, log, timeout=120)
    out = [l for _, l in lines]
    ok &= check("the full installer without Go says in one line which Go to install, and installs nothing",
                rc != 0 and len(out) == 1 and re.search(r"need Go 1\.\d+(\.\d+)? or newer", out[0]) is not None and
                "https://go.dev/dl/" in out[0] and before == dpkg_state(root.dir) and
                venv_state(root.dir) is None, "exit %d, output:\n%s" % (rc, "\n".join(out)))
    goroot = subprocess.run(["go", "env", "GOROOT"], stdout=subprocess.PIPE, text=True).stdout.strip()
    if not goroot or not os.path.isdir(goroot):
        return check("the machine has Go (the project's machines do)", False, "no go on PATH here")
    root.bind(goroot, "/usr/local/go")
    tools_cache = os.path.expanduser("~/.cache/meshload")
    for sub in ("test-tools", "wheelhouse"):
        if os.path.isdir(tools_cache + "/" + sub):
            root.bind(tools_cache + "/" + sub, "/root/.cache/meshload/" + sub)
    go_env = dict(env, GOTOOLCHAIN="local", GOCACHE="/tmp/go-build", GOPATH="/tmp/go")
    rc, lines = root.run("cd %s && bash scripts/install-deps.sh" % CLONE, go_env, log, timeout=3600)
    ok &= check("the full installer with the machine's Go installs everything (%.0f s)" %
                (lines[-1][0] if lines else 0), rc == 0, "exit %d; the end of %s:\n%s" % (rc, log, tail(log)))
    wanted = subprocess.run(["bash", repo + "/scripts/install-deps.sh", "--print-packages"], check=True,
                            stdout=subprocess.PIPE, text=True).stdout.split()
    q = subprocess.run(["chroot", root.dir, "dpkg-query", "-W", "-f", "${Package} ${Status}\\n"] + wanted,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    installed = {l.split()[0] for l in q.splitlines() if l.endswith("install ok installed")}
    missing = [p for p in wanted if p not in installed]
    ok &= check("every one of the installer's %d Debian packages is installed there" % len(wanted), not missing,
                "not installed: %s" % missing)
    before = (dpkg_state(root.dir), venv_state(root.dir))
    rc, lines = root.run("cd %s && bash scripts/install-deps.sh" % CLONE, go_env, log, timeout=600)
    took = lines[-1][0] if lines else 0
    ok &= check("a second full install changes nothing and takes seconds (%.1f s)" % took,
                rc == 0 and took < 30 and before == (dpkg_state(root.dir), venv_state(root.dir)) and
                "install-deps: all %d packages present" % len(wanted) in text(lines), text(lines)[-2000:])
    root.unbind()
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--logs", required=True)
    args = ap.parse_args()
    repo = os.path.realpath(args.root)
    if os.environ.get("MESHLOAD_FRESH_MACHINE_NS") != "1":
        # Everything below runs in a mount namespace of its own.
        if os.geteuid() != 0:
            check("runs as root (debootstrap, mounts and chroot need it)", False, "uid %d" % os.geteuid())
            return checks.finish()
        env = dict(os.environ, MESHLOAD_FRESH_MACHINE_NS="1")
        return subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable] + sys.argv,
                              env=env).returncode

    logs = os.path.realpath(args.logs)
    os.makedirs(logs, exist_ok=True)
    for f in glob.glob(logs + "/*.log"):
        os.unlink(f)
    cache = os.path.realpath(os.environ.get("MESHLOAD_FRESH_MACHINE_CACHE") or
                             os.path.expanduser("~/.cache/meshload/fresh-machine"))
    os.makedirs(cache, exist_ok=True)
    cold = os.environ.get("MESHLOAD_FRESH_MACHINE_COLD") == "1"
    for tool in ("debootstrap", "unshare", "chroot", "git"):
        if not shutil.which(tool):
            check("%s is installed (scripts/install-deps.sh installs it)" % tool, False)
            return checks.finish()
    started = time.monotonic()

    files, env = machine_settings()
    say("the machine's settings copied in: %s; environment: %s" %
        (", ".join(to for _, to in files), ", ".join(env) or "none"))
    # The resolver's files say how to reach the network, not what installs:
    # they are copied in but left out of the key (they differ between boots).
    keyed = [(src, to) for src, to in files if to not in ("/etc/resolv.conf", "/etc/hosts")]
    settings_key = sha(*[to + "\0" + sha(read(src)) for src, to in keyed], *["%s=%s" % kv for kv in env.items()])
    mirrors = os.environ.get("MESHLOAD_DEBIAN_MIRROR", "") + os.environ.get("MESHLOAD_DEBIAN_SECURITY_MIRROR", "")
    base_key = sha(read(repo + "/scripts/lib/debian-base.sh"), mirrors)
    installer = [read(repo + "/" + f) for f in ("scripts/install-deps.sh", "requirements-build.txt",
                                                "scripts/quickstart.sh")]
    qs_key = sha(base_key, settings_key, *installer)
    suite_key = sha(qs_key, read(repo + "/requirements.txt"), read(repo + "/tests/client/wheelhouse.txt"))
    # Scratch of runs that were killed; every layer too on a cold run. Layers
    # of other keys go when this run has made its own (below).
    prune(cache, keep=set() if cold else {p for p in os.listdir(cache) if not re.match(r"^(stage|run)-", p)})

    base, how = make_base(repo, cache, base_key, logs)
    if not check("a Debian 12 minbase root file system by debootstrap (%s)" % how.split(":")[0], base is not None, how):
        return checks.finish()

    qs_layer = "%s/quickstart-%s" % (cache, qs_key)
    layer_cached = os.path.isdir(qs_layer)
    run_dir = tempfile.mkdtemp(prefix="run-", dir=cache)
    root = None
    try:
        lowers = [qs_layer, base] if layer_cached else [base]
        try:
            root = Root(run_dir + "/qs", lowers)
        except subprocess.CalledProcessError as e:
            check("an overlay of the cached layers mounts", False, e.stdout.decode(errors="replace"))
            return checks.finish()
        copy_settings(root.dir, files)
        what = clone_into(repo, root.dir + CLONE)
        say("the clone: %s; the installed Debian packages: %s" %
            (what, "cached (quickstart-%s, made by an earlier run's first quickstart)" % qs_key if layer_cached
             else "none yet: a cold run"))
        qs_ok = quickstart_twice(root, env, logs, repo, "packages cached" if layer_cached else "cold")
        root.close()
        if qs_ok and not layer_cached:
            # Keep what the quickstart installed, without the clone and scratch.
            upper = root.upper
            for junk in (upper + CLONE, upper + "/tmp", upper + "/root/.cache"):
                remove_tree(junk)
            os.makedirs(upper + "/tmp", exist_ok=True)
            os.chmod(upper + "/tmp", 0o1777)
            os.rename(upper, qs_layer)
            say("cached the quickstart's packages as quickstart-%s" % qs_key)
        if not qs_ok:
            return checks.finish()

        stamp = "%s/suite-%s.passed" % (cache, suite_key)
        if os.path.exists(stamp):
            say("the full installer in this root file system passed for these installer and requirement files: %s"
                % read(stamp, "r").strip())
            say("(steps 2 and 3 run again when one of them changes; MESHLOAD_FRESH_MACHINE_COLD=1 forces them)")
        else:
            root = Root(run_dir + "/suite", [qs_layer, base])
            copy_settings(root.dir, files)
            clone_into(repo, root.dir + CLONE)
            t0 = time.monotonic()
            if suite_packages(root, env, logs, repo):
                with open(stamp, "w") as f:
                    f.write("%s, in %.0f s\n" % (datetime.datetime.now().isoformat(timespec="seconds"),
                                                 time.monotonic() - t0))
            root.close()
        if checks.failed == 0:
            prune(cache, keep={"base-" + base_key, "quickstart-" + qs_key, "suite-%s.passed" % suite_key,
                               os.path.basename(run_dir)})
        say("fresh-machine test: %.0f s" % (time.monotonic() - started))
    finally:
        if root is not None:
            root.close()
        remove_tree(run_dir)
    return checks.finish()


if __name__ == "__main__":
    sys.exit(main())
