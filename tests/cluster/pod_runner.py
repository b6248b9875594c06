#!/usr/bin/python3
"""The kubelet's part of scripts/cluster, for pods on kwok's simulated nodes.

kwok (sigs.k8s.io/kwok) simulates nodes and gives each pod bound to one of
them a pod IP (its pod-create stage, from 127.x, tests/cluster/kwok-stages.yaml);
it starts no container. This runner does what a kubelet would do next, with
the binaries the project built standing in for the images:

  - for every pod on a kwok node that has a pod IP, it makes the pod's
    volumes in a per-pod directory: emptyDir, configMap, secret, projected
    (service-account tokens from the TokenRequest API bound to the pod, the
    cluster CA, downward API), downwardAPI, hostPath, and persistentVolumeClaim
    (the bound PersistentVolume's hostPath or local path); configMap and
    secret volumes follow their objects (written again when they change, each
    file replaced atomically);
  - it runs the pod's init containers, then its native sidecars
    (restartPolicy: Always), then its containers, each with exactly the
    command, args and environment of the stored pod spec ($(VAR) expanded;
    env from values, fieldRef, resourceFieldRef, configMapKeyRef and
    secretKeyRef; KUBERNETES_SERVICE_HOST/PORT point at the API server), in
    a mount namespace of its own where every volumeMount is bind-mounted at
    its mountPath (readOnly honoured, subPath too), as the pod's user and
    groups (runAsUser, runAsGroup, fsGroup, supplementalGroups; runAsNonRoot
    without runAsUser takes the image's user from the image table) with
    no_new_privs when allowPrivilegeEscalation is false;
  - the pod IP (kwok's, from the cluster's pod CIDR) goes on the loopback
    interface while the pod runs, as a CNI plugin would give the pod its
    address (127.x itself cannot be a pod IP: EndpointSlices refuse loopback
    addresses, so no Service could reach the pod); each process binds the
    pod's IP: tests/cluster/podnet.c (LD_PRELOAD) turns a bind to 0.0.0.0
    into a bind to the pod IP, so pods on this one machine keep their own
    ports, as they would in their own network namespaces;
  - it reports to the API server what a kubelet reports: init and container
    statuses (waiting, running, terminated with exit code, restart counts,
    lastState), readiness from each container's readinessProbe (httpGet or
    tcpSocket on the pod IP; startupProbe first), the Initialized,
    ContainersReady and Ready conditions, the phase (Running; Succeeded or
    Failed when the containers are done and the restart policy says so);
  - a container that exits is restarted as the policy says (native sidecars
    always; the pod's restartPolicy for the rest), with a back-off;
  - a pod being deleted gets SIGTERM in its main containers, then, once
    they stopped, in its sidecars in reverse order (as the kubelet does),
    SIGKILL for what is left after its grace period; once they stopped, the
    runner deletes it for good;
  - it serves /metrics/cadvisor: container_cpu_usage_seconds_total and
    container_memory_working_set_bytes{namespace,pod,container} measured from
    /proc for the processes it runs, the two cAdvisor series the chart's
    dashboard reads.

What it does not mimic is listed in docs/development.md ("A whole cluster on
one machine"). It needs root (mount namespaces, bind mounts, changing user, addresses on lo).

usage: pod_runner.py --dir DIR --server URL --pki DIR --images FILE --podnet LIB
                     [--metrics-port N]
The images file maps an image (its repository, without tag or digest) to
{"entrypoint": [...], "path": [dirs], "user": uid, "group": gid}: the
command a container of that image runs when its spec gives none, the
directories its bare command names are looked up in (the image's PATH), and
the user it runs as when the pod says only runAsNonRoot.
"""
import argparse
import base64
import http.client
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse

RESYNC_SECONDS = 0.5
PROBE_SECONDS = 1.0
BACKOFF_MAX = 10.0


def log(msg):
    sys.stderr.write("%s pod-runner: %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def now_rfc3339():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Api:
    """The API server, as the control plane's admin (PKI/admin.crt, as the
    kubelet has a client certificate of its own)."""

    def __init__(self, server, pki):
        u = urllib.parse.urlparse(server)
        self.host, self.port = u.hostname, u.port or 443
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
        self.local = threading.local()

    def request(self, method, path, body=None, content_type="application/json"):
        for attempt in range(3):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=30)
                self.local.conn = conn
            try:
                data = json.dumps(body).encode() if body is not None else None
                conn.request(method, path, body=data, headers={"Content-Type": content_type} if data else {})
                resp = conn.getresponse()
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else {})
            except (OSError, http.client.HTTPException):
                self.local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2)

    def get(self, path):
        status, obj = self.request("GET", path)
        return obj if status == 200 else None


