"""Contact against MuJoCo C: the same scenes, the same step, one run (issue 38).

Scenes (a free body on the ground plane z = 0, h = 1 ms, float64):

* ``box_drop``: a box (half extents 0.1 × 0.075 × 0.05 m, 1 kg) released 0.3 m up, tilted
  20° about x and 10° about y, moving at 0.5 m/s sideways and spinning at 1 rad/s, friction
  μ = 0.5, no restitution. Reported: the time to rest (after which every speed stays below
  1e-2 m/s or rad/s), the rest height of the centre of mass (the resting face's half extent,
  0.05 m, when it lands on its largest face), the tilt at rest, the deepest penetration, and
  where it came to rest.
* ``ball_roll``: a solid sphere (radius 0.1 m, 1 kg) launched sliding at v₀ = 3 m/s without
  spin, μ = 0.3: it starts rolling at t = 2v₀/(7μg) with 5v₀/7 (Routh); both engines against
  that closed form.
* ``stack`` (its own rows): two cubes, the upper one turned and dropped onto the lower one
  (box–box contact, rbjax/_contact/narrow.py), loaded from one MJCF by both engines.
* ``quadruped`` (its own rows): Barkour v0 (tests/data/barkour_v0.xml) standing under its position
  actuators for 5 s (4 feet, 12 joint limits, h = 2 ms; ``quadruped``'s docstring), against
  MuJoCo with the file's options and with hard friction.

rbjax: :class:`rbjax.MoreauJean` (perfect unilateral contact, Coulomb's disc). MuJoCo C: its
default soft contact (``solref`` 0.02 1, ``solimp`` 0.9 0.95 0.001), elliptic cones,
``condim`` 3 (no torsional or rolling friction, as rbjax), Euler at the same step
(``mujoco.rollout`` in C, one thread and two). The soft-versus-hard difference shows in the
penetration (MuJoCo's contact is a stiff spring-damper that lets the body sink until its
force balances the weight) and in the time to rest.

Speed: the box drop at B = 1, 64, 1024 (initial heights spread by ±5 cm, seeded, the same for
both engines; 2000 steps at B = 1, then at least 600, past every landing), µs per
system-step; compile = first call − median warm call; warm calls
interleaved between engines. Machine noise: ratios from the same run only.

    python benchmarks/contact.py [--quick] [--json benchmarks/results/contact_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import rbjax

jax.config.update("jax_enable_x64", True)

try:
    import mujoco
    import mujoco.rollout as mj_rollout

    HAVE_MUJOCO = True
except ImportError:  # pragma: no cover
    HAVE_MUJOCO = False

H = 1e-3
G = 9.81
HALF = (0.1, 0.075, 0.05)
R_BALL = 0.1


def _quat(rx_deg, ry_deg):
    """q = q_x(rx) ⊗ q_y(ry), scalar first."""
    ax, ay = np.deg2rad(rx_deg) / 2, np.deg2rad(ry_deg) / 2
    qx = np.array([np.cos(ax), np.sin(ax), 0, 0])
    qy = np.array([np.cos(ay), 0, np.sin(ay), 0])
    w1, v1, w2, v2 = qx[0], qx[1:], qy[0], qy[1:]
    return np.concatenate([[w1 * w2 - v1 @ v2], w1 * v2 + w2 * v1 + np.cross(v1, v2)])


SCENES = {
    "box_drop": dict(
        shape="box",
        mu=0.5,
        qpos=np.concatenate([[0.0, 0.0, 0.3], _quat(20.0, 10.0)]),
        qvel=np.array([0.5, 0.0, 0.0, 0.0, 1.0, 0.0]),
        seconds=2.0,
    ),
    "ball_roll": dict(
        shape="sphere",
        mu=0.3,
        qpos=np.array([0.0, 0.0, R_BALL, 1.0, 0.0, 0.0, 0.0]),
        qvel=np.array([3.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        seconds=0.6,
    ),
}


def rbjax_model(scene):
    if scene["shape"] == "box":
        m = 1.0
        hx, hy, hz = HALF
        inertia = m / 3 * np.array([hy**2 + hz**2, hx**2 + hz**2, hx**2 + hy**2])
        shape = rbjax.Box("body", HALF)
    else:
        m, inertia, shape = 1.0, np.full(3, 0.4 * R_BALL**2), rbjax.Sphere("body", R_BALL)
    return rbjax.JointModel(
        names=["body"],
        parent=[-1],
        body_pos=np.zeros((1, 3)),
        body_quat=[[1.0, 0.0, 0.0, 0.0]],
        mass=[m],
        com=np.zeros((1, 3)),
        inertia=[np.diag(inertia)],
        joint_types=["free"],
        joint_body=[0],
        contacts=rbjax.Contacts([shape], friction=scene["mu"]),
    )


def mujoco_model(scene):
    mu = scene["mu"]
    geom = (
        f'<geom type="box" size="{HALF[0]} {HALF[1]} {HALF[2]}" mass="1" friction="{mu} 0 0" '
        'condim="3"/>'
        if scene["shape"] == "box"
        else f'<geom type="sphere" size="{R_BALL}" mass="1" friction="{mu} 0 0" condim="3"/>'
    )
    xml = f"""<mujoco><option timestep="{H}" cone="elliptic" integrator="Euler"/>
