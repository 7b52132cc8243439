"""The fast kernels of a mechanism's right-hand side against independent references.

* W, γ and ċ of the built-in joints (chain rule split at the body Frame (r, A)) against the
  generic route (jvps of the residual in q), for every formulation's kinematics, random
  non-unit quaternions and every joint type.
* The block-sparse Cholesky (unrolled, batch-last) against numpy's dense solve, with fill-in.
* Batch chunking of rollouts: identical results with and without chunking, with padding and
  batched model parameters; bad ``batch_chunk`` rejected.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close

import rbjax
from rbjax._engine import joints as mech
from rbjax._engine.blockchol import BlockCholesky, BlockCholeskyBatched, dense_factor, dense_solve


def _all_joint_types_model(formulation, subset=None):
    q0 = np.array(
        [[0.1, 0.0, 0.0, 1, 0, 0, 0], [0.5, 0.2, 0.0, 1, 0, 0, 0], [1.0, 0.0, 0.3, 1, 0, 0, 0]]
    )
    G = rbjax.GROUND
    joints = [
        rbjax.Revolute.at(q0, G, 0, point=[0, 0, 0], axis=[0, 0, 1]),
        rbjax.Spherical.at(q0, 0, 1, point=[0.3, 0.1, 0]),
        rbjax.Universal(1, 2, s_i=[0.1, 0, 0], z_i=[0, 0, 1], z_j=[0, 1, 0]),
        rbjax.Translational.at(q0, G, 2, point=[1, 0, 0.3], axis=[1, 0, 0]),
        rbjax.Cylindrical(1, 2, s_j=[0.0, 0.1, 0.0]),
        rbjax.Fixed(0, 1, s_i=[0.2, 0, 0]),
        rbjax.Parallel(G, 1),
        rbjax.Perpendicular(0, 2, z_j=[1, 0, 0]),
        rbjax.PointOnLine(G, 1, s_j=[0.1, 0.2, 0.3]),
        rbjax.Distance(0, 2, length=0.7, s_i=[0.1, 0, 0]),
        rbjax.RotationDriver.at(q0, G, 0, point=[0, 0, 0], axis=[0, 0, 1], f=lambda t: 0.3 + t),
        rbjax.TranslationDriver.at(q0, G, 2, point=[1, 0, 0.3], axis=[1, 0, 0], f=jnp.sin),
        rbjax.advanced.DP1(0, [1.0, 0, 0], 1, [0, 1.0, 0], f=lambda t: 0.1 * t),
        rbjax.advanced.DP2(G, [0, 0, 1.0], [0.1, 0, 0], 2, [0, 0.2, 0]),
        rbjax.advanced.D(1, [0.1, 0, 0], 2, [0, 0, 0.1], f=lambda t: 0.5 + t * t),
        rbjax.advanced.CD([0.0, 1.0, 0.0], 0, [0.1, 0, 0], G, [0, 0, 0]),
    ]
    if subset is not None:
        joints = [joints[k] for k in subset]
    bodies = [rbjax.Body(1.0 + k, np.diag([1.0, 2.0, 3.0]), name=f"b{k}") for k in range(3)]
    return rbjax.Model(bodies, joints=joints, formulation=formulation)


@pytest.mark.parametrize(
    "formulation, subset",
    [
        (rbjax.ScalableDAE(), None),  # every joint type with the default kinematics
        (rbjax.NewtonEuler(), (1, 3, 10, 14)),  # other kinematics: one of each primitive kind
        (None, (1, 3, 10, 14)),  # (r, p) coordinates, as UdwadiaSchutte uses them
    ],
)
def test_frame_route_equals_generic_route(formulation, subset, monkeypatch):
    model = _all_joint_types_model(
        rbjax.ScalableDAE() if formulation is None else formulation, subset
    )
    kin = (
        (lambda q, x: x) if formulation is None else formulation._engine_kinematics
    )  # (r, p) route
    k1, k2 = jax.random.split(jax.random.PRNGKey(3))
    B = 4
    q = jax.random.normal(k1, (7, B, 3))  # non-unit quaternions: scalable transforms
    u = jax.random.normal(k2, (7, B, 3))
    t = jnp.linspace(0.0, 1.0, B)
    assert mech._fast_path(mech.groups(model)[0])

    def terms(q, u):
        return (
            mech.joint_terms(model, kin, t, q, u),
            mech.joint_terms(model, kin, t, q, u, gamma=False, cdot=True),
        )

    fast, fast_cd = jax.jit(terms)(q, u)
    monkeypatch.setattr(mech, "_fast_path", lambda grp: False)  # the natural-layout adapter
    ref, ref_cd = jax.jit(terms)(q, u)
    for name in ("c", "cdot", "gamma", "W"):
        for a, b in zip(
            jax.tree.leaves(getattr(fast, name)), jax.tree.leaves(getattr(ref, name)), strict=True
        ):
            assert_close(a, b, rtol=1e-12, atol=1e-12, err_msg=name)
    for a, b in zip(fast_cd.cdot, ref_cd.cdot, strict=True):
        assert_close(a, b, rtol=1e-12, atol=1e-12)


def _dense(blocks, sizes):
    off = np.concatenate([[0], np.cumsum(sizes)])
    S = np.zeros((off[-1], off[-1]))
    for (k, l), blk in blocks.items():
        S[off[k] : off[k + 1], off[l] : off[l + 1]] = blk
        S[off[l] : off[l + 1], off[k] : off[k + 1]] = blk.T
    return S, off


SOLVERS = {
    "unrolled": lambda blocks, n, b: BlockCholesky(blocks, n).solve(b),
    "batched": lambda blocks, n, b: BlockCholeskyBatched(blocks, n).solve(b),
    "dense": lambda blocks, n, b: dense_solve(dense_factor(blocks, [v.shape[0] for v in b]), b),
}


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("pattern", ["chain", "loop"])
def test_block_cholesky_matches_dense_solve(pattern, solver):
    """A 4-block SPD matrix with the sparsity of a chain, and of a closed loop (fill-in)."""
    rng = np.random.default_rng(0)
    sizes = [5, 3, 1, 6]
    n = len(sizes)
    # S = J Jᵀ + I with J's block rows touching "bodies" as in a chain or a loop
    touch = (
        {0: [0], 1: [0, 1], 2: [1, 2], 3: [2]}
        if pattern == "chain"
        else {0: [0, 3], 1: [0, 1], 2: [1, 2], 3: [2, 3]}
    )
    J = [np.zeros((m, 4 * 6)) for m in sizes]
    for k, bodies in touch.items():
        for b in bodies:
            J[k][:, 6 * b : 6 * b + 6] = rng.normal(size=(sizes[k], 6))
    Jd = np.concatenate(J)
    S = Jd @ Jd.T + np.eye(sum(sizes))
    off = np.concatenate([[0], np.cumsum(sizes)])
    blocks = {}
    for k in range(n):
        for l in range(k + 1):
            blk = S[off[k] : off[k + 1], off[l] : off[l + 1]]
            if np.any(blk != 0.0):
                blocks[(k, l)] = jnp.asarray(blk)[..., None]  # batch of one, batch-last
    if pattern == "loop":
        assert (3, 0) in blocks and (2, 0) not in blocks  # fill-in needed at (2, 0)
    b = rng.normal(size=sum(sizes))
    x = SOLVERS[solver](blocks, n, [jnp.asarray(b[off[k] : off[k + 1]])[:, None] for k in range(n)])
    assert_close(np.concatenate([np.asarray(v)[:, 0] for v in x]), np.linalg.solve(S, b))


def _pendulum(B):
    """A rod on a hinge with a spherical pendulum bob: masses batched over B."""
    q0 = np.array([[0.5, 0, 0, 1, 0, 0, 0], [1.5, 0, 0, 1, 0, 0, 0]])
    rod = np.diag([1e-3, 1 / 12, 1 / 12])
    joints = [
        rbjax.Revolute.at(q0, rbjax.GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0]),
        rbjax.Spherical.at(q0, 0, 1, point=[1, 0, 0]),
    ]
    model = rbjax.Model(
        [rbjax.Body(1.0, rod), rbjax.Body(1.0, rod)], joints=joints, gravity=[0, 0, -9.81]
    )
    model = eqx.tree_at(
        lambda m: m.mass, model, jnp.stack([jnp.linspace(1.0, 2.0, B), jnp.ones(B)], axis=-1)
    )
    v, w = np.zeros((2, 3)), np.zeros((2, 3))
    v[1, 1], w[1, 2] = 0.3, 0.6  # out of plane about the ball joint: the bob swings in 3D
    state = rbjax.make_state(position=q0[:, :3], quaternion=q0[:, 3:], velocity=v, omega_body=w)
    return model, jax.tree.map(lambda x: jnp.broadcast_to(x, (B,) + x.shape), state)


def test_batch_chunking_does_not_change_results():
    model, state = _pendulum(B=37)  # 37 = 2 pieces of 16 + a padded piece
    kw = dict(save_every=50)
    chunked = rbjax.rollout(model, state, 1e-3, 100, batch_chunk=16, **kw)
    whole = rbjax.rollout(model, state, 1e-3, 100, batch_chunk=0, **kw)
    assert chunked.q.shape == whole.q.shape == (37, 3, 2, 7)
    assert_close(chunked.q, whole.q, rtol=0, atol=1e-15)
    # the batched masses reached the right members: different masses, different motions
    assert float(jnp.max(jnp.abs(chunked.q[0, -1] - chunked.q[-1, -1]))) > 1e-3
    assert np.all(np.asarray(chunked.result) == 0) and np.all(np.asarray(chunked.failed_step) == -1)


def test_batch_chunk_validation():
    model, state = _pendulum(B=4)
    with pytest.raises(ValueError, match="batch_chunk = -1"):
        rbjax.rollout(model, state, 1e-3, 10, batch_chunk=-1)
