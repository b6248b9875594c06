#!/usr/bin/env python3
"""The container images, built for real and checked from the inside.

Builds docker/Dockerfile.{sidecar,controller,cli} with scripts/build-images
(podman, --isolation=chroot, base images debian:12 and debian:12-slim made
here with debootstrap), then, because no container can be started on the
machines this runs on, creates a container of each image, mounts its root
file system and checks it with chroot:

  - every binary in /usr/local/bin starts as the image's user and prints its
    version (the project's); the sidecar and the CLI say GPU staging is built
    in (CUDA headers at build time);
  - every shared library of every binary resolves inside the image;
  - the image's user is a non-root uid that the image's /etc/passwd knows,
    and its entrypoint is one of those binaries;
  - no compiler, build tool or pip, and no package caches or lists;
  - the image is under its size budget (175 MB);
  - in the sidecar and CLI images, `meshload run --local` runs a small job as
    the image's user (sidecar and trainer processes, every byte checked);
  - the chart's default image references, the controller's default sidecar
    image and every meshload image named in examples/ are images built here.

A failed build is a failed check with the end of the build log (all of it
under --logs). Prints `N passed, N failed`.

usage: images_test.py --root REPO --logs DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import checks  # noqa: E402
from checks import check  # noqa: E402

# Bytes, per runtime image: debian:12-slim (82 MB), meshload's binaries, and
# in the sidecar and cli images Arrow C++'s libarrow and libparquet (about
# 48 MB stripped; Parquet datasets), which Debian 12 does not package.
SIZE_BUDGET = 175_000_000
IMAGES = ("sidecar", "controller", "cli")
# What a runtime stage must not carry: compilers, build tools, pip.
TOOLS = ("gcc", "g++", "cc", "c++", "cpp", "clang", "clang++", "ld", "as", "make", "cmake", "ninja",
         "pip", "pip3", "go")
PATH_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")



def run(cmd, **kw):
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def project_version(root):
    with open(os.path.join(root, "CMakeLists.txt")) as f:
        m = re.search(r"^project\(meshload VERSION ([0-9.]+)", f.read(), re.M)
    return m.group(1)


def chroot(mnt, user, argv, timeout=60):
    """Runs argv inside the mounted image as `user` ("uid:gid"), with /proc
    and /dev bound in a private mount namespace (gone when it returns)."""
    script = ('mount --rbind /proc "$1/proc" && mount --rbind /dev "$1/dev" && '
              'shift 2 && exec chroot --userspec="$U" "$M" "$@"')
    env = dict(os.environ, U=user, M=mnt)
    return run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", mnt, "-"] + argv,
               env=env, timeout=timeout)


def elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def check_image(name, image, version):
    info = json.loads(run(["podman", "image", "inspect", image]).stdout)[0]
    config = info.get("Config", {})
    size = info["Size"]
    print("     %s: %.1f MB" % (image, size / 1e6))
    check("%s: %.1f MB, under the %d MB budget" % (name, size / 1e6, SIZE_BUDGET // 1_000_000), size < SIZE_BUDGET)

    user = config.get("User", "")
    m = re.fullmatch(r"(\d+)(?::(\d+))?", user)
    check("%s: runs as a numeric non-root user (%r)" % (name, user), bool(m) and int(m.group(1)) != 0)
    uid = m.group(1) if m else "65532"
    gid = (m.group(2) or uid) if m else "65532"

    ctr = run(["podman", "create", image]).stdout.strip().splitlines()[-1]
    try:
        mnt = run(["podman", "mount", ctr]).stdout.strip()
        with open(os.path.join(mnt, "etc/passwd")) as f:
            passwd = {line.split(":")[2]: line.split(":")[0] for line in f if line.count(":") >= 6}
        check("%s: uid %s is a user of the image (%s)" % (name, uid, passwd.get(uid, "none")), uid in passwd)

        bindir = os.path.join(mnt, "usr/local/bin")
        binaries = sorted(b for b in os.listdir(bindir) if elf(os.path.join(bindir, b)))
        check("%s: binaries in /usr/local/bin: %s" % (name, " ".join(binaries) or "none"), bool(binaries))
        entry = (config.get("Entrypoint") or [""])[0]
        check("%s: the entrypoint %s is one of them" % (name, entry),
              entry.startswith("/usr/local/bin/") and os.path.basename(entry) in binaries)

        for b in binaries:
            libs = chroot(mnt, "0:0", ["/lib64/ld-linux-x86-64.so.2", "--list", "/usr/local/bin/" + b])
            unresolved = [l.strip() for l in libs.stdout.splitlines() if "not found" in l]
            check("%s: every shared library of %s resolves in the image" % (name, b),
                  libs.returncode == 0 and not unresolved, libs.stdout if libs.returncode else "\n".join(unresolved))

            argv = ["/usr/local/bin/" + b, "version" if b == "meshload" else "--version"]
            out = chroot(mnt, "%s:%s" % (uid, gid), argv)
            first = out.stdout.splitlines()[0] if out.stdout else ""
            check("%s: %s starts as uid %s and prints its version (%s)" % (name, b, uid, first),
                  out.returncode == 0 and first == "%s %s" % (b, version), out.stdout)
            if b in ("meshload", "meshload-sidecar"):
                gpu = [l for l in out.stdout.splitlines() if l.startswith("gpu-staging:")]
                check("%s: %s has GPU staging built in (%s)" % (name, b, gpu[0] if gpu else "no gpu-staging line"),
                      bool(gpu) and gpu[0].startswith("gpu-staging: built in (CUDA "), out.stdout)

        found = [os.path.join(d, t) for d in PATH_DIRS for t in TOOLS
                 if os.path.lexists(os.path.join(mnt, d.lstrip("/"), t))]
        found += [os.path.join("/usr/lib/gcc/x86_64-linux-gnu", v, "cc1")
                  for v in (os.listdir(os.path.join(mnt, "usr/lib/gcc/x86_64-linux-gnu"))
                            if os.path.isdir(os.path.join(mnt, "usr/lib/gcc/x86_64-linux-gnu")) else [])
                  if os.path.exists(os.path.join(mnt, "usr/lib/gcc/x86_64-linux-gnu", v, "cc1"))]
        check("%s: no compiler, build tool or pip" % name, not found, " ".join(found))

        caches = []
        for d, keep in (("var/cache/apt/archives", {"partial", "lock"}), ("var/lib/apt/lists", {"partial", "lock", "auxfiles"}),
                        ("var/cache/apt", {"archives"}), ("root/.cache", set()), ("src", set()), ("build", set())):
            p = os.path.join(mnt, d)
            if os.path.isdir(p):
                extra = [e for e in os.listdir(p) if e not in keep]
                if extra or d in ("root/.cache", "src", "build"):
                    caches.append("/%s: %s" % (d, " ".join(sorted(extra)[:8]) or "(empty dir)"))
        check("%s: no package caches, package lists or build trees" % name, not caches, "\n".join(caches))

        if "meshload" in binaries and "meshload-sidecar" in binaries:
            job = os.path.join(mnt, "tmp/job.yaml")
            with open(job, "w") as f:
                f.write("""apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: image-check}
