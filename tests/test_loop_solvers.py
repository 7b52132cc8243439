"""The block-tridiagonal ("banded") Schur solve of mechanisms with many loops
(rbjax/_engine/blockchol.py ``level_groups``, ``BlockTridiagonal``; rbjax/_engine/schur.py):
its ordering, its factorisation against scipy, and the dynamics, derivatives, projections and
redundant-row fallback it gives against the dense Cholesky, on a chain of three four-bar loops
(small, cheap to compile)."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg
from conftest import assert_close
from test_elimination import _state, _with_method
from test_redundant_loops import parallelogram

import rbjax
from rbjax._engine import blockchol, schur as engine_schur
from rbjax._engine.joints import joint_terms, row_layout

ROD = np.diag([1e-3, 1.0 / 12.0, 1.0 / 12.0])


def fourbars(k=3):
    """K planar four-bar loops in series (2K + 1 bodies, benchmarks/models.py ``fourbars``):
    rockers hinged to the ground, each coupler on a ball joint at one rocker's tip and a
    universal joint at the next one's."""
    pivots = [np.array([j, 0.0, 0.0]) for j in range(k + 1)]
    tips = [p + (1.0 if j % 2 == 0 else 0.8) * np.array([0, 0, -1.0]) for j, p in enumerate(pivots)]
    pos = []
    for j in range(k + 1):
        if j:
            pos.append(0.5 * (tips[j - 1] + tips[j]))
        pos.append(0.5 * (pivots[j] + tips[j]))
    q0 = np.concatenate([np.asarray(pos), np.tile([1.0, 0, 0, 0], (len(pos), 1))], axis=1)
    bodies = [rbjax.Body(1.0 + 0.1 * b, ROD, name=f"b{b}") for b in range(2 * k + 1)]
    joints = []
    for j in range(k + 1):
        r = 2 * j
        joints.append(rbjax.Revolute.at(q0, rbjax.GROUND, r, point=pivots[j], axis=[0, 1, 0]))
        if j:
            joints.append(rbjax.Spherical.at(q0, r - 2, r - 1, point=tips[j - 1]))
            normal = np.cross(tips[j] - tips[j - 1], [0.0, 1.0, 0.0])
            joints.append(rbjax.Universal.at(q0, r - 1, r, point=tips[j], axis=normal, x=[0, 1, 0]))
    return rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81]), q0


def _scan_lengths(fn, *args) -> set:
    """The lengths of every ``lax.scan`` in the program of fn(*args) with the Schur solve
    forced to "banded" (nested jaxprs included)."""
    old = engine_schur.FORCE_METHOD
    engine_schur.FORCE_METHOD = "banded"
    try:
        jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    finally:
        engine_schur.FORCE_METHOD = old
    out: set = set()

    def walk(j):
        for eqn in j.eqns:
            if eqn.primitive.name == "scan":
                out.add(eqn.params["length"])
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else [p]:
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jaxpr)
    return out


def test_level_groups_order_S_block_tridiagonal():
    """Every joint in exactly one group; S (assembled densely) is zero between groups that are
    not adjacent; the groups are no wider than the widest level, and the chain of loops is
    cut into narrow groups (at most 8 of its 41 equations)."""
    model, q0 = fourbars(3)
    lay = row_layout(model.topology)
    groups = blockchol.level_groups(lay.body, lay.offsets, model.nb)
    joints = sorted(k for g in groups for k in g)
    assert joints == list(range(len(model.joints)))
    bl = engine_schur.banded_layout(model.topology)
    assert bl.width <= 8 and lay.n == 41
    state = _state(q0, 1)
    terms = joint_terms(
        model,
        model.formulation._engine_kinematics,
        state.t[0],
        jnp.moveaxis(state.q[0], -1, 0),
        jnp.moveaxis(state.u[0], -1, 0),
    )
    S = np.asarray(engine_schur.SchurSystem(model, terms, jnp.float64).assemble())
    group_of_row = np.empty(lay.n, int)
    for g, joints_g in enumerate(groups):
        for k in joints_g:
            group_of_row[lay.offsets[k] : lay.offsets[k + 1]] = g
    far = np.abs(group_of_row[:, None] - group_of_row[None, :]) > 1
    assert np.abs(S).max() > 0 and np.all(S[far] == 0.0)
    assert np.abs(S[~far]).max() > 0
    # the slots give every row back
    assert_close(bl.slot_row.ravel()[bl.row_slot], np.arange(lay.n), rtol=0, atol=0)


