"""Cost of derivatives of a rollout: reverse mode against forward mode, time and memory.

Loss: the sum of squares of the final state (q and u of every body and batch member) after
``steps`` steps; derivatives with respect to the initial state (q0, u0) and the model's mass and
inertia leaves. For the torque-free body (I = diag(1, 2, 3), ω0 ≈ (0.01, 5, 0) rad/s,
dt = 1e-3) and the double pendulum of examples/double_pendulum.py (released near horizontal,
dt = 1e-3), 1000 steps each, batch B ∈ {1, 256}, each integrator:

* ``eval``: the loss alone (the forward rollout); ``rev``: the loss and its full gradient
  (``jax.value_and_grad``, reverse mode); ``fwd``: the loss and ONE directional derivative
  (``jax.jvp``), for reference. Each is an ahead-of-time compiled ``jax.jit`` function:
  compile time and run time (median of ``--repeats`` calls after ``block_until_ready``)
  separately, and XLA's temporary buffer size of the compiled program
  (``compiled.memory_analysis().temp_size_in_bytes``: the peak of its live intermediates in
  XLA's buffer assignment; arguments and outputs are a few kB);
* the ratio rev / eval of run times, the cost of a gradient in forward rollouts (issue 14's
  targets, :func:`target_ratio`: ImplicitMidpoint ≤ 3, the free body ≤ 6, mechanisms ≤ 8;
  reported, not asserted), and rev / fwd.

The rev rows use ``rollout``'s default checkpointing (``Checkpoint()``: every step
recomputed in the backward pass) and, as "rev@False", ``checkpoint=None`` (no checkpointing: every step's residuals
stored); ``--checkpoints`` chooses others. A case that cannot be differentiated is recorded with
its error. ``--sweep`` adds reverse-mode memory and time against the horizon (``--horizons``)
for ``checkpoint=None``, the default and ``Checkpoint(every=None)`` (k ≈ √steps), saving only the final state or
every state (RK4, B = 1); compile times of the double pendulum's reverse mode make it long
(about a minute per row).

    python benchmarks/gradients.py --json benchmarks/results/gradients.json [--quick] [--sweep]
    python benchmarks/gradients.py --table benchmarks/results/gradients.json   # print the tables

The "reference" part (skip with ``--no-reference``) times the same free-body loss written
directly in JAX without rbjax (Euler's equations and the attitude quaternion only; its final ω
is checked against rbjax's NewtonEuler RK4 rollout and printed): eval, rev with
``jax.checkpoint`` around every step and rev without, for SemiImplicitEuler and RK4, with the
state stacked into arrays and as a tuple of components. It measures what XLA's reverse mode
costs on the smallest program doing the job, the baseline against which rbjax's ratios are
judged.

Records: part ("cost", "reference" or "checkpoint_sweep"), problem, integrator, formulation,
dtype, batch, steps, mode (eval/fwd/rev), compile_s, run_s, temp_bytes, rev_over_fwd and
rev_over_eval (rev rows), error (failed rows), note (rows re-measured alone), + machine info;
sweep records also save_every, checkpoint and interval (the steps between stored states).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from free_body import write_records  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import double_pendulum as dp  # noqa: E402

INTEGRATORS = {
    "SemiImplicitEuler": lambda: rbjax.SemiImplicitEuler(),
    "RK4": lambda: rbjax.RK4(),
    "ImplicitMidpoint": lambda: rbjax.ImplicitMidpoint(),
    "Projected(RK4)": lambda: rbjax.Projected(rbjax.RK4()),
}


def problem(name: str, batch: int):
    """(model, state) of a benchmark problem with ``batch`` systems (slightly different ones)."""
    if name == "free_body":
        model = rbjax.Model(rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0]))))
        rng = np.random.default_rng(0)
        w = np.array([0.01, 5.0, 0.0]) + 1e-3 * rng.standard_normal((batch, 1, 3))
        return model, rbjax.make_state(omega_body=w)
    if name == "arm6":  # the 6-joint arm with PD motors of benchmarks/models.py, B copies
        import models

        model, state = models.build("arm6")
        return model, jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), state)
    model = dp.model()
    states = [dp.initial_state(np.pi / 2 + 0.1 * k / batch, np.pi / 2) for k in range(batch)]
    return model, jax.tree.map(lambda *x: jnp.stack(x), *states)


DEFAULT_CHECKPOINT = rbjax.Checkpoint()


def loss_fn(model, t0, integrator, steps, dt, save_every=None, checkpoint=DEFAULT_CHECKPOINT):
    """Sum of squares of the final state; arguments (q0, u0, mass, inertia)."""
    save_every = steps if save_every is None else save_every

    def loss(q0, u0, mass, inertia):
        m = eqx.tree_at(lambda mm: (mm.mass, mm.inertia), model, (mass, inertia))
        tr = rbjax.rollout(
            m,
            rbjax.State(t=t0, q=q0, u=u0),
            dt,
            steps,
            integrator=integrator,
            save_every=save_every,
            checkpoint=checkpoint,
        )
        return jnp.sum(tr.q[..., -1, :, :] ** 2) + jnp.sum(tr.u[..., -1, :, :] ** 2)

    return loss


def measure(fn, args, repeats):
    """AOT-compile ``fn``; (compile s, median run s, temp bytes)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    temp = int(mem.temp_size_in_bytes) if mem is not None else -1
    jax.block_until_ready(compiled(*args))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - t0)
    return compile_s, statistics.median(runs), temp


