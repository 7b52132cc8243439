"""Spring potentials in the total energy, and :func:`rbjax.energy_balance`.

The potentials of the TSDA, RSDA and axial spring against finite differences of the spring
force (−dV/dt = the power of the resultants, Möller & Glocker 2012 eq. (75), for random
velocities); a two-body mass–spring chain under gravity and a torsion pendulum on a tilted
hinge (RSDA, gravity) conserve T + V under RK4 to its O(dt⁴) drift (checked: the drift falls
16x when dt halves), with a leading batch axis on the masses; with damping the energy falls
monotonically and the loss equals the dissipated work ∫ c l̇² dt; the classification of models.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_close
from numpy_quaternions import qmul, quat_axis, rotmat

import rbjax
from rbjax._engine.forces import total_resultants
from rbjax._engine.layout import to_components

GROUND = rbjax.GROUND
GRAVITY = np.array([0.0, 0.0, -9.81])


def spring_potential(force, model, q):
    """V of one force at ONE configuration q (nb, 7), through the engine's hook."""
    _, qc, _ = to_components(rbjax.State(t=jnp.asarray(0.0), q=q, u=jnp.zeros_like(q)))
    return force._engine_potential(model, jnp.zeros((1,)), qc)


def power(model, q, u):
    """Σ_b (Fᵀv + S ν + Mᵀω̄) of the model's forces (no gravity) at q, u: the power of the
    resultants (Möller & Glocker 2012, eq. (75))."""
    state = rbjax.State(t=jnp.asarray(0.0), q=jnp.asarray(q), u=jnp.asarray(u))
    res = total_resultants(model, *to_components(state))
    F, S, M = np.asarray(res.F).T, np.asarray(res.S), np.asarray(res.M).T
    return float(np.sum(F * u[:, 0:3]) + np.sum(S * u[:, 3]) + np.sum(M * u[:, 4:7]))


def two_bodies():
    """Body 0 rigid, body 1 scalable with |A|² = 1.44, at general positions."""
    q = np.array(
        [
            np.r_[0.1, 0.2, -0.3, quat_axis([0.3, -1.0, 0.5], 0.8)],
            np.r_[1.0, -0.5, 0.4, 1.2 * quat_axis([1.0, 0.4, -0.2], -1.3)],
        ]
    )
    bodies = [
        rbjax.Body(1.0, [0.1, 0.2, 0.25], name="i"),
        rbjax.Body(2.0, [0.3, 0.2, 0.4], scalable=True, name="j"),
    ]
    return bodies, q