class Volume:
    """A pod volume: a directory on the host, refreshed from its objects."""

    def __init__(self, pod, spec, base, runner):
        self.pod, self.spec, self.runner = pod, spec, runner
        self.name = spec["name"]
        self.path = os.path.join(base, self.name)
        self.last = None
        self.optional_missing = False

    def kind(self):
        for k in ("emptyDir", "configMap", "secret", "projected", "downwardAPI", "hostPath",
                  "persistentVolumeClaim"):
            if k in self.spec:
                return k
        return next((k for k in self.spec if k != "name"), "unknown")

    def setup(self):
        kind = self.kind()
        if kind == "emptyDir":
            os.makedirs(self.path, exist_ok=True)
            os.chmod(self.path, 0o777)
            return
        if kind == "hostPath":
            self.path = self.spec["hostPath"]["path"]
            if self.spec["hostPath"].get("type") in ("DirectoryOrCreate",):
                os.makedirs(self.path, exist_ok=True)
            if not os.path.exists(self.path):
                raise RuntimeError("volume %s: hostPath %s does not exist" % (self.name, self.path))
            return
        if kind == "persistentVolumeClaim":
            self.path = self.runner.pvc_path(self.pod, self.spec["persistentVolumeClaim"]["claimName"])
            return
        if kind in ("configMap", "secret", "projected", "downwardAPI"):
            os.makedirs(self.path, exist_ok=True)
            self.refresh()
            return
        raise RuntimeError("volume %s: %s volumes are not supported by the pod runner" % (self.name, kind))

    def files(self):
        """{relative path: (bytes, mode)} the volume holds now, or None while an
        object it needs is missing (and not optional)."""
        spec, ns = self.spec, self.pod["metadata"]["namespace"]
        out = {}
        if "configMap" in spec or "secret" in spec:
            return self.object_files(spec.get("configMap") or spec.get("secret"), "configMap" in spec, ns)
        if "downwardAPI" in spec:
            for item in spec["downwardAPI"].get("items", []):
                out[item["path"]] = (self.runner.field_value(self.pod, item).encode(),
                                     item.get("mode", spec["downwardAPI"].get("defaultMode", 0o644)))
            return out
        default_mode = spec["projected"].get("defaultMode", 0o644)
        for src in spec["projected"].get("sources", []):
            if "serviceAccountToken" in src:
                t = src["serviceAccountToken"]
                out[t["path"]] = (self.runner.token(self.pod, t).encode(), default_mode)
            elif "configMap" in src or "secret" in src:
                part = self.object_files(src.get("configMap") or src.get("secret"), "configMap" in src, ns,
                                         default_mode)
                if part is None:
                    return None
                out.update(part)
            elif "downwardAPI" in src:
                for item in src["downwardAPI"].get("items", []):
                    out[item["path"]] = (self.runner.field_value(self.pod, item).encode(), item.get("mode", default_mode))
        return out

    def object_files(self, ref, is_cm, ns, default_mode=None):
        kind = "configmaps" if is_cm else "secrets"
        obj = self.runner.api.get("/api/v1/namespaces/%s/%s/%s" % (ns, kind, ref.get("name") or ref.get("secretName")))
        mode = ref.get("defaultMode", default_mode if default_mode is not None else 0o644)
        if obj is None:
            return {} if ref.get("optional") else None
        data = {}
        for k, v in (obj.get("data") or {}).items():
            data[k] = base64.b64decode(v) if not is_cm else v.encode()
        for k, v in (obj.get("binaryData") or {}).items():
            data[k] = base64.b64decode(v)
        if ref.get("items"):
            return {i["path"]: (data[i["key"]], i.get("mode", mode)) for i in ref["items"] if i["key"] in data}
        return {k: (v, mode) for k, v in data.items()}

    def refresh(self):
        """Writes what changed; True when every object it needs exists."""
        if self.kind() not in ("configMap", "secret", "projected", "downwardAPI"):
            return True
        files = self.files()
        if files is None:
            return False
        # Tokens are not rewritten every second: once an hour is plenty.
        key = {k: (v if not k.endswith("token") else b"") for k, (v, _) in files.items()}
        if key == self.last:
            return True
        gid = self.runner.fs_group(self.pod)
        for rel, (data, mode) in files.items():
            dst = os.path.join(self.path, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            if gid is not None:
                os.chown(tmp, 0, gid)
                mode |= (mode & 0o400) >> 3  # the fsGroup can read what the owner can
            os.chmod(tmp, mode)
            os.rename(tmp, dst)
        for rel in set(self.last or {}) - set(files):
            try:
                os.unlink(os.path.join(self.path, rel))
            except OSError:
                pass
        self.last = key
        return True


class Container:
    def __init__(self, spec, kind):
        self.spec, self.kind = spec, kind  # kind: init, sidecar, main
        self.name = spec["name"]
        self.proc = None
        self.restarts = 0
        self.started_at = None
        self.last_state = None
        self.exit = None          # (code, reason, started, finished) once terminated for good
        self.ready = False
        self.started_probe_ok = "startupProbe" not in spec
        self.next_start = 0.0
        self.probe_at = 0.0

    def status(self):
        st = {"name": self.name, "image": self.spec.get("image", ""), "imageID": "",
              "restartCount": self.restarts, "ready": self.ready, "started": self.proc is not None}
        if self.proc is not None:
            st["state"] = {"running": {"startedAt": self.started_at}}
        elif self.exit is not None:
            code, reason, started, finished = self.exit
            st["state"] = {"terminated": {"exitCode": code, "reason": reason, "startedAt": started,
                                          "finishedAt": finished}}
        else:
            st["state"] = {"waiting": {"reason": "PodInitializing" if self.kind == "main" else "ContainerCreating"}}
        if self.last_state:
            st["lastState"] = {"terminated": self.last_state}
        return st


class PodRun:
    """One pod's life on its simulated node."""

    def __init__(self, runner, pod):
        self.runner, self.pod = runner, pod
        m = pod["metadata"]
        self.key = "%s/%s" % (m["namespace"], m["name"])
        self.uid = m["uid"]
        self.ip = pod["status"]["podIP"]
        self.dir = os.path.join(runner.dir, "pods", "%s_%s_%s" % (m["namespace"], m["name"], self.uid[:8]))
        spec = pod["spec"]
        self.inits = [Container(c, "sidecar" if c.get("restartPolicy") == "Always" else "init")
                      for c in spec.get("initContainers", [])]
        self.mains = [Container(c, "main") for c in spec["containers"]]
        self.volumes = {}
        self.phase = "Pending"
        self.stopping = None
        self.done = False
        self.error = None
        self.lock = threading.Lock()
        self.last_status = None
        self.thread = threading.Thread(target=self.run, name=self.key, daemon=True)

    # ---- network and volumes ----
    def setup_network(self):
        """The pod IP on the loopback interface, as a CNI plugin gives a pod
        its address: reachable from this machine only. kwok hands a deleted
        pod's IP to the next pod at once; a CNI plugin would not, before the
        old pod's sandbox is gone: the new pod waits (Pending) until the pod
        that held the address has stopped and released it."""
        with self.runner.ips_lock:
            holder = self.runner.ips.get(self.ip)
            if holder is not None and holder is not self:
                raise RuntimeError("the pod IP %s is still %s's (stopping)" % (self.ip, holder.key))
            out = subprocess.run(["ip", "addr", "add", self.ip + "/32", "dev", "lo"], capture_output=True, text=True)
            # "File exists" / "Address already assigned" (by iproute2's
            # version): an address a runner that did not stop cleanly left.
            if out.returncode != 0 and "exists" not in out.stderr and "already assigned" not in out.stderr:
                raise RuntimeError("cannot add the pod IP %s to lo: %s" % (self.ip, out.stderr.strip()))
            self.runner.ips[self.ip] = self
            self.has_address = True

    def teardown_network(self):
        if getattr(self, "has_address", False):
            with self.runner.ips_lock:
                subprocess.run(["ip", "addr", "del", self.ip + "/32", "dev", "lo"], capture_output=True)
                if self.runner.ips.get(self.ip) is self:
                    del self.runner.ips[self.ip]
            self.has_address = False

    def setup_volumes(self):
        os.makedirs(os.path.join(self.dir, "volumes"), exist_ok=True)
        os.chmod(self.dir, 0o755)
        os.chmod(os.path.join(self.dir, "volumes"), 0o755)
        for v in self.pod["spec"].get("volumes", []):
            vol = Volume(self.pod, v, os.path.join(self.dir, "volumes"), self.runner)
            vol.setup()
            self.volumes[vol.name] = vol

    def refresh_volumes(self):
        return all([v.refresh() for v in self.volumes.values()])

    # ---- processes ----
    def env_of(self, c):
        env = {"KUBERNETES_SERVICE_HOST": self.runner.api.host, "KUBERNETES_SERVICE_PORT": str(self.runner.api.port),
               "HOSTNAME": self.pod["spec"].get("hostname", self.pod["metadata"]["name"])}
        ns = self.pod["metadata"]["namespace"]
        for src in c.spec.get("envFrom", []):
            ref = src.get("configMapRef") or src.get("secretRef")
            obj = self.runner.api.get("/api/v1/namespaces/%s/%s/%s" % (ns, "configmaps" if "configMapRef" in src else "secrets",
                                                                        ref["name"]))
            for k, v in ((obj or {}).get("data") or {}).items():
                env[src.get("prefix", "") + k] = v if "configMapRef" in src else base64.b64decode(v).decode()
        for e in c.spec.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
                continue
            vf = e.get("valueFrom", {})
            if "fieldRef" in vf or "resourceFieldRef" in vf:
                env[e["name"]] = self.runner.field_value(self.pod, vf, c.spec)
            elif "configMapKeyRef" in vf or "secretKeyRef" in vf:
                ref = vf.get("configMapKeyRef") or vf.get("secretKeyRef")
                obj = self.runner.api.get("/api/v1/namespaces/%s/%s/%s" % (
                    ns, "configmaps" if "configMapKeyRef" in vf else "secrets", ref["name"]))
                val = ((obj or {}).get("data") or {}).get(ref["key"])
                if val is None:
                    if ref.get("optional"):
                        continue
                    raise RuntimeError("env %s: %s/%s has no key %s" % (e["name"], ns, ref["name"], ref["key"]))
                env[e["name"]] = val if "configMapKeyRef" in vf else base64.b64decode(val).decode()
        return env

    def user_of(self, c):
        image = self.runner.image(c.spec.get("image", ""))
        psc, csc = self.pod["spec"].get("securityContext", {}), c.spec.get("securityContext", {})
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup"))
        if uid is None:
            uid = image.get("user", 0)
        if gid is None:
            gid = image.get("group", uid)
        if uid == 0 and csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
            raise RuntimeError("container %s: runAsNonRoot and the image runs as root" % c.name)
        groups = [gid] + list(psc.get("supplementalGroups", []))
        if psc.get("fsGroup") is not None:
            groups.append(psc["fsGroup"])
        return uid, gid, sorted(set(groups)), csc.get("allowPrivilegeEscalation", True) is False

    def command_of(self, c, env):
        image = self.runner.image(c.spec.get("image", ""))
        cmd = list(c.spec.get("command") or image.get("entrypoint") or [])
        args = list(c.spec.get("args") or ([] if c.spec.get("command") else image.get("args", [])))
        argv = [expand(a, env) for a in cmd + args]
        if not argv:
            raise RuntimeError("container %s: image %s has no entrypoint in the image table" % (c.name, c.spec.get("image")))
        exe = argv[0]
        for d in image.get("path", []):
            cand = os.path.join(d, os.path.basename(exe))
            if (os.path.isabs(exe) and exe.startswith("/usr/local/bin/") or "/" not in exe) and os.access(cand, os.X_OK):
                argv[0] = cand
                break
        return argv

    def start(self, c):
        env = self.env_of(c)
        argv = self.command_of(c, env)
        uid, gid, groups, no_new_privs = self.user_of(c)
        script = ["set -e"]
        # Two phases, as a container runtime resolves every source before it
        # mounts anything: a mount at /tmp would hide a source below /tmp.
        # Each source is first bound onto a staging directory (STAGE, which
        # no mountPath may cover), then the staged mounts go to their mount
        # paths, parents first.
        stage = os.path.join(self.runner.stage, "%s-%s" % (self.uid[:8], c.name))
        mounts = []
        for i, m in enumerate(c.spec.get("volumeMounts", [])):
            vol = self.volumes.get(m["name"])
            if vol is None:
                raise RuntimeError("container %s mounts %s, which the pod has no volume of" % (c.name, m["name"]))
            dst = os.path.normpath(m["mountPath"])
            if (self.runner.stage + "/").startswith(dst.rstrip("/") + "/"):
                raise RuntimeError("container %s: mountPath %s covers the pod runner's %s" % (c.name, dst, self.runner.stage))
            src = os.path.join(vol.path, m["subPath"]) if m.get("subPath") else vol.path
            is_dir = os.path.isdir(src)
            staged = os.path.join(stage, str(i))
            if is_dir:
                os.makedirs(staged, exist_ok=True)
            else:
                os.makedirs(stage, exist_ok=True)
                open(staged, "a").close()
            self.runner.ensure_mountpoint(dst, is_dir)
            script.append("mount --bind %s %s" % (shlex.quote(src), shlex.quote(staged)))
            mounts.append((dst.count("/"), dst, staged, m.get("readOnly")))
        # The image's executable, staged too: the build may live below a
        # path a mount covers (a clone in /tmp, and the pod's /tmp emptyDir).
        exe = os.path.join(stage, "exe")
        os.makedirs(stage, exist_ok=True)
        open(exe, "a").close()
        script.append("mount --bind %s %s" % (shlex.quote(argv[0]), shlex.quote(exe)))
        argv = [exe] + argv[1:]
        for _, dst, staged, ro in sorted(mounts):
            script.append("mount --bind %s %s" % (shlex.quote(staged), shlex.quote(dst)))
            if ro:
                script.append("mount -o remount,bind,ro %s" % shlex.quote(dst))
        env["LD_PRELOAD"] = self.runner.podnet_staged
        env["MESHLOAD_PODNET_IP"] = self.ip
        priv = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--groups=%s" % ",".join(map(str, groups))]
        if no_new_privs:
            priv.append("--no-new-privs")
        env_args = ["%s=%s" % kv for kv in env.items()]
        script.append("cd /")
        script.append("exec " + " ".join(shlex.quote(a) for a in priv + ["env", "-i"] + env_args + argv))
        logf = open(os.path.join(self.dir, "%s.log" % c.name), "ab")
        logf.write(("---- %s start (restart %d): %s\n" % (now_rfc3339(), c.restarts, " ".join(argv))).encode())
        logf.flush()
        c.proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
                                  stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        logf.close()
        c.started_at = now_rfc3339()
        c.ready = False
        c.started_probe_ok = "startupProbe" not in c.spec
        c.probe_at = 0.0
        self.runner.track(self, c)
        log("%s: started %s (pid %d) on %s" % (self.key, c.name, c.proc.pid, self.ip))

    def reap(self, c):
        """Collects an exited container; returns its exit code or None."""
        if c.proc is None:
            return None
        rc = c.proc.poll()
        if rc is None:
            return None
        code = rc if rc >= 0 else 128 - rc
        c.last_exit = (code, "Completed" if code == 0 else "Error", c.started_at, now_rfc3339())
        c.proc = None
        c.ready = False
        self.runner.untrack(c)
        log("%s: %s exited with %d" % (self.key, c.name, code))
        return code

    def probe(self, c):
        spec = c.spec.get("readinessProbe") if c.started_probe_ok else c.spec.get("startupProbe")
        if spec is None:
            return True
        port = None
        target = spec.get("httpGet") or spec.get("tcpSocket")
        if target is None:
            return True  # exec probes: not run (docs/development.md)
        port = target["port"]
        if isinstance(port, str):
            port = next((p["containerPort"] for p in c.spec.get("ports", []) if p.get("name") == port), None)
            if port is None:
                for other in self.inits + self.mains:
                    port = next((p["containerPort"] for p in other.spec.get("ports", []) if p.get("name") == target["port"]), port)
        try:
            if "tcpSocket" in spec:
                socket.create_connection((self.ip, port), timeout=1).close()
                return True
            conn = http.client.HTTPConnection(self.ip, port, timeout=1)
            conn.request("GET", target.get("path", "/"))
            ok = 200 <= conn.getresponse().status < 400
            conn.close()
            return ok
        except (OSError, http.client.HTTPException):
            return False

    def stop_all(self, grace):
        # As the kubelet does (KEP-753): SIGTERM to the main containers, and
        # only once they are gone to the sidecars, one at a time in reverse
        # order, all within the one grace period; SIGKILL for whatever is
        # left at its end. A sidecar stopped with its trainer would break
        # the trainer's last step (the trainer sees "the sidecar is
        # stopping" instead of its own SIGTERM).
        deadline = time.time() + grace
        mains = [c for c in self.mains if c.proc is not None]
        for c in mains:
            self.signal(c, signal.SIGTERM)
        for c in mains:
            self.wait_or_kill(c, deadline)
        for c in reversed(self.inits):
            if c.proc is None:
                continue
            self.signal(c, signal.SIGTERM)
            self.wait_or_kill(c, deadline)

    @staticmethod
    def signal(c, sig):
        try:
            os.killpg(c.proc.pid, sig)
        except OSError:
            pass

    def wait_or_kill(self, c, deadline):
        while c.proc is not None and c.proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        if c.proc is not None and c.proc.poll() is None:
            self.signal(c, signal.SIGKILL)
            c.proc.wait()
        self.reap(c)
        if c.exit is None and getattr(c, "last_exit", None):
            c.exit = c.last_exit

    # ---- the pod's life ----
    def restart_policy(self, c):
        if c.kind == "sidecar":
            return "Always"
        return c.spec.get("restartPolicy") or self.pod["spec"].get("restartPolicy", "Always")

    def handle_exit(self, c, code):
        policy = self.restart_policy(c)
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            c.last_state = {"exitCode": code, "reason": c.last_exit[1], "startedAt": c.last_exit[2],
                            "finishedAt": c.last_exit[3]}
            c.restarts += 1
            c.next_start = time.time() + min(BACKOFF_MAX, 0.5 * (2 ** min(c.restarts - 1, 5)))
        else:
            c.exit = c.last_exit

    def step(self):
        """One pass of the pod's state machine; True when it is over."""
        t = time.time()
        for c in self.inits + self.mains:
            code = self.reap(c)
            if code is not None:
                self.handle_exit(c, code)
        # Init containers in order; a sidecar lets the next start once started (and its startupProbe passed).
        for i, c in enumerate(self.inits):
            if c.kind == "init":
                if c.exit is not None and c.exit[0] == 0:
                    continue
                if c.exit is not None:  # failed, restartPolicy Never
                    return self.finish("Failed")
                if c.proc is None and t >= c.next_start:
                    self.start(c)
                return False
            if c.proc is None and t >= c.next_start:
                self.start(c)
            if c.proc is None or not c.started_probe_ok:
                if c.proc is not None and t >= c.probe_at:
                    c.probe_at = t + PROBE_SECONDS
                    c.started_probe_ok = self.probe(c)
                if not c.started_probe_ok or c.proc is None:
                    return False
        for c in self.mains:
            if c.proc is None and c.exit is None and t >= c.next_start:
                self.start(c)
        for c in self.inits + self.mains:
            if c.proc is not None and t >= c.probe_at:
                c.probe_at = t + PROBE_SECONDS
                if not c.started_probe_ok:
                    c.started_probe_ok = self.probe(c)
                else:
                    c.ready = self.probe(c)
        if all(c.exit is not None for c in self.mains):
            ok = all(c.exit[0] == 0 for c in self.mains)
            return self.finish("Succeeded" if ok else "Failed")
        self.phase = "Running"
        return False

    def finish(self, phase):
        grace = self.pod["spec"].get("terminationGracePeriodSeconds", 30)
        self.stop_all(grace)
        self.phase = phase
        return True

    def report(self):
        inited = all((c.kind == "init" and c.exit is not None and c.exit[0] == 0) or
                     (c.kind == "sidecar" and c.proc is not None and c.started_probe_ok) for c in self.inits)
        if self.phase in ("Succeeded", "Failed"):
            inited = True
        ready_all = all(c.ready for c in self.mains) and all(c.ready for c in self.inits if c.kind == "sidecar")
        containers_ready = self.phase == "Running" and ready_all
        tr = now_rfc3339()
        prev = {c["type"]: c for c in (self.pod.get("status", {}).get("conditions") or [])}

        def cond(kind, ok, reason=""):
            old = prev.get(kind, {})
            status = "True" if ok else "False"
            return {"type": kind, "status": status, "reason": "" if ok else reason,
                    "lastProbeTime": None,
                    "lastTransitionTime": old.get("lastTransitionTime", tr) if old.get("status") == status else tr}
        conditions = [cond("Initialized", inited, "ContainersNotInitialized"),
                      cond("ContainersReady", containers_ready, "ContainersNotReady"),
                      cond("Ready", containers_ready, "ContainersNotReady")]
        if "PodScheduled" in prev:
            conditions.append(prev["PodScheduled"])
        status = {"phase": self.phase, "conditions": conditions,
                  "initContainerStatuses": [c.status() for c in self.inits],
                  "containerStatuses": [c.status() for c in self.mains]}
        if self.phase != "Pending":
            status.setdefault("startTime", self.pod.get("status", {}).get("startTime") or tr)
        if self.error:
            status["message"] = self.error
        compare = json.dumps({k: v for k, v in status.items() if k != "conditions"}, sort_keys=True) + \
            json.dumps([(c["type"], c["status"]) for c in conditions])
        if compare == self.last_status:
            return
        m = self.pod["metadata"]
        code, obj = self.runner.api.request(
            "PATCH", "/api/v1/namespaces/%s/pods/%s/status" % (m["namespace"], m["name"]),
            {"metadata": {"uid": self.uid}, "status": status}, "application/strategic-merge-patch+json")
        if code == 200:
            self.last_status = compare
            self.pod["status"] = obj.get("status", self.pod["status"])
        elif code not in (404, 409):
            log("%s: status update: %d %s" % (self.key, code, obj.get("message", "")))

    def run(self):
        """The pod's life. What the runner cannot do for it (an object a volume
        or an env var needs is missing, a command it cannot resolve) leaves it
        Pending with the reason in its status message, tried again every 2 s,
        as a kubelet leaves a container in CreateContainerConfigError."""
        ready_volumes = False
        last_refresh = 0.0
        while self.stopping is None:
            try:
                if not ready_volumes:
                    if not getattr(self, "has_address", False):
                        self.setup_network()
                    if not self.volumes:
                        self.setup_volumes()
                    ready_volumes = self.refresh_volumes()
                    if not ready_volumes:
                        self.error = "pod-runner: waiting for the ConfigMaps and Secrets its volumes need"
                        self.report()
                        time.sleep(RESYNC_SECONDS)
                        continue
                    last_refresh = time.time()
                if time.time() - last_refresh >= 1.0:
                    self.refresh_volumes()
                    last_refresh = time.time()
                if self.step():
                    break
                self.error = None
                self.report()
                time.sleep(0.1)
            except Exception as e:
                msg = "pod-runner: %s" % e
                if msg != self.error:
                    log("%s: %s\n%s" % (self.key, msg, traceback.format_exc()))
                self.error = msg
                try:
                    self.report()
                except Exception:
                    pass
                time.sleep(2)
        if self.stopping is not None:
            self.stop_all(self.stopping)
            self.teardown_network()
            self.done = True
            return
        try:
            self.report()
        except Exception as e:
            log("%s: final status: %s" % (self.key, e))
        self.teardown_network()
        self.done = True


def expand(s, env):
    """$(VAR) as the kubelet expands it; $$(VAR) is a literal $(VAR)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), s)


class Runner:
    def __init__(self, args):
        self.dir = os.path.abspath(args.dir)
        self.api = Api(args.server, args.pki)
        self.images = json.load(open(args.images))
        self.podnet = os.path.abspath(args.podnet)
        self.pods = {}
        self.procs = {}
        self.procs_lock = threading.Lock()
        self.ips = {}  # pod IP -> the PodRun holding it on lo
        self.ips_lock = threading.Lock()
        # Where a container's mounts are staged (PodRun.start): a directory
        # of the host, like the kubelet's /var/lib/kubelet, that no pod's
        # mountPath covers; what the runner creates there it lists in
        # DIR/mountpoints for `scripts/cluster down` to remove.
        self.stage = "/var/lib/meshload-pod-runner/" + os.path.basename(self.dir.rstrip("/")) + "-" + str(os.getpid())
        self.tokens = {}

    def image(self, ref):
        repo = ref.split("@")[0]
        if ":" in repo.rsplit("/", 1)[-1]:
            repo = repo.rsplit(":", 1)[0]
        return self.images.get(repo, {})

    def fs_group(self, pod):
        return pod["spec"].get("securityContext", {}).get("fsGroup")

    def ensure_mountpoint(self, path, is_dir):
        """A bind mount needs its target to exist on the host: what the runner
        creates it lists in DIR/mountpoints, and `scripts/cluster down` removes."""
        if os.path.exists(path):
            return
        missing = []
        p = path
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        if is_dir:
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "a").close()
        with open(os.path.join(self.dir, "mountpoints"), "a") as f:
            for m in missing:
                f.write(m + "\n")

    def field_value(self, pod, ref, container=None):
        if "resourceFieldRef" in ref:
            r = ref["resourceFieldRef"]
            res = (container or {}).get("resources", {})
            kind, name = r["resource"].split(".", 1)
            val = res.get(kind, {}).get(name) or res.get("limits", {}).get(name) or "0"
            return str(val)
        path = ref["fieldRef"]["fieldPath"]
        m = re.match(r"metadata\.(labels|annotations)\['(.*)'\]$", path)
        if m:
            return pod["metadata"].get(m.group(1), {}).get(m.group(2), "")
        simple = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"]["namespace"],
                  "metadata.uid": pod["metadata"]["uid"], "spec.nodeName": pod["spec"].get("nodeName", ""),
                  "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                  "status.podIP": pod["status"].get("podIP", ""), "status.hostIP": pod["status"].get("hostIP", ""),
                  "status.podIPs": pod["status"].get("podIP", "")}
        if path not in simple:
            raise RuntimeError("fieldRef %s is not supported by the pod runner" % path)
        return simple[path]

    def token(self, pod, t):
        m = pod["metadata"]
        key = (m["uid"], t.get("audience", ""), t["path"])
        cached = self.tokens.get(key)
        if cached and cached[1] > time.time():
            return cached[0]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": t.get("expirationSeconds", 3607),
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": m["name"], "uid": m["uid"]}}}
        if t.get("audience"):
            body["spec"]["audiences"] = [t["audience"]]
        sa = pod["spec"].get("serviceAccountName", "default")
        code, obj = self.api.request("POST", "/api/v1/namespaces/%s/serviceaccounts/%s/token" % (m["namespace"], sa), body)
        if code != 201:
            raise RuntimeError("a token for %s/%s: %d %s" % (m["namespace"], sa, code, obj.get("message", "")))
        self.tokens[key] = (obj["status"]["token"], time.time() + 1800)
        return obj["status"]["token"]

    def pvc_path(self, pod, claim):
        ns = pod["metadata"]["namespace"]
        pvc = self.api.get("/api/v1/namespaces/%s/persistentvolumeclaims/%s" % (ns, claim))
        if pvc is None or not pvc["spec"].get("volumeName"):
            raise RuntimeError("PersistentVolumeClaim %s/%s is missing or not bound" % (ns, claim))
        pv = self.api.get("/api/v1/persistentvolumes/%s" % pvc["spec"]["volumeName"])
        src = (pv or {}).get("spec", {})
        path = (src.get("hostPath") or src.get("local") or {}).get("path")
        if not path:
            raise RuntimeError("PersistentVolume %s: only hostPath and local volumes can be mounted here"
                               % pvc["spec"]["volumeName"])
        return path

    def track(self, run, c):
        with self.procs_lock:
            self.procs[id(c)] = (run, c)

    def untrack(self, c):
        with self.procs_lock:
            self.procs.pop(id(c), None)

    def kwok_nodes(self):
        nodes = self.api.get("/api/v1/nodes") or {"items": []}
        return {n["metadata"]["name"] for n in nodes["items"]
                if n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake"}

    def loop(self):
        while True:
            try:
                self.sync()
            except Exception as e:
                log("sync: %s" % e)
            time.sleep(RESYNC_SECONDS)

    def sync(self):
        nodes = self.kwok_nodes()
        pods = self.api.get("/api/v1/pods") or {"items": []}
        seen, orphaned = set(), set()
        for pod in pods["items"]:
            m, spec, st = pod["metadata"], pod["spec"], pod.get("status", {})
            uid = m["uid"]
            if spec.get("nodeName") not in nodes:
                orphaned.add(uid)  # its node deleted: its processes die with it
                continue
            seen.add(uid)
            run = self.pods.get(uid)
            if run is None:
                if m.get("deletionTimestamp") or not st.get("podIP") or st.get("phase") in ("Succeeded", "Failed"):
                    continue
                run = PodRun(self, pod)
                self.pods[uid] = run
                run.thread.start()
                continue
            run.pod["metadata"] = m
            if m.get("deletionTimestamp") and run.stopping is None:
                run.stopping = min(pod["spec"].get("terminationGracePeriodSeconds", 30), m.get("deletionGracePeriodSeconds", 30))
                log("%s: deleted; stopping its containers (grace %d s)" % (run.key, run.stopping))
            if m.get("deletionTimestamp") and run.done:
                self.remove(pod)
        # A pod being deleted that the runner never ran (no IP yet, or done
        # before): nothing to stop.
        for pod in pods["items"]:
            m = pod["metadata"]
            if m.get("deletionTimestamp") and pod["spec"].get("nodeName") in nodes and m["uid"] not in self.pods:
                self.remove(pod)
        for uid in list(self.pods):
            run = self.pods[uid]
            if uid not in seen and run.stopping is None:
                run.stopping = 0
                log("%s: %s; stopping its containers" %
                    (run.key, "its node was deleted" if uid in orphaned else "gone from the API server"))
            if uid not in seen and run.done:
                del self.pods[uid]

    def remove(self, pod):
        """What the kubelet does once a deleted pod's containers have stopped:
        deletes it for good (grace 0, its UID as precondition). Finalizers
        others put on it (the Job controller's) still hold it until removed."""
        m = pod["metadata"]
        code, obj = self.api.request(
            "DELETE", "/api/v1/namespaces/%s/pods/%s" % (m["namespace"], m["name"]),
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0, "preconditions": {"uid": m["uid"]}})
        if code not in (200, 202, 404, 409):
            log("%s/%s: delete: %d %s" % (m["namespace"], m["name"], code, obj.get("message", "")))

    def shutdown(self):
        for run in list(self.pods.values()):
            run.stopping = 0
        for run in list(self.pods.values()):
            run.thread.join(timeout=10)
        # The staging directories are plain directories on the host (the
        # binds lived in the containers' own mount namespaces).
        shutil.rmtree(self.stage, ignore_errors=True)

    # ---- the cAdvisor series the dashboard reads ----
    def metrics(self):
        lines = ["# TYPE container_cpu_usage_seconds_total counter",
                 "# TYPE container_memory_working_set_bytes gauge"]
        tick = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        with self.procs_lock:
            entries = list(self.procs.values())
        cpu, mem = [], []
        for run, c in entries:
            proc = c.proc
            if proc is None:
                continue
            total_cpu, rss = 0.0, 0
            for pid in process_tree(proc.pid):
                try:
                    fields = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
                    total_cpu += (int(fields[11]) + int(fields[12])) / tick
                    rss += int(open("/proc/%d/statm" % pid).read().split()[1]) * page
                except (OSError, IndexError, ValueError):
                    continue
            ns, name = run.key.split("/", 1)
            labels = 'container="%s",namespace="%s",pod="%s"' % (c.name, ns, name)
            cpu.append("container_cpu_usage_seconds_total{%s} %.6f" % (labels, total_cpu))
            mem.append("container_memory_working_set_bytes{%s} %d" % (labels, rss))
        return "\n".join(lines[:1] + cpu + lines[1:] + mem) + "\n"


def process_tree(root):
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(open("/proc/%s/stat" % entry).read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def serve_metrics(runner, port, port_file):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics/cadvisor":
                self.send_error(404)
                return
            body = runner.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    with open(port_file + ".tmp", "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(port_file + ".tmp", port_file)
    threading.Thread(target=srv.serve_forever, daemon=True).start()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--pki", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--podnet", required=True)
    p.add_argument("--metrics-port", type=int, default=0)
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("pod-runner: needs root (mount namespaces, bind mounts, running containers as their users)")
    runner = Runner(args)
    runner.ensure_mountpoint(runner.stage, True)
    # The library where no mountPath hides it (a pod's /tmp would hide DIR below /tmp).
    runner.podnet_staged = os.path.join(runner.stage, "podnet.so")
    shutil.copy(runner.podnet, runner.podnet_staged)
    os.chmod(runner.stage, 0o755)
    os.chmod(runner.podnet_staged, 0o755)
    serve_metrics(runner, args.metrics_port, os.path.join(runner.dir, "runner-metrics-port"))

    def stop(*_):
        runner.shutdown()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log("running the pods of kwok's nodes")
    runner.loop()


if __name__ == "__main__":
    main()
