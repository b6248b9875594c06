#!/usr/bin/env python3
"""A tiny causal language model trained in JAX on packed rows from meshload.

One JAX process of tests/client/lm_test.py. Each step it takes the global
batch of packed rows (spec.tokens Pack: `tokens`, `segment_ids`,
`positions`) as global jax.Arrays, builds the attention mask from the
segment ids (causal, within a document, never on padding), and takes one
Adam step of a one-layer transformer predicting each token's successor in
its document. It writes a JSON report: per step, the loss and the SHA-256
of the whole global batch's three arrays (gathered to every process), so
the test can compare runs bit for bit.
"""

import argparse
import json
import os
import sys

import harness

VOCAB = 64
WIDTH = 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--cpu-devices", type=int, required=True)
    ap.add_argument("--report", required=True)
    ap.add_argument("--coordinator")
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    args = ap.parse_args()

    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", args.cpu_devices)
    if args.coordinator:
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import meshload
    import meshload.jax

    def init(key, length):
        ks = jax.random.split(key, 8)
        scale = 0.1
        return {
            "embed": jax.random.normal(ks[0], (VOCAB, WIDTH)) * scale,
            "pos": jax.random.normal(ks[1], (length, WIDTH)) * scale,
            "q": jax.random.normal(ks[2], (WIDTH, WIDTH)) * scale,
            "k": jax.random.normal(ks[3], (WIDTH, WIDTH)) * scale,
            "v": jax.random.normal(ks[4], (WIDTH, WIDTH)) * scale,
            "o": jax.random.normal(ks[5], (WIDTH, WIDTH)) * scale,
            "mlp": jax.random.normal(ks[6], (WIDTH, WIDTH)) * scale,
            "out": jax.random.normal(ks[7], (WIDTH, VOCAB)) * scale,
        }

    def loss_fn(p, tokens, segments, positions):
        x = p["embed"][tokens] + p["pos"][positions]
        q, k, v = x @ p["q"], x @ p["k"], x @ p["v"]
        scores = jnp.einsum("bsd,btd->bst", q, k) / jnp.sqrt(WIDTH)
        t = tokens.shape[1]
        causal = jnp.tril(jnp.ones((t, t), dtype=bool))
        # Attention stays inside a document and off padding (segment 0).
        same = (segments[:, :, None] == segments[:, None, :]) & (segments[:, :, None] > 0)
        scores = jnp.where(causal[None] & same, scores, -1e9)
        x = x + jax.nn.softmax(scores, axis=-1) @ v @ p["o"]
        x = x + jax.nn.relu(x @ p["mlp"])
        logits = x @ p["out"]
        # Each token predicts the next one of its own document.
        target = tokens[:, 1:]
        valid = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
        logp = jax.nn.log_softmax(logits[:, :-1])
        nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(jnp.sum(valid), 1)

    @jax.jit
    def train_step(p, m, s, i, tokens, segments, positions):
        loss, g = jax.value_and_grad(loss_fn)(p, tokens, segments, positions)
        b1, b2, lr = 0.9, 0.99, 3e-3
        m = jax.tree_util.tree_map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
        s = jax.tree_util.tree_map(lambda a, b: b2 * a + (1 - b2) * b * b, s, g)
        mh = jax.tree_util.tree_map(lambda a: a / (1 - b1 ** i), m)
        sh = jax.tree_util.tree_map(lambda a: a / (1 - b2 ** i), s)
        p = jax.tree_util.tree_map(lambda a, b, c: a - lr * b / (jnp.sqrt(c) + 1e-8), p, mh, sh)
        return p, m, s, loss

    report = {"ok": False, "steps": [], "digests": [], "losses": []}
    try:
        with meshload.Client(args.socket) as client:
            params = opt_m = opt_s = None
            for n in range(args.steps):
                batch = client.next()
                arrays = meshload.jax.global_array(batch)
                tokens = arrays["tokens"].astype(jnp.int32)
                segments, positions = arrays["segment_ids"], arrays["positions"]
                whole = [np.ascontiguousarray(multihost_utils.process_allgather(arrays[name], tiled=True))
                         for name in ("tokens", "segment_ids", "positions")]
                if params is None:
                    replicated = NamedSharding(meshload.jax.mesh(batch), P())
                    params = jax.device_put(init(jax.random.PRNGKey(0), tokens.shape[1]), replicated)
                    opt_m = jax.tree_util.tree_map(jnp.zeros_like, params)
                    opt_s = jax.tree_util.tree_map(jnp.zeros_like, params)
                params, opt_m, opt_s, loss = train_step(params, opt_m, opt_s, float(n + 1), tokens, segments,
                                                        positions)
                report["steps"].append(batch.step)
                report["digests"].append(harness.packed_batch_digest(*whole))
                report["losses"].append(float(loss.addressable_data(0)))
                del arrays, tokens, segments, positions, batch
        report["ok"] = True
    except Exception as e:  # the test shows what went wrong
        import traceback
        report["error"] = "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc())
    harness.write_json_atomically(args.report, report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