def cost_case(name, integ_name, batch, steps, repeats, checkpoints=(DEFAULT_CHECKPOINT,)):
    """eval, fwd and one rev record per ``rollout(checkpoint=...)`` value (mode "rev" for the
    first, "rev@<value>" for the others)."""
    model, state = problem(name, batch)
    integ = INTEGRATORS[integ_name]()
    loss = loss_fn(model, state.t, integ, steps, 1e-3, checkpoint=checkpoints[0])
    args = (state.q, state.u, model.mass, model.inertia)
    key = jax.random.PRNGKey(1)
    tangents = tuple(
        jax.random.normal(k, a.shape, a.dtype)
        for k, a in zip(jax.random.split(key, 4), args, strict=True)
    )
    modes = {
        "eval": loss,
        "fwd": lambda *a: jax.jvp(loss, a, tangents),
        "rev": jax.value_and_grad(loss, argnums=(0, 1, 2, 3)),
    }
    for ck in checkpoints[1:]:
        other = loss_fn(model, state.t, integ, steps, 1e-3, checkpoint=ck)
        # "rev@False" (no checkpointing) keeps the label of the results recorded before
        # rollout took Checkpoint objects; "rev@<k>" a Checkpoint(every=k)
        label = "False" if ck is None else str(ck.every)
        modes[f"rev@{label}"] = jax.value_and_grad(other, argnums=(0, 1, 2, 3))
    base = {
        "part": "cost",
        "problem": name,
        "integrator": integ_name,
        "formulation": type(model.formulation).__name__,
        "dtype": "float64",
        "batch": batch,
        "steps": steps,
        "dt": 1e-3,
    }
    out = {}
    for mode, fn in modes.items():
        ck = checkpoints[0] if not mode.startswith("rev@") else mode[4:]
        rec = dict(base, mode=mode, checkpoint=str(ck) if mode.startswith("rev") else None)
        try:
            rec["compile_s"], rec["run_s"], rec["temp_bytes"] = measure(fn, args, repeats)
        except Exception as e:  # e.g. a derivative rule that does not exist yet
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            rec.update(compile_s=float("nan"), run_s=float("nan"), temp_bytes=-1, error=msg)
        out[mode] = rec
    for mode, rec in out.items():
        if mode.startswith("rev@") and "error" not in rec and "error" not in out["eval"]:
            rec["rev_over_eval"] = rec["run_s"] / out["eval"]["run_s"]
    if "error" not in out["rev"]:
        if "error" not in out["eval"]:
            out["rev"]["rev_over_eval"] = out["rev"]["run_s"] / out["eval"]["run_s"]
        if "error" not in out["fwd"]:
            out["rev"]["rev_over_fwd"] = out["rev"]["run_s"] / out["fwd"]["run_s"]
    return list(out.values())


