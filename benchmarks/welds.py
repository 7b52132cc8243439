"""Cost of welded bodies (issue 18 §4, rbjax/_welds.py): a chain of four hinged links, each
carrying a motor housing and a sensor welded to it (12 bodies), simulated with the welds kept
as six-row ``rbjax.Fixed`` constraints (12 bodies, 68 equations) and merged at build
(``merge_welded=True``: 4 composite bodies, 20 equations), compile and run time separately,
with MuJoCo C stepping the same mechanism from MJCF (its compiler keeps the welded bodies and
its recursive algorithm composes them) as the peer. RK4, float64, dt = 1e-3, released at rest
from a bent configuration.

    python benchmarks/welds.py --json benchmarks/results/welds_cpu.json [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import rbjax  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from free_body import compile_and_run, write_records  # noqa: E402

LINKS = 4
LENGTH = 0.4
AXES = ([0, 1, 0], [1, 0, 0])  # alternating hinge axes: a 3-D motion
# (name, mass, principal moments, where on the link: from its centre of mass)
PARTS = (
    ("motor", 0.3, [4e-4, 4e-4, 2e-4], [-0.15, 0.0, 0.03]),
    ("sensor", 0.05, [2e-6, 2e-6, 2e-6], [0.1, 0.02, 0.0]),
)
LINK_INERTIA = [2e-4, 1.4e-2, 1.4e-2]
CASES = ((1, 2000), (64, 1000))  # (batch, steps)


def chain(merge: bool):
    """The model and a consistent state released at rest (links along x, bent at every
    hinge by assembly of the unmerged model)."""
    bodies, joints = [], []
    for k in range(LINKS):
        bodies.append(rbjax.Body(1.0, LINK_INERTIA, name=f"link{k}"))
        parent = rbjax.GROUND if k == 0 else f"link{k - 1}"
        s_i = [0.0, 0.0, 0.0] if k == 0 else [LENGTH / 2, 0.0, 0.0]
        joints.append(
            rbjax.Revolute(
                parent,
                f"link{k}",
                s_i=s_i,
                s_j=[-LENGTH / 2, 0, 0],
                z_i=AXES[k % 2],
                name=f"hinge{k}",
            )
        )
        for name, mass, moments, where in PARTS:
            part = f"{name}{k}"
            bodies.append(rbjax.Body(mass, moments, name=part))
            joints.append(rbjax.Fixed(f"link{k}", part, s_i=where, name=f"{part} weld"))
    model = rbjax.Model(bodies, joints=joints, gravity=[0, 0, -9.81], merge_welded=merge)
    return model


def start(unmerged):
    names = unmerged.names
    pos = np.zeros((len(names), 3))
    for b, name in enumerate(names):
        k = int(name[-1])
        x = (k + 0.5) * LENGTH
        if name.startswith("link"):
            pos[b] = [x, 0.0, 0.0]
        else:
            where = dict((p[0], p[3]) for p in PARTS)[name[:-1]]
            pos[b] = [x + where[0], where[1], where[2]]
    state = rbjax.make_state(position=pos, dtype=jnp.float64)
    return rbjax.assemble(unmerged, state)


def mjcf() -> str:
    """The same chain for MuJoCo: each link a body with a hinge, its parts bodies without
    joints (welded), inertial frames at the centres of mass."""
    inner = ""
    for k in reversed(range(LINKS)):
        axis = " ".join(str(a) for a in AXES[k % 2])
        parts = "".join(
            f'<body name="{n}{k}" pos="{w[0]} {w[1]} {w[2]}"><inertial pos="0 0 0" mass="{m}" '
            f'diaginertia="{" ".join(str(i) for i in mo)}"/></body>'
            for n, m, mo, w in PARTS
        )
        pos = "0 0 0" if k == 0 else f"{LENGTH} 0 0"
        inner = (
            f'<body name="link{k}" pos="{pos}"><joint type="hinge" axis="{axis}"/>'
            f'<inertial pos="{LENGTH / 2} 0 0" mass="1" diaginertia="{" ".join(map(str, LINK_INERTIA))}"/>'
            f'<body pos="{LENGTH / 2} 0 0">{parts}</body>' + inner + "</body>"
        )
    return (
        '<mujoco><option timestep="1e-3" integrator="RK4" gravity="0 0 -9.81">'
        '<flag contact="disable"/></option><worldbody>' + inner + "</worldbody></mujoco>"
    )


def mujoco_case(steps: int, repeats: int):
    try:
        import mujoco
    except ImportError:
        return None
    m = mujoco.MjModel.from_xml_string(mjcf())
    d = mujoco.MjData(m)
    runs = []
    for _ in range(repeats):
        mujoco.mj_resetData(m, d)
        d.qpos[:] = 0.3
        t0 = time.perf_counter()
        for _ in range(steps):
            mujoco.mj_step(m, d)
        runs.append(time.perf_counter() - t0)
    run = statistics.median(runs)
    return {
        "problem": "welded_chain",
        "engine": "MuJoCo C",
        "bodies": int(m.nbody - 1),
        "batch": 1,
        "steps": steps,
        "compile_s": 0.0,
        "run_s": run,
        "runs_s": runs,
        "us_per_step": 1e6 * run / steps,
    }


def run_case(merge, batch, steps, repeats):
    jax.clear_caches()
    unmerged = chain(False)
    model = chain(True) if merge else unmerged
    state = start(unmerged)
    state = model.merge_state(state)
    state = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), state)
    dt = np.asarray(1e-3)

    def call():
        traj = rbjax.rollout(model, state, dt, steps, integrator=rbjax.RK4(), save_every=steps)
        jax.block_until_ready(traj.q)
        return traj

    timing = compile_and_run(call, repeats)
    return {
        "problem": "welded_chain",
        "engine": "rbjax merged" if merge else "rbjax Fixed",
        "bodies": model.nb,
        "rows": int(sum(model.joint_rows)),
        "batch": batch,
        "steps": steps,
        **timing,
        "us_per_step": 1e6 * timing["run_s"] / steps,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    records = []
    print(
        f"{'engine':<14} {'B':>4} {'bodies':>6} {'rows':>5} {'compile s':>10} {'run s':>8} {'µs/step':>8}"
    )
    for batch, steps in CASES:
        for merge in (False, True):
            r = run_case(merge, batch, steps, args.repeats)
            records.append(r)
            print(
                f"{r['engine']:<14} {batch:>4} {r['bodies']:>6} {r['rows']:>5} "
                f"{r['compile_s']:>10.2f} {r['run_s']:>8.3f} {r['us_per_step']:>8.1f}"
            )
    peer = mujoco_case(CASES[0][1], args.repeats)
    if peer is not None:
        records.append(peer)
        print(
            f"{peer['engine']:<14} {1:>4} {peer['bodies']:>6} {'-':>5} {'-':>10} {peer['run_s']:>8.3f} {peer['us_per_step']:>8.1f}"
        )
    print("\nmerged / Fixed")
    for batch, _ in CASES:
        a, b = (
            next(r for r in records if r["batch"] == batch and r["engine"] == e)
            for e in ("rbjax merged", "rbjax Fixed")
        )
        print(
            f"  B = {batch:>3}: run {a['run_s'] / b['run_s']:.2f}, compile {a['compile_s'] / b['compile_s']:.2f}"
        )
    write_records(records, args.json)


if __name__ == "__main__":
    main()