<worldbody><geom type="plane" size="20 20 0.1" friction="{mu} 0 0" condim="3"/>
<body name="body"><freejoint/>{geom}</body></worldbody></mujoco>"""
    return mujoco.MjModel.from_xml_string(xml)


def initial_states(scene, batch: int, seed: int = 0):
    """(qpos (B, 7), qvel (B, 6)): B = 1 the scene's state; else heights spread by ±5 cm."""
    qpos = np.tile(scene["qpos"], (batch, 1))
    if batch > 1:
        qpos[:, 2] += np.random.default_rng(seed).uniform(-0.05, 0.05, batch)
    return qpos, np.tile(scene["qvel"], (batch, 1))


def run_rbjax(model, qpos, qvel, steps, h=H):
    state = rbjax.JointState(jnp.zeros(qpos.shape[0]), jnp.asarray(qpos), jnp.asarray(qvel))
    run = jax.jit(
        lambda s: rbjax.rollout(
            model, s, h, steps, integrator=rbjax.MoreauJean(), monitors=None, throw=False
        )
    )
    return lambda: jax.block_until_ready(run(state))


def run_mujoco(mjm, qpos, qvel, steps, threads, ctrl=None):
    """``mujoco.rollout`` of B states (qpos, qvel); ``ctrl`` (nu,) held constant."""
    datas = [mujoco.MjData(mjm) for _ in range(threads)]
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(mjm, spec)
    state0 = np.zeros((qpos.shape[0], size))
    for b in range(qpos.shape[0]):
        d = datas[0]
        d.qpos[:], d.qvel[:] = qpos[b], qvel[b]
        mujoco.mj_getState(mjm, d, state0[b], spec)
    control = None if ctrl is None else np.tile(ctrl, (qpos.shape[0], steps, 1))
    return lambda: mj_rollout.rollout(mjm, datas, state0, control, nstep=steps)[0]


def timed(fn, repeats):
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return out, first, runs


def _speed_row(batch, engine, steps, first, warm):
    """A speed record: compile = first call − median warm call, µs per system-step."""
    med = statistics.median(warm)
    return dict(
        B=batch,
        engine=engine,
        steps=steps,
        compile_s=max(first - med, 0.0),
        run_s=med,
        us_per_system_step=1e6 * med / (batch * steps),
    )


def physics(scene_name, repeats):
    """The scene at B = 1 in both engines: what each reports, against the closed form."""
    scene = SCENES[scene_name]
    steps = round(scene["seconds"] / H)
    qpos, qvel = initial_states(scene, 1)
    model = rbjax_model(scene)
    traj, first, runs = timed(run_rbjax(model, qpos, qvel, steps), repeats)
    t = np.asarray(traj.t)[0]
    q, v = np.asarray(traj.qpos)[0], np.asarray(traj.qvel)[0]
    pts = model.contacts
    gaps = jax.vmap(lambda qq: pts.gaps_and_velocity(model, qq, jnp.zeros(6))[0])(jnp.asarray(q))
    rows = {"rbjax": _summary(scene, t, q, v, float(-np.min(np.asarray(gaps))), first, runs, steps)}
    if HAVE_MUJOCO:
        mjm = mujoco_model(scene)
        # penetration: MuJoCo's own contact distances, stepping once more in Python
        d = mujoco.MjData(mjm)
        d.qpos[:], d.qvel[:] = qpos[0], qvel[0]
        qs, vs, deepest = [d.qpos.copy()], [d.qvel.copy()], 0.0
        for _ in range(steps):
            mujoco.mj_step(mjm, d)
            qs.append(d.qpos.copy())
            vs.append(d.qvel.copy())
            if d.ncon:
                deepest = max(deepest, float(-min(c.dist for c in d.contact[: d.ncon])))
        tm = np.arange(steps + 1) * H
        _, mfirst, mruns = timed(run_mujoco(mjm, qpos, qvel, steps, 1), repeats)
        rows["MuJoCo C"] = _summary(
            scene, tm, np.array(qs), np.array(vs), deepest, mfirst, mruns, steps
        )
    return rows