def _euler_rhs(q, w, inertia):
    """Torque-free rigid body in plain JAX: Euler's equations and Ȧ = ½ A (0, ω), on tuples
    of components (each of shape (B,))."""
    q0, q1, q2, q3 = q
    w1, w2, w3 = w
    i1, i2, i3 = inertia
    dq = (
        0.5 * (-q1 * w1 - q2 * w2 - q3 * w3),
        0.5 * (q0 * w1 + q2 * w3 - q3 * w2),
        0.5 * (q0 * w2 + q3 * w1 - q1 * w3),
        0.5 * (q0 * w3 + q1 * w2 - q2 * w1),
    )
    dw = ((i2 - i3) * w2 * w3 / i1, (i3 - i1) * w3 * w1 / i2, (i1 - i2) * w1 * w2 / i3)
    return dq, dw


def _axpy(x, y, a):
    return tuple(xi + a * yi for xi, yi in zip(x, y, strict=True))


def _reference_step(integ_name, h):
    def sie(q, w, inertia):
        w = _axpy(w, _euler_rhs(q, w, inertia)[1], h)
        return _axpy(q, _euler_rhs(q, w, inertia)[0], h), w

    def rk4(q, w, inertia):
        k1 = _euler_rhs(q, w, inertia)
        k2 = _euler_rhs(_axpy(q, k1[0], h / 2), _axpy(w, k1[1], h / 2), inertia)
        k3 = _euler_rhs(_axpy(q, k2[0], h / 2), _axpy(w, k2[1], h / 2), inertia)
        k4 = _euler_rhs(_axpy(q, k3[0], h), _axpy(w, k3[1], h), inertia)
        comb = lambda x, a, b, c, d: tuple(  # noqa: E731
            xi + (h / 6) * (ai + 2 * bi + 2 * ci + di)
            for xi, ai, bi, ci, di in zip(x, a, b, c, d, strict=True)
        )
        return (
            comb(q, k1[0], k2[0], k3[0], k4[0]),
            comb(w, k1[1], k2[1], k3[1], k4[1]),
        )

    return {"SemiImplicitEuler": sie, "RK4": rk4}[integ_name]


def reference_loss(integ_name, layout, steps, dt, checkpoint):
    """The free body's loss written directly in JAX, without rbjax: the smallest program that
    does the same job (attitude quaternion and body angular velocity only, Euler's equations,
    no constraint, no failure checks). ``layout`` "stacked": the state as arrays (4, B) and
    (3, B), stacked and unstacked every step (how one usually writes it); "components": a tuple
    of (B,) arrays, which XLA differentiates best (fewest pad/slice kernels in the backward
    loop). ``checkpoint``: ``jax.checkpoint`` around each step (as rollout's default).
    Arguments (q0 (4, B), w0 (3, B), principal moments (3,))."""
    step = _reference_step(integ_name, dt)

    def loss(q0, w0, inertia):
        moments = tuple(inertia)
        if layout == "components":
            body = lambda c, _: (step(c[0], c[1], moments), None)  # noqa: E731
            c0 = (tuple(q0), tuple(w0))
        else:

            def body(c, _):
                q, w = step(tuple(c[0]), tuple(c[1]), moments)
                return (jnp.stack(q), jnp.stack(w)), None

            c0 = (q0, w0)
        if checkpoint:
            body = jax.checkpoint(body)
        (q, w), _ = jax.lax.scan(body, c0, None, length=steps)
        return sum(jnp.sum(jnp.asarray(a) ** 2) for a in (*q, *w))

    return loss


