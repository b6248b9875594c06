#!/usr/bin/env python3
"""An image classifier trained on WebDataset JPEGs that meshload serves,
decoded on the GPU.

The DataLoadJob names the fields (examples/webdataset-images.yaml):

    fields:
      - name: jpg            # the encoded image, as stored: a meshload.Ragged
      - name: cls            # the class, decoded from its text: an int64 Tensor
        dtype: int64

so each batch holds this device's JPEG files back to back (and their
offsets) and their labels, in the staged slot. The trainer views each
image's bytes without a copy (`Ragged.to_list()`) and decodes the batch with
torchvision's nvJPEG decoder (`torchvision.io.decode_jpeg(...,
device="cuda")`), or on the CPU without a GPU, resizes to 32 x 32 and trains
a small convolutional network for a few steps. No DataLoader, no worker
processes, no decoding on the host when a GPU is there.

nvJPEG parses each file on the host and decodes on the GPU, so encoded
images are best staged in host memory (the sidecar's `--staging host`, or
a job whose sidecar stages on the host): the decoder reads them in the slot.
When the sidecar stages on the GPU, the files are copied back to the host
for the decoder (small: they are compressed), and the labels stay on the
GPU.

    pip install meshload torch torchvision
    python torch_jpeg_trainer.py --steps 100          # MESHLOAD_SOCKET from the webhook

Each step prints one JSON line: the step, the loss, the images decoded,
where they were decoded, the labels' sum and the decoded pixels' sum (the
checks compare them with the images the shards hold).
"""

import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default="", help="the sidecar's socket (default: $MESHLOAD_SOCKET)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--size", type=int, default=32, help="images are resized to size x size")
    ap.add_argument("--learning-rate", type=float, default=1e-2)
    ap.add_argument("--device", default="", help="decode and train here (default: cuda:0 when torch sees a GPU)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import torchvision
    from torchvision.io import ImageReadMode, decode_jpeg

    import meshload

    torch.manual_seed(0)
    device = torch.device(args.device or ("cuda:0" if torch.cuda.is_available() else "cpu"))
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, args.classes))
    opt = None
    with meshload.Client(args.socket) as client:
        if client.global_batch == 0:
            raise SystemExit("the sidecar serves no batches")
        for _ in range(args.steps):
            batch = client.next()
            if batch.fields != ("jpg", "cls"):
                raise SystemExit("this trainer needs a job whose fields are jpg (bytes) and cls (int64), not %s"
                                 % (batch.fields,))
            images, labels = [], []
            for device_batch in batch.tensors:  # one dict per local device
                jpg, cls = device_batch["jpg"], device_batch["cls"]
                # Each JPEG file's bytes, viewed in the slot (no copy); the
                # decoder parses them on the host (copied back from a GPU slot).
                files = [torch.from_dlpack(v) if not isinstance(v, torch.Tensor) else v for v in jpg.to_list()]
                files = [f.cpu() for f in files]
                if device.type == "cuda":
                    decoded = decode_jpeg(files, mode=ImageReadMode.RGB, device=device)
                else:
                    decoded = [decode_jpeg(f, mode=ImageReadMode.RGB) for f in files]
                for img in decoded:
                    images.append(F.interpolate(img.unsqueeze(0).float() / 255.0, size=(args.size, args.size),
                                                mode="bilinear", align_corners=False))
                labels.append(torch.from_dlpack(cls).to(device))
            x = torch.cat(images)
            y = torch.cat(labels)
            if opt is None:
                model.to(x.device)
                opt = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
            loss = F.cross_entropy(model(x), y % args.classes)
            opt.zero_grad()
            loss.backward()
            opt.step()
            pixel_sum = int(sum(int(img.to(torch.int64).sum()) for img in decoded)) if len(batch.tensors) == 1 else -1
            print(json.dumps({"step": batch.step, "loss": float(loss), "images": int(x.shape[0]),
                              "decoded_on": str(x.device), "label_sum": int(y.sum()), "pixel_sum": pixel_sum,
                              "torchvision": torchvision.__version__}), flush=True)
            del batch, images, labels, x, y, files, decoded
    return 0


if __name__ == "__main__":
    sys.exit(main())