def _summary(scene, t, q, v, depth, first, runs, steps):
    speed = np.max(np.abs(v), axis=1)
    moving = np.flatnonzero(speed >= 1e-2)
    rest = float(t[moving[-1] + 1]) if moving.size and moving[-1] + 1 < len(t) else float("nan")
    out = dict(
        time_to_rest_s=rest,
        rest_height_m=float(q[-1, 2]),
        rest_xy_m=[float(q[-1, 0]), float(q[-1, 1])],
        deepest_penetration_m=depth,
        first_call_s=first,
        run_s=statistics.median(runs),
        us_per_step=1e6 * statistics.median(runs) / steps,
    )
    if scene["shape"] == "box":
        R = np.asarray(rbjax.quaternion.rotation_matrix(jnp.asarray(q[-1, 3:7])))
        up = np.abs(R[2])  # the body axes' z components: the one near 1 is the face normal
        out["tilt_at_rest_deg"] = float(np.rad2deg(np.arccos(np.clip(up.max(), -1, 1))))
        out["resting_face_axis"] = "xyz"[int(np.argmax(up))]
    else:
        slip = v[:, 0] - v[:, 4] * R_BALL
        rolling = np.flatnonzero(np.abs(slip) <= 1e-3 * abs(slip[0]))
        v0, mu = scene["qvel"][0], scene["mu"]
        out["rolling_from_s"] = float(t[rolling[0]]) if rolling.size else float("nan")
        out["rolling_from_closed_form_s"] = 2 * v0 / (7 * mu * G)
        out["rolling_speed"] = float(v[-1, 0])
        out["rolling_speed_closed_form"] = 5 * v0 / 7
    return out


def speed(batches, repeats, run_s):
    scene = SCENES["box_drop"]
    model, rows, steps = rbjax_model(scene), [], 2000
    mjm = mujoco_model(scene) if HAVE_MUJOCO else None
    for batch in batches:
        qpos, qvel = initial_states(scene, batch)
        engines = {"rbjax": run_rbjax(model, qpos, qvel, steps)}
        if mjm is not None:
            engines["MuJoCo C 1 thread"] = run_mujoco(mjm, qpos, qvel, steps, 1)
            if batch > 1:
                engines["MuJoCo C 2 threads"] = run_mujoco(mjm, qpos, qvel, steps, 2)
        firsts, warm = {}, {k: [] for k in engines}
        for name, fn in engines.items():
            t0 = time.perf_counter()
            fn()
            firsts[name] = time.perf_counter() - t0
        for _ in range(repeats):
            for name, fn in engines.items():
                t0 = time.perf_counter()
                fn()
                warm[name].append(time.perf_counter() - t0)
        for name in engines:
            med = statistics.median(warm[name])
            rows.append(
                dict(
                    B=batch,
                    engine=name,
                    steps=steps,
                    compile_s=max(firsts[name] - med, 0.0),
                    run_s=med,
                    us_per_system_step=1e6 * med / (batch * steps),
                )
            )
            print(
                f"  B={batch} {name}: {rows[-1]['us_per_system_step']:.3g} µs/system-step",
                flush=True,
            )
        # the next batch with about run_s seconds of the slower engine, but at least 600
        # steps: every box has landed by 0.3 s, so the rows time contact, not free flight
        slowest = max(r["us_per_system_step"] for r in rows if r["B"] == batch)
        steps = max(600, min(2000, round(run_s / (slowest * 1e-6 * batch * 16))))
    return rows