def _reference_args(batch):
    """(q0 (4, B), ω0 (3, B), principal moments (3,)) of the reference: the attitude, body
    angular velocity and inertia of ``problem("free_body", batch)``, the same bodies."""
    model, state = problem("free_body", batch)
    q0 = jnp.moveaxis(state.q[:, 0, 3:7], -1, 0)
    w0 = jnp.moveaxis(state.u[:, 0, 4:7], -1, 0)
    return q0, w0, jnp.diagonal(model.inertia[0])


def reference_check(steps):
    """Final ω of the reference RK4 program against rbjax's NewtonEuler RK4 rollout
    (max abs difference): the two programs integrate the same motion."""
    model, state = problem("free_body", 4)
    model = eqx.tree_at(lambda m: m.formulation, model, rbjax.NewtonEuler())
    tr = rbjax.rollout(model, state, 1e-3, steps, save_every=steps, integrator=rbjax.RK4())
    w_rb = tr.u[:, -1, 0, 4:7]
    q0, w0, moments = _reference_args(4)
    step = _reference_step("RK4", 1e-3)
    (_, w), _ = jax.lax.scan(
        lambda c, _: (step(c[0], c[1], tuple(moments)), None),
        (tuple(q0), tuple(w0)),
        None,
        length=steps,
    )
    return float(jnp.max(jnp.abs(jnp.stack(w, -1) - w_rb)))


def reference_case(integ_name, layout, batch, steps, repeats):
    """eval, rev (per-step checkpoint) and rev@False records of the plain-JAX reference."""
    args = _reference_args(batch)
    grad = lambda ck: jax.value_and_grad(  # noqa: E731
        reference_loss(integ_name, layout, steps, 1e-3, ck), argnums=(0, 1, 2)
    )
    modes = {
        "eval": reference_loss(integ_name, layout, steps, 1e-3, False),
        "rev": grad(True),
        "rev@False": grad(False),
    }
    base = {
        "part": "reference",
        "problem": f"plain JAX free body ({layout})",
        "integrator": integ_name,
        "formulation": "Euler's equations",
        "dtype": "float64",
        "batch": batch,
        "steps": steps,
        "dt": 1e-3,
    }
    out = []
    for mode, fn in modes.items():
        rec = dict(base, mode=mode, checkpoint="every step" if mode == "rev" else None)
        rec["compile_s"], rec["run_s"], rec["temp_bytes"] = measure(fn, args, repeats)
        out.append(rec)
    for rec in out[1:]:
        rec["rev_over_eval"] = rec["run_s"] / out[0]["run_s"]
    return out


def _groups(rows, key):
    """``rows`` grouped by ``key(row)`` in first-seen order: a list of (key, rows)."""
    out: dict = {}
    for r in rows:
        out.setdefault(key(r), []).append(r)
    return list(out.items())


def reference_table(records) -> str:
    rows = [r for r in records if r["part"] == "reference"]
    lines = [
        "| program | integrator | B | eval s | rev s (/eval), checkpoint every step | "
        "rev s (/eval), no checkpoint |",
        "|" + "---|" * 6,
    ]
    for k, group in _groups(rows, lambda r: (r["problem"], r["integrator"], r["batch"])):
        by = {r["mode"]: r for r in group}
        ev, rev, off = by["eval"], by["rev"], by["rev@False"]
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {ev['run_s']:.3g} | "
            f"{rev['run_s']:.3g} (**{rev['rev_over_eval']:.1f}**) | "
            f"{off['run_s']:.3g} ({off['rev_over_eval']:.1f}) |"
        )
    return "\n".join(lines)


