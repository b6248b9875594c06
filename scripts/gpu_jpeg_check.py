#!/usr/bin/env python3
"""scripts/gpu-check's JPEG check: the JPEG example trainer
(examples/python/torch_jpeg_trainer.py) decoding on the GPU.

    PYTHONPATH=<the compiled module> python3 scripts/gpu_jpeg_check.py \\
        --meshload BIN/meshload --sidecar BIN/meshload-sidecar

Writes a WebDataset shard of JPEGs (encoded by torchvision, the class as
text; tar members KEY.jpg and KEY.cls as webdataset's TarWriter writes them,
here with Python's tarfile), indexes it with `meshload index`, and runs the example trainer twice: against
a sidecar staging in host memory (the encoded files read by nvJPEG in the
slot) and one staging on the GPU (the fields in device memory, the files
copied back for the decoder). Every step: the images were decoded on the
GPU, the labels are the planned samples', and the decoded pixels equal
torchvision's GPU decode of the same files. Prints one line per check and exits 1 on a failure; 2 when
torchvision (or a GPU) is missing.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meshload", required=True)
    ap.add_argument("--sidecar", required=True)
    args = ap.parse_args()
    try:
        import numpy as np
        import torch
        from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg
    except ImportError as e:
        print("SKIP the JPEG example: %s" % e)
        return 2
    if not torch.cuda.is_available():
        print("SKIP the JPEG example: torch sees no GPU")
        return 2
    d = tempfile.mkdtemp(prefix="gpu-jpeg-")
    rng = np.random.default_rng(36)
    files, labels = [], []
    with tarfile.open(os.path.join(d, "train-000000.tar"), "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(40):
            h, w = (int(x) for x in rng.integers(16, 96, size=2))
            img = torch.from_numpy(rng.integers(0, 256, size=(3, h, w), dtype=np.uint8))
            jpg = encode_jpeg(img, quality=90).numpy().tobytes()
            files.append(jpg)
            labels.append(int(rng.integers(0, 1000)))
            for ext, data in (("jpg", jpg), ("cls", str(labels[-1]).encode())):
                info = tarfile.TarInfo("%06d.%s" % (i, ext))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    subprocess.run([args.meshload, "index", os.path.join(d, "train-000000.tar")], check=True, capture_output=True)
    job = os.path.join(d, "job.yaml")
    with open(job, "w") as f:
        f.write("apiVersion: meshload.io/v1alpha1\nkind: DataLoadJob\nmetadata: {name: gpu-jpeg}\nspec:\n"
                "  mesh: {processes: 1, devicesPerProcess: 1, axes: [{name: data, size: 1}]}\n"
                "  strategy: PerProcess\n"
                "  dataset: {uri: \"%s\", format: WebDataset, fields: [{name: jpg}, {name: cls, dtype: int64}]}\n"
                "  batch: {globalBatchSize: 8, prefetch: 3}\n  shuffle: {mode: Global, seed: 5}\n"
                % os.path.join(d, "train-000000.tar"))
    plan = json.loads(subprocess.run([args.meshload, "plan", "-f", job, "--steps", "0:%d" % STEPS, "--format",
                                      "json"], check=True, capture_output=True, text=True).stdout)
    planned = {s["step"]: [i for dev in s["devices"] for i in dev["samples"]] for s in plan["steps"]}
    ok = True
    for staging in ("host", "cuda"):
        sock = os.path.join(d, "s-%s.sock" % staging)
        log = os.path.join(d, "sidecar-%s.log" % staging)
        sidecar = subprocess.Popen([args.sidecar, "--job", job, "--process", "0", "--socket", sock, "--staging",
                                    staging], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=open(log, "wb"))
        try:
            for _ in range(500):
                if os.path.exists(sock) or sidecar.poll() is not None:
                    break
                time.sleep(0.02)
            example = os.path.join(ROOT, "examples", "python", "torch_jpeg_trainer.py")
            p = subprocess.run([sys.executable, example, "--socket", sock, "--steps", str(STEPS)], capture_output=True,
                               text=True, timeout=300)
        finally:
            sidecar.terminate()
            sidecar.wait(20)
        if p.returncode != 0:
            print("FAIL the JPEG example (--staging %s) exited %d:\n%s\n--- sidecar\n%s"
                  % (staging, p.returncode, p.stderr[-3000:], open(log).read()[-2000:]))
            ok = False
            continue
        rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        ok = ok and [r["step"] for r in rows] == list(range(STEPS))
        for r in rows:
            ids = planned[r["step"]]
            want_pixels = sum(int(decode_jpeg(torch.frombuffer(bytearray(files[i]), dtype=torch.uint8),
                                              mode=ImageReadMode.RGB, device="cuda").to(torch.int64).sum())
                              for i in ids)
            labels_ok = r["label_sum"] == sum(labels[i] for i in ids)
            good = (r["decoded_on"].startswith("cuda") and labels_ok and r["pixel_sum"] == want_pixels and
                    np.isfinite(r["loss"]))
            print("%s --staging %s step %d: %d images decoded on %s, labels %s, pixels %s, loss %.3f"
                  % ("ok  " if good else "FAIL", staging, r["step"], r["images"], r["decoded_on"],
                     "as planned" if labels_ok else "NOT as planned",
                     "equal to torchvision's GPU decode" if r["pixel_sum"] == want_pixels else "DIFFERENT", r["loss"]))
            ok = ok and good
    print("jpeg: %s (%d steps each with host and GPU staging, nvJPEG decode)" % ("ok" if ok else "FAILED", STEPS))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