# the cube stack of tests/test_contact_mjcf.py, the upper cube raised to drop 5 cm
STACK = (
    (Path(__file__).parent.parent / "tests" / "data" / "cube_stack.xml")
    .read_text()
    .replace('pos="0.02 0.01 0.31"', 'pos="0.02 0.01 0.35"')
)


def stack(batches, repeats, tmp="/tmp/rbjax_bench_stack.xml"):
    """Two cubes (0.2 m, 1 kg, μ = 0.5): the upper one, turned 0.5 rad about z and off centre,
    dropped 5 cm onto the lower one on the floor; 1 s. Physics at B = 1 (rest heights against
    0.1 and 0.3 m, deepest penetration of either engine's contacts, time to rest) and speed at
    each B (the drop heights spread by ±2 cm), rbjax's box–box pair against MuJoCo C's."""
    with open(tmp, "w") as fh:
        fh.write(STACK)
    loaded = rbjax.load(tmp, contacts=True)
    model, steps = loaded.model, 1000
    mjm = mujoco.MjModel.from_xml_path(tmp) if HAVE_MUJOCO else None
    q0, v0 = np.asarray(loaded.state.qpos), np.asarray(loaded.state.qvel)
    out = {"physics": {}, "speed": []}
    for batch in batches:
        qpos, qvel = np.tile(q0, (batch, 1)), np.tile(v0, (batch, 1))
        if batch > 1:
            qpos[:, 9] += np.random.default_rng(0).uniform(-0.02, 0.02, batch)
        engines = {"rbjax": run_rbjax(model, qpos, qvel, steps)}
        if mjm is not None:
            engines["MuJoCo C 1 thread"] = run_mujoco(mjm, qpos, qvel, steps, 1)
        for name, fn in engines.items():
            result, first, runs = timed(fn, repeats)
            out["speed"].append(_speed_row(batch, name, steps, first, runs))
            print(
                f"  stack B={batch} {name}: {out['speed'][-1]['us_per_system_step']:.3g} µs",
                flush=True,
            )
            if batch != 1:
                continue
            if name == "rbjax":
                q, v = np.asarray(result.qpos)[0], np.asarray(result.qvel)[0]
                ok = int(np.asarray(result.result).reshape(-1)[0])
                gaps = jax.vmap(
                    lambda qq: model.contacts.gaps_and_velocity(model, qq, jnp.zeros(12))[0]
                )(jnp.asarray(q))
                depth = float(-np.min(np.asarray(gaps)))
            else:
                state = np.asarray(result)[0]  # (steps, state size): time, qpos, qvel, ...
                q, v = state[:, 1 : 1 + mjm.nq], state[:, 1 + mjm.nq : 1 + mjm.nq + mjm.nv]
                ok, depth = 0, _mujoco_depth(mjm, q)
            speed_ = np.max(np.abs(v), axis=1)
            moving = np.flatnonzero(speed_ >= 1e-2)
            out["physics"][name] = dict(
                result=ok,
                rest_heights_m=[float(q[-1, 2]), float(q[-1, 9])],
                deepest_penetration_m=depth,
                time_to_rest_s=float((moving[-1] + 2) * H) if moving.size else 0.0,
                max_speed_last_100_steps=float(np.max(speed_[-100:])),
            )
    return out


# Barkour v0 as MuJoCo ships it for MJX's tests, its visual meshes left out and its height
# field replaced by a plane (tests/data/README.md)
BARKOUR = Path(__file__).parent.parent / "tests" / "data" / "barkour_v0.xml"


def barkour_scene(options=None, tmp="/tmp/rbjax_bench_barkour.xml"):
    """tests/data/barkour_v0.xml, or a copy with MuJoCo's solver options replaced."""
    if options is None:
        return str(BARKOUR)
    with open(tmp, "w") as fh:
        fh.write(BARKOUR.read_text().replace('iterations="1" ls_iterations="4"', options))
    return tmp


HARD = 'iterations="100" ls_iterations="50" cone="elliptic" impratio="100"'