def mjx_case(name, batch, steps, repeats):
    """The same loss in MJX (MuJoCo's JAX engine): RK4 ``mjx.step`` under ``lax.scan`` (no
    checkpointing: MJX has none of its own), ``jax.vmap`` over the batch; the sum of squares
    of the final qpos and qvel, differentiated with respect to the initial qpos and qvel and
    the model's body masses and inertias (shared by the batch, as in the rbjax rows). Records
    eval and rev (``jax.value_and_grad``) like :func:`cost_case`; [] without ``mujoco``."""
    try:
        import mujoco
        from mujoco import mjx
    except ImportError:
        return []
    import models  # the MJCF twins of the benchmark models

    m = mujoco.MjModel.from_xml_string(
        models.mjcf("free_body" if name == "free_body" else "pendulum_2")
    )
    mx = mjx.put_model(m)
    d0 = mjx.make_data(mx)
    rng = np.random.default_rng(0)
    qpos = np.tile(np.asarray(m.qpos0, float), (batch, 1))
    qvel = np.zeros((batch, m.nv))
    if name == "free_body":  # ω ≈ (0.01, 5, 0) in body axes, as problem("free_body")
        qvel[:, 3:] = np.array([0.01, 5.0, 0.0]) + 1e-3 * rng.standard_normal((batch, 3))
    else:  # released near horizontal, slightly different systems
        qpos[:, 0] = 0.1 * np.arange(batch) / batch

    def loss(qpos, qvel, mass, inertia):
        mm = mx.replace(body_mass=mass, body_inertia=inertia)

        def one(qp, qv):
            d = d0.replace(qpos=qp, qvel=qv)
            d, _ = jax.lax.scan(lambda d, _: (mjx.step(mm, d), None), d, length=steps)
            return jnp.sum(d.qpos**2) + jnp.sum(d.qvel**2)

        return jnp.sum(jax.vmap(one)(qpos, qvel))

    args = (jnp.asarray(qpos), jnp.asarray(qvel), mx.body_mass, mx.body_inertia)
    base = {
        "part": "mjx",
        "problem": name,
        "integrator": "RK4",
        "formulation": "MJX (joint coordinates)",
        "dtype": str(args[0].dtype),
        "batch": batch,
        "steps": steps,
        "dt": 1e-3,
    }
    out = {}
    for mode, fn in (("eval", loss), ("rev", jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))):
        rec = dict(base, mode=mode)
        try:
            rec["compile_s"], rec["run_s"], rec["temp_bytes"] = measure(fn, args, repeats)
        except Exception as e:  # MJX versions drift; report instead of failing the benchmark
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            rec.update(compile_s=float("nan"), run_s=float("nan"), temp_bytes=-1, error=msg)
        out[mode] = rec
    if "error" not in out["rev"] and "error" not in out["eval"]:
        out["rev"]["rev_over_eval"] = out["rev"]["run_s"] / out["eval"]["run_s"]
    return list(out.values())


def mjx_table(records) -> str:
    """MJX's gradient cost next to rbjax's RK4 rows of the same problem and batch."""
    rows = [r for r in records if r["part"] == "mjx"]
    ours = {
        (r["problem"], r["batch"]): r
        for r in records
        if r["part"] == "cost" and r["integrator"] == "RK4" and r["mode"] == "rev"
    }
    lines = [
        "| problem | B | MJX eval s | MJX rev s | MJX rev/eval | MJX compile s eval / rev | "
        "rbjax RK4 rev/eval | rbjax rev s / MJX rev s |",
        "|" + "---|" * 8,
    ]
    for k, group in _groups(rows, lambda r: (r["problem"], r["batch"])):
        by = {r["mode"]: r for r in group}
        ev, rev = by["eval"], by["rev"]
        if "error" in rev or "error" in ev:
            lines.append(f"| {k[0]} | {k[1]} | failed: {(rev.get('error') or ev['error'])[:90]} |")
            continue
        o = ours.get(k)
        mine = f"{o['rev_over_eval']:.1f}" if o and "rev_over_eval" in o else "–"
        speed = f"{o['run_s'] / rev['run_s']:.2f}" if o and "error" not in o else "–"
        lines.append(
            f"| {k[0]} | {k[1]} | {ev['run_s']:.3g} | {rev['run_s']:.3g} | "
            f"**{rev['rev_over_eval']:.1f}** | {ev['compile_s']:.1f} / {rev['compile_s']:.1f} | "
            f"{mine} | {speed} |"
        )
    return "\n".join(lines)