def test_spring_potentials_are_the_integrals_of_the_spring_forces():
    """−dV/dt along q̇ = kinematics(q, u), by central differences in q, equals the power of the
    undamped spring's resultants, for random velocities (ν ≠ 0 on the scalable body). The RSDA
    is checked where its axes are parallel (the configurations a hinge allows), with body j
    otherwise turned and both bodies moving in every direction; a second check adds damping:
    the damped force's power is the spring's minus c l̇² (resp. c θ̇², c ẋ²)."""
    bodies, q = two_bodies()
    s_i, s_j = np.array([0.2, -0.1, 0.3]), np.array([-0.15, 0.25, 0.05])
    tsda = dict(stiffness=30.0, rest_length=0.6)
    # RSDA: built in q, then body j turned by 0.9 rad about the (world) axis through its centre
    axis = np.array([0.2, -0.5, 1.0])
    n = axis / np.linalg.norm(axis)
    rsda = dict(stiffness=7.0, rest_angle=0.3)
    rsda_force = rbjax.RotationalSpringDamper.at(q, 0, 1, axis=axis, **rsda)
    q_turned = q.copy()
    q_turned[1, 3:7] = qmul(quat_axis(n, 0.9), q[1, 3:7])
    # axial: body i rigid (the side whose scaling the force does not see), j scalable
    axial = dict(stiffness=12.0, rest_length=-0.2)
    axial_force = rbjax.AxialSpringDamper.at(q, 0, 1, point=[0.4, 0.1, 0.0], axis=axis, **axial)
    q_moved = q_turned.copy()
    q_moved[1, 0:3] += [0.3, -0.2, 0.25]  # off the axis and along it: x ≠ 0
    cases = {
        "TSDA": (rbjax.TranslationalSpringDamper(0, s_i, 1, s_j, **tsda), q),
        "RSDA": (rsda_force, q_turned),
        "axial": (axial_force, q_moved),
    }
    rng = np.random.default_rng(3)
    for name, (force, qc) in cases.items():
        model = rbjax.Model(bodies, forces=[force])
        kin = jax.vmap(model.formulation.kinematics)
        for trial in range(3):
            u = rng.normal(size=(2, 7))
            u[0, 3] = 0.0  # body 0 is rigid
            qdot = np.asarray(kin(jnp.asarray(qc), jnp.asarray(u)))
            eps = 1e-6
            v_plus = float(spring_potential(force, model, jnp.asarray(qc + eps * qdot)))
            v_minus = float(spring_potential(force, model, jnp.asarray(qc - eps * qdot)))
            dv_dt = (v_plus - v_minus) / (2 * eps)
            # the generalized spring force (at u = 0: no rate) paired with the velocity u
            state0 = rbjax.State(t=jnp.asarray(0.0), q=jnp.asarray(qc), u=jnp.zeros((2, 7)))
            res = total_resultants(model, *to_components(state0))
            F, S, M = np.asarray(res.F).T, np.asarray(res.S), np.asarray(res.M).T
            work = np.sum(F * u[:, 0:3]) + np.sum(S * u[:, 3]) + np.sum(M * u[:, 4:7])
            print(f"{name}: −dV/dt {-dv_dt:+.9f}, power {work:+.9f}")
            assert abs(work) > 1e-2, name  # a nontrivial check
            assert_close(-dv_dt, work, rtol=1e-8, atol=1e-9, err_msg=f"{name} trial {trial}")
    # damping: power = spring power − c rate² (the rate from the forces' own helpers)
    c = 0.7
    damped = {
        "TSDA": rbjax.TranslationalSpringDamper(0, s_i, 1, s_j, damping=c, **tsda),
        "RSDA": rbjax.RotationalSpringDamper.at(q, 0, 1, axis=axis, damping=c, **rsda),
        "axial": rbjax.AxialSpringDamper.at(
            q, 0, 1, point=[0.4, 0.1, 0.0], axis=axis, damping=c, **axial
        ),
    }
    u = rng.normal(size=(2, 7))
    u[0, 3] = 0.0
    for name, force in damped.items():
        spring, qc = cases[name]
        model = rbjax.Model(bodies, forces=[force])
        state = rbjax.State(t=jnp.asarray(0.0), q=jnp.asarray(qc), u=jnp.asarray(u))
        helper = {
            "TSDA": "length_and_rate",
            "RSDA": "angle_and_rate",
            "axial": "displacement_and_rate",
        }
        rate_of = getattr(force, helper[name])
        rate = rate_of(model, state)[1]
        spring_only = power(rbjax.Model(bodies, forces=[spring]), qc, u)
        assert_close(power(model, qc, u), spring_only - c * float(rate) ** 2, rtol=1e-12)


def test_potential_energy_of_each_spring_by_hand_on_a_batch():
    """½ k (l − l0)², ½ k (θ − θ0)², ½ k (x − x0)² by hand (NumPy) plus −Σ m gᵀr, on a batch of
    configurations with a batch of masses (B, nb)."""
    bodies, q = two_bodies()
    axis = np.array([0.2, -0.5, 1.0])
    forces = [
        rbjax.TranslationalSpringDamper(
            0, [0.2, 0.0, 0.1], GROUND, [1.0, 1.0, 0.0], stiffness=5.0, rest_length=0.5
        ),
        rbjax.RotationalSpringDamper.at(q, GROUND, 1, axis=axis, stiffness=3.0, rest_angle=-0.2),
        rbjax.AxialSpringDamper.at(q, 0, 1, point=[0.0, 0.0, 0.0], axis=axis, stiffness=4.0),
    ]
    model = rbjax.Model(bodies, forces=forces, gravity=GRAVITY)
    masses = jnp.array([[1.0, 2.0], [1.5, 0.5], [3.0, 1.0]])
    model = eqx.tree_at(lambda m: m.mass, model, masses)
    n = axis / np.linalg.norm(axis)
    qs = np.stack([q, q, q])
    qs[1, 1, 3:7] = qmul(quat_axis(n, 0.4), q[1, 3:7])  # turned about the RSDA axis
    qs[2, 0, 0:3] += [0.2, -0.3, 0.1]
    state = rbjax.State(t=jnp.zeros(3), q=jnp.asarray(qs), u=jnp.zeros((3, 2, 7)))
    got = np.asarray(rbjax.potential_energy(model, state))
    tsda, rsda, axial = forces
    want = np.zeros(3)
    for k in range(3):
        (r0, a0), (r1, a1) = ((qs[k, b, 0:3], qs[k, b, 3:7]) for b in range(2))
        p0 = r0 + rotmat(a0) @ np.asarray(tsda.s_i)  # body 0: |A| = 1
        want[k] += 0.5 * 5.0 * (np.linalg.norm(p0 - [1.0, 1.0, 0.0]) - 0.5) ** 2
        rel = qmul(a1, q[1, 3:7] * [1, -1, -1, -1])  # rotation of body 1 since q: about n
        angle = 2 * np.arctan2(rel[1:] @ n, rel[0])
        want[k] += 0.5 * 3.0 * (angle + 0.2) ** 2
        z = rotmat(a0) @ np.asarray(axial.axis_i)
        p_i = r0 + rotmat(a0) @ np.asarray(axial.s_i)
        p_j = r1 + (a1 @ a1) * rotmat(a1) @ np.asarray(axial.s_j)  # s R s̄: scalable body 1
        want[k] += 0.5 * 4.0 * (z @ (p_j - p_i)) ** 2
        want[k] -= np.asarray(masses[k]) @ (np.array([r0, r1]) @ GRAVITY)
    print(f"\nV: {got}")
    assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert got.shape == (3,)