def quadruped(batches, repeats, seconds=5.0):
    """Barkour v0 standing under its position actuators at the "standing" keyframe's controls
    (tests/test_contact_quadruped.py): 4 foot spheres on the plane, 12 limited joints, h =
    2 ms. Physics at B = 1: base height and feet at the end, the feet's creep from 1 s to the
    end, the deepest penetration, for rbjax, MuJoCo with the file's options (pyramidal cone,
    impratio 1, one iteration) and MuJoCo with hard friction (elliptic, impratio 100, 100
    iterations). Speed at each B (base heights spread over 0 to +2 cm, seeded): rbjax
    against MuJoCo C with the file's options, one thread."""
    path = barkour_scene()
    mjm = mujoco.MjModel.from_xml_path(path)
    key = mjm.key("standing")
    h = float(mjm.opt.timestep)
    loaded = rbjax.load(path, contacts=True, qpos=key.qpos, control=key.ctrl)
    model, steps = loaded.model, round(seconds / h)
    feet = [i for i in range(mjm.ngeom) if mjm.geom_contype[i] == 1]
    radius = float(mjm.geom_size[feet[0], 0])

    def feet_at(qs):
        d, out = mujoco.MjData(mjm), []
        for q in qs:
            d.qpos[:] = q
            mujoco.mj_kinematics(mjm, d)
            out.append(d.geom_xpos[feet].copy())
        return np.array(out)

    out = {"physics": {}, "speed": []}
    q0, v0 = np.asarray(key.qpos)[None], np.zeros((1, mjm.nv))
    runs = {"rbjax": None, "MuJoCo, file options": mjm}
    runs["MuJoCo, hard friction"] = mujoco.MjModel.from_xml_path(barkour_scene(HARD))
    one_second = round(1.0 / h) - 1
    for name, m in runs.items():
        if m is None:
            result = run_rbjax(model, q0, v0, steps, h)()
            qs, ok = np.asarray(result.qpos)[0], int(np.asarray(result.result).reshape(-1)[0])
            depth = float(max(0.0, -(feet_at(qs[::5])[:, :, 2] - radius).min()))
        else:
            state = np.asarray(run_mujoco(m, q0, v0, steps, 1, key.ctrl)())[0]
            qs, ok = state[:, 1 : 1 + m.nq], 0
            depth = _mujoco_depth(m, qs[::5])
        f_end, f_1s = feet_at(qs[[-1]])[0], feet_at(qs[[one_second]])[0]
        out["physics"][name] = dict(
            result=ok,
            base_height_m=float(qs[-1, 2]),
            feet_xy_m=f_end[:, :2].tolist(),
            feet_gap_m=(f_end[:, 2] - radius).tolist(),
            feet_creep_after_1s_m=float(np.max(np.abs(f_end[:, :2] - f_1s[:, :2]))),
            deepest_penetration_m=depth,
        )
        print(f"  quadruped {name}: {out['physics'][name]}", flush=True)
    for batch in batches:
        qpos = np.tile(q0, (batch, 1))
        if batch > 1:
            qpos[:, 2] += np.random.default_rng(0).uniform(0.0, 0.02, batch)
        qvel = np.zeros((batch, mjm.nv))
        n = steps if batch == 1 else 500
        engines = {
            "rbjax": run_rbjax(model, qpos, qvel, n, h),
            "MuJoCo C 1 thread": run_mujoco(mjm, qpos, qvel, n, 1, key.ctrl),
        }
        for name, fn in engines.items():
            _, first, warm = timed(fn, repeats)
            out["speed"].append(_speed_row(batch, name, n, first, warm))
            print(
                f"  quadruped B={batch} {name}: "
                f"{out['speed'][-1]['us_per_system_step']:.3g} µs/system-step",
                flush=True,
            )
    return out


def _mujoco_depth(mjm, qs):
    d, deepest = mujoco.MjData(mjm), 0.0
    for q in qs:
        d.qpos[:] = q
        mujoco.mj_forward(mjm, d)
        if d.ncon:
            deepest = max(deepest, float(-min(c.dist for c in d.contact[: d.ncon])))
    return deepest


def _speed_table(rows) -> list[str]:
    if not rows:
        return []
    lines = [
        "",
        "| B | engine | steps | compile s | run s | µs per system-step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['engine']} | {r['steps']} | {r['compile_s']:.2f} | "
            f"{r['run_s']:.4f} | {r['us_per_system_step']:.3g} |"
        )
    return lines