def test_block_tridiagonal_matches_scipy_and_flags_a_singular_matrix():
    """BlockTridiagonal's solve against scipy.linalg.solve of the assembled matrix (K = 5
    blocks of 3, a batch of 2); a matrix with a zero row is reported deficient."""
    rng = np.random.default_rng(0)
    k, m, batch = 5, 3, 2
    A = np.zeros((batch, k * m, k * m))
    for i in range(k):
        for j in (i - 1, i):
            if j >= 0:
                A[:, i * m : (i + 1) * m, j * m : (j + 1) * m] = rng.normal(size=(batch, m, m))
    S = A @ np.swapaxes(A, 1, 2) + 0.1 * np.eye(k * m)  # SPD, bandwidth two blocks
    S = S + np.swapaxes(S, 1, 2)
    # A Aᵀ couples blocks two apart: keep the tridiagonal part, made dominant to stay SPD
    far = np.abs(np.arange(k * m)[:, None] // m - np.arange(k * m)[None, :] // m) > 1
    S[:, far] = 0.0
    S = S + 4.0 * np.abs(S).sum(axis=-1).max() * np.eye(k * m)
    blocks = S.reshape(batch, k, m, k, m)
    D = np.stack([blocks[:, i, :, i] for i in range(k)])
    B = np.stack([np.zeros((batch, m, m))] + [blocks[:, i, :, i - 1] for i in range(1, k)])
    b = rng.normal(size=(batch, k * m))

    @jax.jit
    def f(D, B, r):
        fac = blockchol.BlockTridiagonal(D, B)
        return fac.solve(r), fac.deficient

    x, bad = f(D, B, np.moveaxis(b.reshape(batch, k, m), 1, 0))
    ref = np.stack([scipy.linalg.solve(S[i], b[i], assume_a="pos") for i in range(batch)])
    assert_close(np.moveaxis(np.asarray(x), 0, 1).reshape(batch, -1), ref, rtol=1e-13, atol=0)
    assert not bool(bad)
    D_bad = D.copy()
    D_bad[2, :, 1, :] = D_bad[2, :, :, 1] = 0.0
    B_bad = B.copy()
    B_bad[2, :, 1, :] = B_bad[3, :, :, 1] = 0.0
    assert bool(f(D_bad, B_bad, np.moveaxis(b.reshape(batch, k, m), 1, 0))[1])


def test_banded_is_chosen_for_large_mechanisms_in_small_batches(monkeypatch):
    """Above DENSE_MAX_ROWS equations and below DENSE_MAX_BATCH systems: "banded" while the
    widest group is at most BANDED_MAX_WIDTH equations, the block Cholesky otherwise; large
    batches keep their solvers."""
    model, _ = fourbars(3)
    rows = blockchol.DENSE_MAX_ROWS + 1
    assert engine_schur.method(model.topology, rows, 1) == "banded"
    assert engine_schur.method(model.topology, rows, 64) == "tree"  # 3 loops: elimination
    monkeypatch.setattr(engine_schur, "BANDED_MAX_WIDTH", 4)
    assert engine_schur.method(model.topology, rows, 1) == "block"


def test_banded_dynamics_derivatives_and_projection_equal_dense():
    """Accelerations and multipliers (2 systems), their reverse-mode derivatives with respect
    to the masses and the state (through custom_linear_solve's transpose), and 30 steps of
    Projected(RK4) (the projection's frozen factorisation and its velocity projection) with the
    banded solve equal the dense Cholesky's to 1e-11 relative."""
    model, q0 = fourbars(3)
    state = _state(q0, 2)
    rest = rbjax.make_state(position=q0[:, :3], quaternion=q0[:, 3:])  # on the joints, at rest
    arrays, static = eqx.partition(model, eqx.is_array)
    weights = jnp.linspace(0.5, 1.5, 7 * model.nb).reshape(model.nb, 7)

    def loss(arr, st):
        udot, lam = rbjax.accelerations(eqx.combine(arr, static), st)
        return jnp.sum(weights * udot) + jnp.sum(jnp.sin(lam)), (udot, lam)

    def f(arr, st):
        (_, (udot, lam)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(arr, st)
        traj = rbjax.rollout(
            eqx.combine(arr, static), rest, 1e-3, 30, integrator=rbjax.Projected(rbjax.RK4())
        )
        return udot, lam, grads[0].mass, grads[1].q, grads[1].u, traj.q, traj.u

    # the banded program is the block-tridiagonal recursion: scans over the K groups
    k = engine_schur.banded_layout(model.topology).slot_row.shape[0]
    assert {k - 1, k} <= _scan_lengths(
        lambda a, s: rbjax.accelerations(eqx.combine(a, static), s), arrays, state
    )
    ref = _with_method("dense", f, arrays, state)
    got = _with_method("banded", f, arrays, state)
    names = ("udot", "lam", "d/dmass", "d/dq", "d/du", "rollout q", "rollout u")
    for a, b, name in zip(got, ref, names, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert_close(a / scale, b / scale, rtol=0, atol=1e-11, err_msg=name)


def test_banded_switches_to_minimum_norm_multipliers_on_redundant_rows():
    """The redundant parallelogram (its planar loop's out-of-plane rows are dependent): the
    banded factorisation detects the deficient pivot and returns the same minimum-norm
    multipliers as the dense Cholesky's fallback, for a batch of two states."""
    model, state = parallelogram()
    batch = jax.tree.map(lambda a: jnp.stack([a, a]), state)
    batch = eqx.tree_at(lambda s: s.u, batch, batch.u * jnp.asarray([1.0, -0.5])[:, None, None])

    def f(m, s):
        return rbjax.accelerations(m, s)

    k = engine_schur.banded_layout(model.topology).slot_row.shape[0]
    assert k in _scan_lengths(f, model, batch)  # the block-tridiagonal solve
    ref = _with_method("dense", f, model, batch)
    got = _with_method("banded", f, model, batch)
    for a, b in zip(got, ref, strict=True):
        scale = float(jnp.max(jnp.abs(b)))
        assert_close(a / scale, b / scale, rtol=0, atol=1e-10)


def test_banded_works_in_float32():
    """float32 in, float32 out: the banded accelerations and multipliers of the chain of loops
    are as close to float64's as float32's dense Cholesky is (within 2×, floor 1e-5)."""
    model, q0 = fourbars(3)
    state = _state(q0, 2)

    def f(m, s):
        return rbjax.accelerations(m, s)

    ref = _with_method("dense", f, model, state)
    model32 = model.astype(jnp.float32)
    state32 = jax.tree.map(lambda x: x.astype(jnp.float32), state)
    dense32 = _with_method("dense", f, model32, state32)
    got = _with_method("banded", f, model32, state32)
    for a, d, b in zip(got, dense32, ref, strict=True):
        assert a.dtype == jnp.float32
        scale = float(jnp.max(jnp.abs(b)))
        err_dense = float(np.max(np.abs(np.asarray(d, np.float64) - b))) / scale
        assert_close(
            np.asarray(a, np.float64) / scale, b / scale, rtol=0, atol=max(2 * err_dense, 1e-5)
        )


def test_joint_rows_traced_once_per_type(monkeypatch):
    """rbjax.Model counts each joint's equations by tracing its residual (55 ms a joint): rbjax's
    fixed-size joints share one trace per type, and what it returns is each residual's length;
    a CustomConstraint (the user's function) is still traced on its own."""
    import rbjax._model as model_module

    calls = []
    trace = model_module._trace_rows
    monkeypatch.setattr(model_module, "_ROWS", {})
    monkeypatch.setattr(model_module, "_trace_rows", lambda j, d: calls.append(j) or trace(j, d))
    model, _ = fourbars(4)  # 5 revolute, 4 spherical and 4 universal joints
    assert len(calls) == 3
    q = jnp.tile(jnp.asarray([0.1, 0.2, 0.3, 1.0, 0.0, 0.0, 0.0]), (2, 1))
    lengths = [j.residual(q[0], q[1], 0.0).shape[0] for j in model.joints]
    assert model.topology.joint_rows == tuple(lengths)
    custom = rbjax.CustomConstraint(lambda qi, qj, t, p: qi[:2] - qj[:2], 0, 1, name="c")
    two = rbjax.Model([rbjax.Body(1.0, ROD), rbjax.Body(1.0, ROD)], joints=[custom, custom])
    assert len(calls) == 5 and two.topology.joint_rows == (2, 2)