# -------------------------------------------------------------------- conservation under RK4

K1, K2, L1, L2 = 60.0, 40.0, 0.5, 0.4


def chain(damping=0.0):
    """ground —TSDA— body 0 —TSDA— body 1, attachments off the centres of mass (springs turn
    the bodies too), gravity along the chain plus a tilt; masses with a batch axis (2, 2)."""
    bodies = [rbjax.Body(1.0, [0.02, 0.03, 0.025]), rbjax.Body(0.7, [0.01, 0.015, 0.02])]
    springs = [
        rbjax.TranslationalSpringDamper(
            GROUND,
            [0.0, 0.0, 0.0],
            0,
            [0.05, -0.03, 0.1],
            stiffness=K1,
            damping=damping,
            rest_length=L1,
        ),
        rbjax.TranslationalSpringDamper(
            0,
            [-0.04, 0.02, -0.1],
            1,
            [0.03, 0.05, 0.08],
            stiffness=K2,
            damping=damping,
            rest_length=L2,
        ),
    ]
    model = rbjax.Model(bodies, forces=springs, gravity=[0.8, 0.0, -9.81])
    model = eqx.tree_at(lambda m: m.mass, model, jnp.array([[1.0, 0.7], [1.4, 0.5]]))
    state = rbjax.make_state(
        position=[[0.1, 0.05, -0.75], [0.15, -0.05, -1.3]],
        quaternion=[quat_axis([1.0, 0.2, 0.0], 0.3), quat_axis([0.0, 1.0, 0.4], -0.5)],
        velocity=[[0.3, -0.2, 0.1], [0.0, 0.4, 0.0]],
        omega_body=[[0.5, -1.0, 2.0], [1.0, 0.3, -0.7]],
    )
    batch = jax.tree.map(lambda x: jnp.stack([x, x]), state)
    return model, batch


def energies(model, tr, kind=rbjax.total_energy):
    """``kind`` (B, T) of a batched trajectory (B, T, nb, 7) of a model with masses (B, nb):
    the model's batch axes lead the states' (rbjax/_analysis/invariants.py)."""
    return np.asarray(kind(model, tr.states))