def table(records) -> str:
    lines = []
    if not (records["physics"] or records["speed"]):  # --only quadruped
        records = {**records, "physics": {}, "speed": []}
    else:
        lines += [
            "| scene | engine | time to rest s | rest height m | tilt ° | deepest penetration m | closed form |",
            "|---|---|---|---|---|---|---|",
        ]
    for scene, rows in records["physics"].items():
        for engine, r in rows.items():
            if "rolling_from_s" in r:
                extra = (
                    f"rolls from {r['rolling_from_s']:.4f} s (closed form "
                    f"{r['rolling_from_closed_form_s']:.4f}) at {r['rolling_speed']:.4f} m/s "
                    f"({r['rolling_speed_closed_form']:.4f})"
                )
            else:
                extra = f"rests on its {r['resting_face_axis']} face (height {HALF['xyz'.index(r['resting_face_axis'])]} m)"
            lines.append(
                f"| {scene} | {engine} | {r['time_to_rest_s']:.3f} | {r['rest_height_m']:.5f} | "
                f"{r.get('tilt_at_rest_deg', float('nan')):.2g} | {r['deepest_penetration_m']:.2e} | {extra} |"
            )
    lines += _speed_table(records["speed"])
    if "stack" in records:
        lines += [
            "",
            "Two cubes stacked (box–box), 1 s:",
            "",
            "| engine | rest heights m (0.1, 0.3) | deepest penetration m | time to rest s | max speed, last 0.1 s |",
            "|---|---|---|---|---|",
        ]
        for engine, r in records["stack"]["physics"].items():
            h = r["rest_heights_m"]
            lines.append(
                f"| {engine} | {h[0]:.6f}, {h[1]:.6f} | {r['deepest_penetration_m']:.2e} | "
                f"{r['time_to_rest_s']:.3f} | {r['max_speed_last_100_steps']:.1e} |"
            )
        lines += _speed_table(records["stack"]["speed"])
    if "quadruped" in records:
        lines += [
            "",
            "Barkour v0 standing, 5 s (tests/test_contact_quadruped.py):",
            "",
            "| engine | base height m | feet creep after 1 s m | deepest penetration m | feet gap m |",
            "|---|---|---|---|---|",
        ]
        for engine, r in records["quadruped"]["physics"].items():
            gaps = ", ".join(f"{g:.1e}" for g in r["feet_gap_m"])
            lines.append(
                f"| {engine} | {r['base_height_m']:.5f} | {r['feet_creep_after_1s_m']:.1e} | "
                f"{r['deepest_penetration_m']:.1e} | {gaps} |"
            )
        lines += _speed_table(records["quadruped"]["speed"])
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--run-s", type=float, default=2.0, help="target seconds per warm call at B > 1"
    )
    ap.add_argument(
        "--stack-batches",
        type=int,
        nargs="+",
        default=[1],
        help="batch sizes of the two-cube stack (B = 64 did not finish in 25 min, session 49: "
        "under vmap every system runs the sweeps of the slowest)",
    )
    ap.add_argument(
        "--quadruped-batches", type=int, nargs="+", default=[1, 64], help="Barkour standing"
    )
    ap.add_argument("--only", choices=["quadruped"], default=None, help="run this section alone")
    ap.add_argument("--quick", action="store_true", help="B = 1 and 64, one repeat")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", default=None, help="print the tables of a --json file and exit")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as fh:
            print(table(json.load(fh)))
        return
    if args.quick:
        args.batches, args.repeats = [1, 64], 1
    records = {
        "meta": dict(
            machine=platform.processor() or platform.machine(),
            jax=jax.__version__,
            backend=jax.default_backend(),
            mujoco=mujoco.__version__ if HAVE_MUJOCO else None,
            h=H,
            date=time.strftime("%Y-%m-%d"),
        ),
        "physics": {},
        "speed": [],
    }
    if args.only is None:
        for name in SCENES:
            print(name, flush=True)
            records["physics"][name] = physics(name, args.repeats)
        records["speed"] = speed(args.batches, args.repeats, args.run_s)
        print("stack", flush=True)
        records["stack"] = stack(args.stack_batches, args.repeats)
    print("quadruped", flush=True)
    records["quadruped"] = quadruped(args.quadruped_batches, args.repeats)
    print(table(records))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh, indent=1)
        print(f"wrote {args.json}")
    return records


if __name__ == "__main__":
    main()
