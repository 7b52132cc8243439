"""The normalisation constraint: autodiff W and γ against the closed form of Möller & Glocker 2012.

rbjax's inner loop uses W = e_ν, γ = 0 for c = |A|² − 1 in generalized velocities (Möller & Glocker 2012,
eqs. (44), (89)-(90): ċ = ν). The generic route that joints will take derives W = c_q Q⁻¹ by
jvp and γ by nested jvp from c alone; here both routes must agree, and the Jacobian must also
agree with the hand-written ME751 expression (Φ_p = 2pᵀ) pushed through Q⁻¹ (eq. (85)).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax
from rbjax._engine import dynamics as dyn
from rbjax._engine.layout import to_components


def random_state(key, batch, nb=2, scale=1.0):
    k1, k2, k3 = jax.random.split(key, 3)
    q = jax.random.normal(k1, batch + (nb, 7)) * scale
    q = q.at[..., 3:7].multiply(jax.random.uniform(k3, batch + (nb, 1), minval=0.3, maxval=2.0))
    u = jax.random.normal(k2, batch + (nb, 7))
    return rbjax.State(t=jnp.zeros(batch), q=q, u=u)


@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_autodiff_W_equals_closed_form_and_seed004(batch):
    bodies = [
        rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 2.5])), name="a"),
        rbjax.Body(2.0, jnp.eye(3), name="b"),
    ]
    model = rbjax.Model(bodies)
    st = random_state(jax.random.PRNGKey(1), batch)
    _, q, u = to_components(st)
    w_ad = dyn.normalisation_jacobian_autodiff(model, q)
    w_cf = dyn.normalisation_jacobian(model, q)
    assert_close(w_ad, w_cf, rtol=1e-13, atol=1e-13)
    # Negrut ME751: Φ_q = [0, 2pᵀ]; W = Φ_q Q⁻¹ with Q⁻¹ from eq. (85), built independently here
    qn = np.asarray(st.q)
    for idx in np.ndindex(*batch, 2):
        p = qn[idx][3:7]
        phi = np.array(
            [
                [p[0], -p[1], -p[2], -p[3]],
                [p[1], p[0], -p[3], p[2]],
                [p[2], p[3], p[0], -p[1]],
                [p[3], -p[2], p[1], p[0]],
            ]
        )
        qinv = np.zeros((7, 7))
        qinv[:3, :3] = np.eye(3)
        qinv[3:, 3:] = phi / (2 * p @ p)
        phi_q = np.concatenate([np.zeros(3), 2 * p])
        w_row = phi_q @ qinv
        got = np.moveaxis(np.asarray(w_ad), 0, -1)[idx]
        assert_close(got, w_row, rtol=1e-12, atol=1e-13)


def test_autodiff_gamma_is_zero_and_matches_finite_difference():
    model = rbjax.Model([rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 2.5])))])
    st = random_state(jax.random.PRNGKey(2), (5,), nb=1)
    _, q, u = to_components(st)
    f = model.formulation
    gamma = dyn.normalisation_gamma(model, q, u)
    assert_close(gamma, 0.0, atol=1e-12)
    # γ = −d/dt(W) u; check d/dt(W(q(t)) u) by central differences along q̇ = Q⁻¹u
    qdot = f._engine_kinematics(q, u)
    eps = 1e-6
    wp = dyn.normalisation_velocity(model, q + eps * qdot, u)
    wm = dyn.normalisation_velocity(model, q - eps * qdot, u)
    assert_close(-(wp - wm) / (2 * eps), gamma, atol=1e-8)


def test_rigid_multiplier_enforces_nu_dot_zero_and_scalable_is_free():
    bodies = [
        rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0])), name="rigid"),
        rbjax.Body(1.0, jnp.diag(jnp.array([1.0, 2.0, 3.0])), scalable=True, name="scalable"),
    ]
    model = rbjax.Model(bodies)
    st = rbjax.make_state(omega_body=jnp.array([[0.3, 1.0, -0.2], [0.3, 1.0, -0.2]]))
    udot, lam = rbjax.accelerations(model, st)
    # rigid: ν̇ = 0 and λ = −ωᵀΘω (eq. 96); scalable: λ = 0 and ½trΘ ν̇ = ωᵀΘω/s (eq. 93)
    w = np.array([0.3, 1.0, -0.2])
    wtw = float(w @ np.diag([1.0, 2.0, 3.0]) @ w)
    assert_close(udot[0, 3], 0.0, atol=1e-15)
    assert_close(lam[0], -wtw, rtol=1e-14)
    assert_close(lam[1], 0.0, atol=0)
    assert_close(udot[1, 3], wtw / 3.0, rtol=1e-14)
    # both bodies share the same ω̇ (eq. 93 with ν = 0, s = 1)
    assert_close(udot[0, 4:], udot[1, 4:], rtol=1e-14)