def test_mass_spring_chain_conserves_total_energy_to_rk4_accuracy():
    model, state = chain()
    assert rbjax.energy_balance(model) == "conservative"
    drifts = []
    for dt, steps in ((2e-3, 1500), (1e-3, 3000)):  # 3 s, about 4 periods of the fast mode
        tr = rbjax.rollout(model, state, dt, steps, save_every=steps // 150)
        e = energies(model, tr)
        drifts.append(np.max(np.abs(e - e[:, :1]), axis=1) / np.max(np.abs(e), axis=1))
    v = energies(model, tr, rbjax.potential_energy)
    gravity = -np.einsum(
        "bn,btni,i->bt",
        np.asarray(model.mass),
        np.asarray(tr.q[..., 0:3]),
        np.asarray(model.gravity),
    )
    print(f"\nchain: relative drift {drifts[0]} (dt = 2 ms), {drifts[1]} (1 ms)")
    assert np.all(drifts[1] < 1e-9)  # measured 1.4e-11
    assert np.all(drifts[0] / drifts[1] > 10)  # RK4: 16x per halving
    springs = v - gravity  # ½ k (l − l0)² summed: positive, and it swings
    assert np.all(springs >= 0.0)
    assert np.all(np.ptp(springs, axis=1) > 0.1 * np.max(np.abs(e), axis=1))
    assert not np.allclose(e[0], e[1])  # the two masses give two motions


def pendulum(damping=0.0):
    """A bar on a hinge with a tilted axis n (world) through a point off its centre of mass,
    a torsion spring (RSDA) about the hinge, gravity; the body axes align with nothing."""
    a0 = quat_axis([0.3, -0.7, 0.5], 1.1)
    rot0 = rotmat(a0)
    r0 = np.array([0.2, -0.1, 0.4])
    n = np.cos(0.6) * rot0[:, 1] + np.sin(0.6) * rot0[:, 2]
    hinge_point = r0 - 0.3 * rot0[:, 0]
    q_ref = np.r_[r0, a0][None]
    hinge = rbjax.Revolute.at(q_ref, GROUND, 0, point=hinge_point, axis=n)
    rsda = rbjax.RotationalSpringDamper.at(
        q_ref, GROUND, 0, axis=n, stiffness=4.0, damping=damping, rest_angle=0.5
    )
    model = rbjax.Model(
        [rbjax.Body(1.2, [0.01, 0.05, 0.06])], joints=[hinge], forces=[rsda], gravity=GRAVITY
    )
    w0 = 2.0 * n
    state = rbjax.make_state(
        position=r0[None],
        quaternion=a0[None],
        velocity=np.cross(w0, r0 - hinge_point)[None],
        omega_body=(rot0.T @ w0)[None],
    )
    return model, state, rsda


def test_torsion_pendulum_conserves_total_energy_and_loses_it_with_damping():
    model, state, rsda = pendulum()
    assert rbjax.energy_balance(model) == "conservative"
    tr = rbjax.rollout(model, state, 1e-3, 3000, save_every=10)
    e = np.asarray(rbjax.total_energy(model, tr.states))
    drift = np.max(np.abs(e - e[0])) / np.max(np.abs(e))
    theta = np.asarray(rsda.angle_and_rate(model, tr.states)[0])
    print(
        f"\ntorsion pendulum: relative drift {drift:.1e}, θ in [{theta.min():.2f}, {theta.max():.2f}]"
    )
    assert drift < 1e-9  # measured 1.1e-11
    assert np.ptp(theta) > 1.0  # the spring swings through a wide range
    # damped: E falls monotonically, and the loss equals ∫ c θ̇² dt (trapezoid over the steps)
    c = 0.15
    damped, state, rsda = pendulum(damping=c)
    assert rbjax.energy_balance(damped) == "dissipative"
    tr = rbjax.rollout(damped, state, 1e-3, 3000, save_every=1)
    e = np.asarray(rbjax.total_energy(damped, tr.states))
    rate = np.asarray(rsda.angle_and_rate(damped, tr.states)[1])
    dissipated = np.concatenate(
        [[0.0], np.cumsum(0.5 * 1e-3 * c * (rate[1:] ** 2 + rate[:-1] ** 2))]
    )
    print(f"damped: E {e[0]:.4f} → {e[-1]:.4f}, max step ΔE {np.max(np.diff(e)):.1e}")
    assert np.all(np.diff(e) < 1e-12)
    assert e[0] - e[-1] > 0.1
    assert_close(e[0] - e, dissipated, rtol=0, atol=1e-5)  # trapezoid: O(dt²), measured 3e-6


def test_damped_chain_loses_energy_monotonically():
    model, state = chain(damping=0.4)
    assert rbjax.energy_balance(model) == "dissipative"
    tr = rbjax.rollout(model, state, 1e-3, 3000, save_every=10)
    e = energies(model, tr)
    print(f"\ndamped chain: E {e[:, 0]} → {e[:, -1]}")
    assert np.all(np.diff(e, axis=1) < 1e-12)
    assert np.all(e[:, 0] - e[:, -1] > 0.1)


def test_energy_balance_classifies_models_statically():
    """Each verdict against what the physics says (see the FD test above for why an RSDA
    needs its hinge and an axial spring a rigid body i)."""
    q0 = np.r_[0.3, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0][None]
    body = rbjax.Body(1.0, [0.1, 0.2, 0.3])
    hinge = rbjax.Revolute.at(q0, GROUND, 0, point=[0.0, 0.0, 0.0], axis=[0.0, 0.0, 1.0])
    spring = rbjax.RotationalSpringDamper.at(q0, GROUND, 0, stiffness=2.0)
    tilted = rbjax.RotationalSpringDamper.at(q0, GROUND, 0, axis=[0.0, 1.0, 1.0], stiffness=2.0)

    def damped(c):
        return eqx.tree_at(lambda f: f.damping, spring, jnp.asarray(c))

    actuated = rbjax.RotationalSpringDamper.at(
        q0, GROUND, 0, stiffness=2.0, actuator=rbjax.Actuator(control=1.0)
    )
    cases = {
        "gravity alone": ([], [], "conservative"),
        "undamped RSDA on its hinge": ([spring], [hinge], "conservative"),
        "RSDA on a hinge given the other way round": (
            [spring],
            [rbjax.Revolute.at(q0, 0, GROUND, point=[0.0, 0.0, 0.0], axis=[0.0, 0.0, 1.0])],
            "conservative",
        ),
        "RSDA without a hinge": ([spring], [], None),
        "RSDA about another axis than its hinge": ([tilted], [hinge], None),
        "damped RSDA": ([damped(0.1)], [hinge], "dissipative"),
        "negative damping": ([damped(-0.1)], [hinge], None),
        "actuator": ([actuated], [hinge], None),
        "TSDA without joints": (
            [rbjax.TranslationalSpringDamper(0, np.zeros(3), GROUND, np.ones(3), stiffness=1.0)],
            [],
            "conservative",
        ),
        "world point force": ([rbjax.PointForce(0, np.zeros(3), np.ones(3))], [], None),
        "body torque": ([rbjax.BodyTorque(0, np.ones(3), frame="world")], [], None),
        "force function": ([rbjax.ForceFunction(lambda t, s, p: rbjax.Wrench.zeros(1))], [], None),
        "driver with f(t)": ([spring], [hinge, rbjax.RotationDriver.on(hinge, q0, jnp.sin)], None),
        "driver holding": ([spring], [hinge, rbjax.RotationDriver.on(hinge, q0)], "conservative"),
        "time-free user constraint": (
            [],
            [rbjax.CustomConstraint(lambda qi, qj, t, p: qi[2:3] - qj[2:3], 0, GROUND)],
            "conservative",
        ),
        "moving user constraint": (
            [],
            [rbjax.CustomConstraint(lambda qi, qj, t, p: qi[2:3] - jnp.sin(t), 0, GROUND)],
            None,
        ),
    }
    for name, (forces, joints, expected) in cases.items():
        model = rbjax.Model(body, forces=forces, joints=joints, gravity=GRAVITY)
        assert rbjax.energy_balance(model) == expected, name
    # an axial spring: a scalable body i breaks it (the scaling moves P_i, not the force)
    q2 = np.array(
        [np.r_[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], np.r_[0.5, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]
    )
    axial = rbjax.AxialSpringDamper.at(
        q2, 0, 1, point=[0.2, 0.0, 0.0], axis=[1.0, 0.0, 0.0], stiffness=3.0
    )
    for scalable_i, expected in ((False, "conservative"), (True, None)):
        bodies = [rbjax.Body(1.0, [0.1, 0.2, 0.3], scalable=scalable_i), body]
        assert rbjax.energy_balance(rbjax.Model(bodies, forces=[axial])) == expected
    # a traced damping counts as dissipative (under jit, where its value is unknown)
    seen = []

    @eqx.filter_jit
    def traced(model):
        seen.append(rbjax.energy_balance(model))
        return model.mass

    traced(rbjax.Model(body, forces=[spring], joints=[hinge]))
    # and a driver whose function has (traced) parameters still reads t
    ramp = rbjax.RotationDriver.on(hinge, q0, Ramp(jnp.asarray(2.0)))
    traced(rbjax.Model(body, forces=[spring], joints=[hinge, ramp]))
    assert seen == ["dissipative", None]
    assert rbjax.energy_balance(rbjax.Model(body, forces=[spring], joints=[hinge, ramp])) is None


class Ramp(eqx.Module):
    """θ(t) = w t with a differentiable rate w."""

    w: jax.Array

    def __call__(self, t):
        return self.w * t


def test_potential_energy_without_springs_is_gravity_alone():
    """V = −Σ m gᵀ r exactly as before for forces without a potential."""
    model = rbjax.Model(
        [rbjax.Body(2.0, [0.1, 0.2, 0.3]), rbjax.Body(3.0, [0.1, 0.2, 0.3])],
        forces=[rbjax.PointForce(0, np.zeros(3), np.ones(3)), rbjax.BodyTorque(1, np.ones(3))],
        gravity=GRAVITY,
    )
    state = rbjax.make_state(position=[[0.1, 0.2, 0.3], [-1.0, 2.0, 4.0]])
    assert float(rbjax.potential_energy(model, state)) == 9.81 * 0.3 * 2.0 + 9.81 * 4.0 * 3.0