def sweep_case(name, steps, save_every, checkpoint, repeats):
    """Reverse mode (value_and_grad) of one system over ``steps`` steps: memory and time."""
    model, state = problem(name, 1)
    loss = loss_fn(model, state.t, rbjax.RK4(), steps, 1e-3, save_every, checkpoint)
    args = (state.q, state.u, model.mass, model.inertia)
    compile_s, run_s, temp = measure(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), args, repeats)
    return {
        "part": "checkpoint_sweep",
        "problem": name,
        "integrator": "RK4",
        "formulation": type(model.formulation).__name__,
        "dtype": "float64",
        "batch": 1,
        "steps": steps,
        "save_every": save_every,
        "checkpoint": str(checkpoint),
        "interval": rbjax._rollout._checkpoint_interval(checkpoint, steps, save_every),
        "mode": "rev",
        "compile_s": compile_s,
        "run_s": run_s,
        "temp_bytes": temp,
    }


def _print_row(name, integ, batch, r):
    """One progress line of a cost record (rbjax or MJX)."""
    ratio = f"{r['rev_over_eval']:8.2f}" if "rev_over_eval" in r else ""
    print(
        f"{name:16s} {integ:18s} {batch:4d} {r['mode']:5s} {r['compile_s']:9.2f} "
        f"{r['run_s']:9.4f} {_mb(r['temp_bytes']):>9s} {ratio}"
        + (f"  {r['error']}" if "error" in r else ""),
        flush=True,
    )


def _mb(b):
    return f"{b / 1e6:.3g}" if b >= 0 else "–"


def target_ratio(problem: str, integrator: str) -> int:
    """Issue 14's rev/eval targets: ImplicitMidpoint ≤ 3, the free body ≤ 6, mechanisms ≤ 8."""
    if integrator == "ImplicitMidpoint":
        return 3
    return 6 if problem == "free_body" else 8


def cost_table(records) -> str:
    rows = [r for r in records if r["part"] == "cost"]
    head = (
        "| problem | integrator | B | eval s | rev s | **rev/eval** | target | rev/fwd | "
        "rev s, no checkpoint (/eval) | compile s eval / rev | temp MB eval / rev / "
        "rev no checkpoint |"
    )
    lines = [head, "|" + "---|" * 11]
    for k, group in _groups(rows, lambda r: (r["problem"], r["integrator"], r["batch"])):
        by = {r["mode"]: r for r in group}
        ev, rev, off = by["eval"], by["rev"], by.get("rev@False")
        target = target_ratio(k[0], k[1])
        if "error" in rev or "error" in ev:
            err = rev.get("error") or ev.get("error") or ""
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | failed: {err[:90]} |")
            continue
        ratio = rev["rev_over_eval"]
        mark = "" if ratio <= target else " (over)"
        if off is None or "error" in off:
            off_s, off_mb = "–", "–"
        else:
            off_s = f"{off['run_s']:.3g} ({off['rev_over_eval']:.1f})"
            off_mb = _mb(off["temp_bytes"])
        lines.append(
            f"| {k[0]} | {k[1]} | {k[2]} | {ev['run_s']:.3g} | "
            f"{rev['run_s']:.3g} | **{ratio:.1f}**{mark} | ≤ {target} | "
            f"{rev.get('rev_over_fwd', float('nan')):.1f} | {off_s} | "
            f"{ev['compile_s']:.1f} / {rev['compile_s']:.1f} | "
            f"{_mb(ev['temp_bytes'])} / {_mb(rev['temp_bytes'])} / {off_mb} |"
        )
    return "\n".join(lines)