spec:
  mesh:
    processes: 2
    devicesPerProcess: 1
    axes: [{name: data, size: 2}]
  strategy: PerProcess
  dataset: {uri: /tmp/data, format: TokenStream, dtype: uint16, sequenceLength: 256}
  batch: {globalBatchSize: 16, prefetch: 4}
  shuffle: {mode: Global, seed: 3}
""")
            out = chroot(mnt, "%s:%s" % (uid, gid), ["/usr/local/bin/meshload", "run", "--local", "-f", "/tmp/job.yaml",
                                                     "--generate-dataset", "/tmp/data", "--samples", "4000",
                                                     "--steps", "100"], timeout=120)
            lines = out.stdout.splitlines()
            verified = [l.strip() for l in lines if l.strip().startswith("verified")]
            check("%s: meshload run --local as uid %s: %s" % (name, uid, verified[0] if verified else "no report"),
                  out.returncode == 0 and lines[-1:] == ["OK"] and bool(verified) and " 0 mismatches" in verified[0],
                  "\n".join(lines[-25:]))
    finally:
        run(["podman", "umount", ctr])
        run(["podman", "rm", "-f", ctr])


def check_references(root, version):
    """The chart, the controller's default and the examples name images built here."""
    built = {"meshload/%s:%s" % (n, version) for n in IMAGES}
    with open(os.path.join(root, "charts/meshload/Chart.yaml")) as f:
        app = re.search(r'^appVersion:\s*"?([^"\s]+)"?', f.read(), re.M).group(1)
    check("the chart's appVersion %s is the project's version %s (the images' default tag)" % (app, version),
          app == version)
    with open(os.path.join(root, "charts/meshload/values.yaml")) as f:
        repos = re.findall(r"^\s*repository:\s*(\S+)", f.read(), re.M)
    check("the chart's default images (%s, tag %s) are built here" % (", ".join(repos), app),
          bool(repos) and all("%s:%s" % (r, app) in built for r in repos))
    with open(os.path.join(root, "controller/main.cc")) as f:
        default = re.search(r'sidecar_image = std::string\("([^"]+)"\) \+ MESHLOAD_VERSION', f.read())
    check("the controller's default sidecar image (%sVERSION) is built here" % (default.group(1) if default else "?"),
          bool(default) and default.group(1) + version in built)
    refs = []
    for dirpath, _, files in os.walk(os.path.join(root, "examples")):
        for fn in files:
            with open(os.path.join(dirpath, fn), errors="replace") as f:
                for ref in re.findall(r"\bimage:\s*[\"']?(\S*meshload/[a-z-]+(?::[\w.-]+)?)", f.read()):
                    refs.append((os.path.relpath(os.path.join(dirpath, fn), root), ref))
    bad = ["%s: %s" % r for r in refs if r[1] not in built]
    check("the %d meshload image references in examples/ are images built here" % len(refs), not bad, "\n".join(bad))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--logs", default=None, help="where the build logs go (default: a temporary directory)")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    logs = os.path.abspath(args.logs or tempfile.mkdtemp(prefix="meshload-images-"))
    os.makedirs(logs, exist_ok=True)
    version = project_version(root)
    if os.geteuid() != 0:
        check("running as root (debootstrap, podman's storage, chroot need it)", False,
              "run the suite as root, as scripts/test.sh and CI do")
        return checks.finish()

    build = subprocess.run(["bash", os.path.join(root, "scripts/build-images"), "--local-bases"],
                           env=dict(os.environ, MESHLOAD_IMAGE_LOGS=logs), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    print(build.stdout, end="")
    if not check("scripts/build-images --local-bases built %s (logs in %s)" % (", ".join(IMAGES), logs),
                 build.returncode == 0, "exit status %d" % build.returncode):
        return checks.finish()
    for name in IMAGES:
        check_image(name, "localhost/meshload/%s:%s" % (name, version), version)
    check_references(root, version)
    rc = checks.finish()
    return rc if checks.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
