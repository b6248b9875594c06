"""One JAX trainer process of tests/client/jax_test.py.

Connects to its sidecar, and for each of --steps steps builds the global
jax.Array with meshload.jax.global_array and checks, in jitted functions,
that it equals the planner's global batch (--expected, a .npy of shape
[steps, global batch, 32] uint64 words) and that replicas hold identical data
(shard_map: every device's block against its replicas'). Also checks that
the per-device arrays are zero-copy views of the staged slots. Writes one
JSON object to --report: {"ok": true, ...} or {"error": type, "message": ...}.
The report goes to a file, not stdout: JAX's CPU collectives (Gloo) print
"[Gloo] Rank N is connected ..." to stdout from their own threads, and with
PYTHONUNBUFFERED those lines can land between a printed object and its newline.
"""

import argparse
import sys

import harness


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--cpu-devices", type=int, required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--expected")
    ap.add_argument("--report", required=True, help="where to write the JSON report (atomically)")
    ap.add_argument("--pad-to", type=int, help="a ragged job: pad every sample to this length; --expected is then "
                    "an .npz of `values` [steps, global batch, pad_to] and `lengths` [steps, global batch]")
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--user-mesh", choices=["none", "axes-swapped", "devices-reversed", "job"], default="none")
    args = ap.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    jax.config.update("jax_platforms", "cpu")
    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id, initialization_timeout=60)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import meshload
    import meshload.jax as mjax

    try:
        shard_map = jax.shard_map
    except AttributeError:  # JAX < 0.7
        from jax.experimental.shard_map import shard_map

    expected = np.load(args.expected) if args.expected else None
    report = {"ok": False, "steps": 0, "zero_copy": 0, "replica_checks": 0}
    if args.pad_to is not None:
        return ragged(args, report, expected)
    try:
        with meshload.Client(args.socket) as client:
            job_mesh = client.mesh
            names = [n for n, _ in job_mesh.axes]
            replica_axes = tuple(n for n in names if n not in job_mesh.batch_axes)
            checks = {}
            for _ in range(args.steps):
                batch = client.next(timeout=60)
                for t in batch.tensors:
                    assert t.data_ptr % 64 == 0, "tensor at %#x is not 64-byte aligned" % t.data_ptr
                user_mesh = None
                if args.user_mesh != "none":
                    m = mjax.mesh(batch)
                    if args.user_mesh == "axes-swapped":
                        user_mesh = Mesh(m.devices.T, tuple(reversed(m.axis_names)))
                    elif args.user_mesh == "devices-reversed":
                        user_mesh = Mesh(m.devices.reshape(-1)[::-1].reshape(m.devices.shape), m.axis_names)
                    else:
                        user_mesh = Mesh(m.devices, m.axis_names)
                x = mjax.global_array(batch, mesh=user_mesh)
                mesh = x.sharding.mesh
                spec = mjax.partition_spec(batch)
                assert x.sharding == NamedSharding(mesh, spec), x.sharding
                # Zero-copy: every local shard is the slot the sidecar staged.
                on = {next(iter(s.data.devices())): s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
                for t, dev in zip(batch.tensors, mesh.devices.flat[[t.global_device for t in batch.tensors]]):
                    assert on[dev] == t.data_ptr, "device %d: JAX copied the tensor" % t.global_device
                    report["zero_copy"] += 1
                if expected is not None:
                    want_np = expected[batch.step]
                    assert x.shape == want_np.view(np.uint8).shape, (x.shape, want_np.shape)
                    want = jax.make_array_from_callback(
                        x.shape, x.sharding, lambda idx: want_np.view(np.uint8)[idx])
                    if "equal" not in checks:
                        checks["equal"] = jax.jit(lambda a, b: jnp.all(a == b),
                                                  out_shardings=NamedSharding(mesh, P()))
                    same = checks["equal"](x, want)
                    if not bool(same.addressable_data(0)):
                        raise AssertionError("step %d: the global array is not the planner's global batch"
                                             % batch.step)
                if replica_axes:
                    if "replicas" not in checks:
                        def block_agrees(block):
                            everyone = jax.lax.all_gather(block, replica_axes)
                            ok = jnp.all(everyone == block[None]).astype(jnp.int32)
                            return jax.lax.pmin(ok, tuple(names))

                        checks["replicas"] = jax.jit(shard_map(block_agrees, mesh=mesh, in_specs=spec,
                                                               out_specs=P()))
                    agree = checks["replicas"](x)
                    if int(agree.addressable_data(0)) != 1:
                        raise AssertionError("step %d: replicas along %s differ" % (batch.step, replica_axes))
                    report["replica_checks"] += 1
                report["steps"] += 1
                report["global_shape"] = list(x.shape)
                del x, batch
        # jnp.from_dlpack on the default CPU device: zero-copy too.
        with meshload.Client(args.socket) as client:
            b = client.next(timeout=60)
            a = jnp.from_dlpack(b.tensors[0])
            report["from_dlpack_zero_copy"] = a.unsafe_buffer_pointer() == b.tensors[0].data_ptr
            del a, b
        report["ok"] = True
    except Exception as e:  # noqa: BLE001 (reported to the test)
        report["error"] = type(e).__name__
        report["message"] = str(e)
    harness.write_json_atomically(args.report, report)
    return 0


def ragged(args, report, expected):
    """A ragged job: global_array(batch, pad_to=...) is the planner's global
    batch, padded, with the kept lengths."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    import meshload
    import meshload.jax as mjax

    try:
        with meshload.Client(args.socket) as client:
            for _ in range(args.steps):
                batch = client.next(timeout=60)
                spec = mjax.partition_spec(batch)
                if batch.fields == ("",):
                    assert all(isinstance(t, meshload.Ragged) for t in batch.tensors), batch.tensors
                    values, lengths = mjax.global_array(batch, pad_to=args.pad_to, pad_value=0)
                    checks = [(values, "values"), (lengths, "lengths")]
                    report["global_shape"] = list(values.shape)
                else:
                    # Named fields: a dict of global arrays, ragged ones padded.
                    arrays = mjax.global_array(batch, pad_to=args.pad_to, pad_value=0)
                    assert sorted(arrays) == sorted(batch.fields), sorted(arrays)
                    checks = []
                    for name, a in arrays.items():
                        if isinstance(a, tuple):
                            checks += [(a[0], name + ".values"), (a[1], name + ".lengths")]
                        else:
                            checks.append((a, name))
                    one = mjax.global_array(batch, field="cls")  # one field alone
                    assert np.array_equal(np.asarray(one.addressable_shards[0].data),
                                          np.asarray(arrays["cls"].addressable_shards[0].data))
                    report["field_shapes"] = {n: list((a[0] if isinstance(a, tuple) else a).shape)
                                              for n, a in arrays.items()}
                    del one
                for arr, key in checks:
                    want = expected[key][batch.step]
                    assert arr.sharding == NamedSharding(arr.sharding.mesh, spec), arr.sharding
                    assert arr.shape == want.shape, (key, arr.shape, want.shape)
                    for shard in arr.addressable_shards:
                        got = np.asarray(shard.data)
                        if not np.array_equal(got, want[shard.index].astype(got.dtype)):
                            raise AssertionError("step %d: %s rows %s differ from the planned, padded samples"
                                                 % (batch.step, key, shard.index))
                report["steps"] += 1
                del checks, batch
        report["ok"] = True
    except Exception as e:  # noqa: BLE001 (reported to the test)
        report["error"] = type(e).__name__
        report["message"] = str(e)
    harness.write_json_atomically(args.report, report)
    del jax
    return 0


if __name__ == "__main__":
    sys.exit(main())
