#!/usr/bin/env python3
"""A JAX trainer fed by meshload: each step's global batch as one jax.Array.

In a trainer pod (the sidecar-injection webhook sets MESHLOAD_SOCKET):

    pip install meshload[jax]       # or the wheel built from client/python
    python jax_trainer.py --steps 1000

Multi-process jobs start JAX's distributed runtime first, as any multi-host
JAX program does (--coordinator/--num-processes/--process-id, or the
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID environment
variables; on TPU and SLURM JAX finds them itself). The global array's mesh
and sharding come from the DataLoadJob through the sidecar: this file never
spells out the mesh.

The model is a toy (a linear probe over the bytes of each sample) so that
the example runs on any CPU; the data path is the real one. Each step prints
one JSON line with the step, the loss and the sum of the global batch's
bytes (the tests compare it with the planner's batches).
"""

import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default="", help="the sidecar's socket (default: $MESHLOAD_SOCKET)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--coordinator", default=os.environ.get("JAX_COORDINATOR_ADDRESS"))
    ap.add_argument("--num-processes", type=int, default=int(os.environ.get("JAX_NUM_PROCESSES", "1")))
    ap.add_argument("--process-id", type=int, default=int(os.environ.get("JAX_PROCESS_ID", "0")))
    ap.add_argument("--cpu-devices", type=int, default=0,
                    help="run JAX on this many CPU devices (spec.mesh.devicesPerProcess) instead of accelerators")
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    args = ap.parse_args()

    import jax

    if args.cpu_devices:
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.coordinator and args.num_processes > 1:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    import meshload
    import meshload.jax

    with meshload.Client(args.socket) as client:
        params = None
        step_fn = None
        for _ in range(args.steps):
            batch = client.next()
            x = meshload.jax.global_array(batch)          # [global batch, *sample], sharded like the job
            if params is None:
                mesh = meshload.jax.mesh(batch)
                replicated = NamedSharding(mesh, P())
                features = x.size // x.shape[0]
                params = jax.device_put(jnp.zeros((features,), jnp.float32), replicated)

                def loss_fn(w, xb):
                    f = xb.reshape(xb.shape[0], -1).astype(jnp.float32) / 255.0
                    target = jnp.mean(f, axis=1)
                    return jnp.mean((f @ w - target) ** 2)

                @jax.jit
                def step_fn(w, xb):
                    loss, grad = jax.value_and_grad(loss_fn)(w, xb)
                    total = jnp.sum(xb.astype(jnp.int32))
                    return w - args.learning_rate * grad, loss, total

            params, loss, total = step_fn(params, x)
            # Replicated results: every process reads its own copy.
            print(json.dumps({"step": batch.step, "loss": float(loss.addressable_data(0)),
                              "batch_sum": int(total.addressable_data(0)),
                              "wait_ms": round(batch.wait_seconds * 1e3, 3)}), flush=True)
            del x, batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