# rollout(checkpoint=...) of the sweep, by the label recorded in the JSON
SWEEP_CHECKPOINTS = {
    "none": None,
    "default": rbjax.Checkpoint(),
    "sqrt": rbjax.Checkpoint(every=None),
}
# labels of results recorded before rollout took Checkpoint objects (checkpoint=False/None/True)
_OLD_LABELS = {"False": "none", "None": "default", "True": "sqrt"}


def sweep_table(records) -> str:
    rows = [r for r in records if r["part"] == "checkpoint_sweep"]
    lines = [
        "| problem | saved | steps | temp MB: none / default (every=1) / every=None (k) | "
        "rev s: none / default / every=None |",
        "|" + "---|" * 5,
    ]
    for k, group in _groups(rows, lambda r: (r["problem"], r["save_every"] == 1, r["steps"])):
        by = {_OLD_LABELS.get(r["checkpoint"], r["checkpoint"]): r for r in group}
        off, dflt, on = by.get("none"), by.get("default"), by.get("sqrt")
        if off is None or dflt is None or on is None:
            continue
        lines.append(
            f"| {k[0]} | {'every state' if k[1] else 'final state'} | {k[2]} | "
            f"{_mb(off['temp_bytes'])} / {_mb(dflt['temp_bytes'])} / "
            f"{_mb(on['temp_bytes'])} ({on['interval']}) | "
            f"{off['run_s']:.3g} / {dflt['run_s']:.3g} / {on['run_s']:.3g} |"
        )
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--json", default=None, help="write records to this path")
    p.add_argument("--table", default=None, help="only print the tables of this JSON file")
    p.add_argument("--quick", action="store_true", help="small subset (smoke test, < 1 min)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batches", default="1,256")
    p.add_argument("--steps-free", type=int, default=1000, help="steps of the free body")
    p.add_argument("--steps-pendulum", type=int, default=1000, help="steps of the pendulum")
    p.add_argument("--horizons", default="100,1000,10000", help="steps of the sweep")
    p.add_argument("--sweep", action="store_true", help="add the checkpoint sweep (long)")
    p.add_argument(
        "--checkpoints",
        default="default,0",
        help="rollout(checkpoint=...) values of the rev rows: default (rollout's own), 0/False, "
        "1, True, or an interval; the first is the headline",
    )
    p.add_argument("--integrators", default=None, help="subset, comma-separated")
    p.add_argument(
        "--update",
        action="store_true",
        help="replace the matching records in --json and keep the others (a partial re-run)",
    )
    p.add_argument("--no-cost", action="store_true", help="skip the rev/fwd cost part")
    p.add_argument(
        "--mjx",
        action="store_true",
        help="add MJX's gradient of the same loss (RK4 problems and batches; needs mujoco-mjx)",
    )
    p.add_argument(
        "--no-reference", action="store_true", help="skip the plain-JAX reference programs"
    )
    p.add_argument(
        "--problems",
        default="free_body,double_pendulum",
        help="subset of free_body, double_pendulum and arm6 (the 6-joint arm with PD motors)",
    )
    args = p.parse_args(argv)
    if args.table:
        with open(args.table) as fh:
            records = json.load(fh)
        print(cost_table(records) + "\n\n" + mjx_table(records) + "\n\n" + reference_table(records))
        print("\n" + sweep_table(records))
        return records
    batches = [int(b) for b in args.batches.split(",")]
    horizons = [int(h) for h in args.horizons.split(",")]
    steps = {
        "free_body": args.steps_free,
        "double_pendulum": args.steps_pendulum,
        "arm6": args.steps_pendulum,
    }
    problems = {k: steps[k] for k in args.problems.split(",")}
    integrators = list(INTEGRATORS) if args.integrators is None else args.integrators.split(",")
    ck_map = {
        "default": rbjax.Checkpoint(),
        "0": None,
        "False": None,
        "True": rbjax.Checkpoint(every=None),
    }
    checkpoints = tuple(
        ck_map[c] if c in ck_map else rbjax.Checkpoint(every=int(c))
        for c in args.checkpoints.split(",")
    )
    if args.quick:
        problems = {"free_body": 100}
        integrators = ["SemiImplicitEuler", "RK4", "ImplicitMidpoint"]
        args.repeats, horizons = 3, [100, 1000]
    if args.no_cost:
        problems = {}
    records = []
    print(
        f"{'problem':16s} {'integrator':18s} {'B':>4s} {'mode':5s} {'compile s':>9s} "
        f"{'run s':>9s} {'temp MB':>9s} {'rev/eval':>8s}"
    )
    for name, steps in problems.items():
        for integ in integrators:
            if integ == "Projected(RK4)" and name == "free_body":
                continue  # no joints: Projected is the base integrator
            for b in batches:
                for r in cost_case(name, integ, b, steps, args.repeats, checkpoints):
                    records.append(r)
                    _print_row(name, integ, b, r)
    if args.mjx:
        print("\nMJX (RK4, value_and_grad of the same loss):")
        for name, steps in problems.items():
            if name == "arm6":
                continue  # no MJCF twin of the arm
            for b in batches:
                for r in mjx_case(name, b, steps, args.repeats):
                    records.append(r)
                    _print_row(name, "MJX RK4", b, r)
    if not args.no_reference:
        n_ref = 100 if args.quick else args.steps_free
        print(
            f"\nplain-JAX reference (free body, {n_ref} steps; its final ω differs from rbjax's "
            f"NewtonEuler RK4 by {reference_check(n_ref):.1e} rad/s):"
        )
        for integ in ("SemiImplicitEuler", "RK4"):
            for layout in ("stacked", "components"):
                for b in batches:
                    for r in reference_case(integ, layout, b, n_ref, args.repeats):
                        records.append(r)
                        ratio = f"{r['rev_over_eval']:8.2f}" if "rev_over_eval" in r else ""
                        print(
                            f"{r['problem']:34s} {integ:18s} {b:4d} {r['mode']:9s} "
                            f"{r['compile_s']:9.2f} {r['run_s']:9.4f} {ratio}",
                            flush=True,
                        )
    if args.sweep:
        print("\ncheckpoint sweep (RK4, B = 1, value_and_grad):")
        sweep_problems = ["free_body"] if args.quick else args.problems.split(",")
        for name in sweep_problems:
            for every in (False, True):
                for n in horizons:
                    for label, ck in SWEEP_CHECKPOINTS.items():
                        r = sweep_case(name, n, 1 if every else n, ck, min(args.repeats, 3))
                        r["checkpoint"] = label
                        records.append(r)
                        print(
                            f"{name:16s} save_every={r['save_every']:<6d} steps={n:<6d} "
                            f"checkpoint={label:8s} (k = {r['interval']:4d}) temp "
                            f"{_mb(r['temp_bytes']):>8s} MB  compile {r['compile_s']:.1f} s  "
                            f"run {r['run_s']:.4f} s",
                            flush=True,
                        )
    print()
    if not args.no_cost:
        print(cost_table(records))
    if args.mjx:
        print()
        print(mjx_table(records))
    if not args.no_reference:
        print()
        print(reference_table(records))
    if args.sweep:
        print()
        print(sweep_table(records))
    if args.update and args.json and os.path.exists(args.json):
        with open(args.json) as fh:
            old = json.load(fh)
        # a re-measured case replaces all its old rows (eval, fwd and every rev variant)
        key = lambda r: tuple(  # noqa: E731
            r.get(k) for k in ("part", "problem", "integrator", "batch", "steps", "save_every")
        )
        new = {key(r) for r in records}
        records = [r for r in old if key(r) not in new] + records
    return write_records(records, args.json)


if __name__ == "__main__":
    main()
