"""The checks every mechanism rollout runs before its first step: the initial state satisfies
the joints' position and velocity equations, and the joint equations are independent where
the formulation needs a regular Schur complement."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer

from .._dynamics import UdwadiaSchutte
from .._engine.joints import joint_terms
from .._engine.layout import to_components
from .._engine.projection import norm_rows
from .._errors import is_concrete
from .._oneshot import one_shot_jit
from .._state import State
from .mobility import _dense_jacobian, _mobility


@one_shot_jit
def _consistency(model, state):
    """Residuals and velocity residuals of every batch member, and the W blocks of the first
    (one compiled function: these checks run before every rollout's first call)."""
    t, q, u = to_components(state)
    terms = joint_terms(
        model, model.formulation._engine_kinematics, t, q, u, cdot=True, gamma=False
    )
    first = [tuple(w.reshape(w.shape[:2] + (-1,))[..., 0] for w in pair) for pair in terms.W]
    return norm_rows(model, terms.c), norm_rows(model, terms.cdot), first


def check_mechanism_state(model, state: State, *, tol: float | None = None) -> None:
    """Build-time checks of a mechanism's initial state (skipped when the state, the joints or
    the formulation are traced, e.g. under ``jax.grad`` with respect to a joint point).

    * the joints hold (|Φ| ≤ tol) and their velocity equations hold (|W u + Φ_t| ≤ tol),
      otherwise ValueError naming the joints and suggesting :func:`rbjax.assemble`;
    * the joint equations are independent when the formulation needs a regular Schur
      complement (ScalableDAE, NewtonEuler), otherwise ValueError naming the redundant joints
      and suggesting ``UdwadiaSchutte`` (Moore–Penrose inverse) or removing equations.
    """
    # Only what the checks read must be concrete: the state and the joints (and the
    # formulation's kinematics). A traced mass or force (e.g. under jax.grad in an
    # identification) does not prevent them.
    if not model.joints or not is_concrete((state, model.joints, model.formulation)):
        return
    # the checks never read masses, inertias, gravity or forces: stand-ins for traced ones
    model = jax.tree.map(
        lambda x: np.zeros(x.shape, x.dtype) if isinstance(x, Tracer) else x, model
    )
    if tol is None:
        tol = 1e-8 if state.q.dtype == jnp.float64 else 1e-3
    # evaluated now even when called inside an outer jit/grad trace (the inputs are concrete)
    with jax.ensure_compile_time_eval():
        c, cd, first_w = _consistency(model, state)
    for what, val, fix in (
        ("position", c, "rbjax.assemble(model, state)"),
        ("velocity", cd, "rbjax.assemble(model, state) (it also projects the velocities)"),
    ):
        val = np.asarray(val).reshape(len(model.joints), -1).max(axis=1)
        bad = [(n, e) for n, e in zip(model.joint_names, val, strict=True) if not e <= tol]
        if bad:
            worst = ", ".join(f"'{n}' ({e:.3g})" for n, e in bad)
            raise ValueError(
                f"The initial state violates the {what} equations of joints {worst} "
                f"(tolerance {tol:.1g}). Fix: make the state consistent with {fix}; to "
                "continue a rollout, pass its Trajectory as the initial state (rollout accepts "
                "the drift its integrator left)."
            )
    if isinstance(model.formulation, UdwadiaSchutte):
        return
    with jax.ensure_compile_time_eval():
        mob = _mobility(model, _dense_jacobian(model, first_w), 1e-9)
    if mob.redundant:
        raise ValueError(
            f"The joint equations are redundant (rank {mob.rank} < {mob.rows} rows); joints "
            f"involved: {list(mob.redundant)}. {type(model.formulation).__name__} needs "
            "independent equations (a regular Schur complement). Fix: use "
            "formulation=rbjax.UdwadiaSchutte(), which handles redundant constraints with the "
            "Moore–Penrose inverse, or replace a joint by one with fewer equations (e.g. a "
            "Revolute in a planar loop by a Spherical or Universal joint)."
        )
