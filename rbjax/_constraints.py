"""The four basic geometric constraints of ME751 (Negrut ME751) with driving functions f(t).

Each constraint relates body i and body j of a system (either may be ``GROUND`` = −1: the
world frame, r = 0, p = (1, 0, 0, 0)). With the orientation matrix A(p) = E(p) G(p)ᵀ of seed
004 (the quaternion transform of Möller & Glocker 2012 eq. (27), which equals R for unit p):

=====  ==========================================  =========================================
name   residual Φ(q_i, q_j, t)                     meaning (f ≡ 0)
=====  ==========================================  =========================================
DP1    āᵢᵀ Aᵢᵀ Aⱼ āⱼ − f(t)                          body vectors āᵢ, āⱼ perpendicular
DP2    āᵢᵀ Aᵢᵀ d_ij − f(t)                           āᵢ perpendicular to the segment P_i Q_j
D      d_ijᵀ d_ij − f(t)                             distance between P_i and Q_j is √f
CD     cᵀ d_ij − f(t)                                coordinate difference along world c is f
=====  ==========================================  =========================================

with d_ij = r_j + A_j s̄_j^Q − r_i − A_i s̄_i^P. Nobody hand-derives a Jacobian: Φ_q comes from
``jax.jacfwd`` and the acceleration right-hand side γ from nested ``jax.jvp`` of the residual
alone (:func:`constraint_jacobian`, :func:`constraint_gamma`), so a user constraint is any JAX
function of (q_i, q_j, t). The ME751 formulas with B(p, s̄) matrices are kept in the tests.
"""

import abc
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from equinox import AbstractVar
from jaxtyping import Array, Float

from . import _quaternion as quat
from ._engine import kernels as cf
from ._errors import check_finite
from ._topology import GROUND


def _zero(t):
    return jnp.zeros_like(t)


class AbstractConstraint(eqx.Module):
    """A residual vector Φ(q_i, q_j, t) = 0 between bodies ``body_i`` and ``body_j``.

    To write a constraint, subclass this and implement :meth:`residual` for ONE system in the
    natural layout: ``q_i``, ``q_j`` are the coordinates (r, p) of shape (7,) of the two bodies
    (``GROUND``: r = 0, p = (1, 0, 0, 0)), ``t`` a scalar time; return Φ of shape (m,). Any
    JAX function will do: the engine takes its Jacobian (jvp) and the acceleration right-hand
    side γ (nested jvp) by automatic differentiation, and evaluates it over batches with
    ``jax.vmap``. Array fields are differentiable parameters. Or pass a plain function to
    :class:`rbjax.CustomConstraint`.

    ``body_i`` / ``body_j`` are static: a body index, a body name (resolved once by
    :class:`rbjax.Model` into its ``topology``) or ``GROUND`` (−1, the world frame).

    The built-in constraints are also written so that the same code broadcasts over trailing
    axes and reads q only through :func:`point` and :func:`axis` (class attribute
    ``_vectorised = True``, which subclasses do not inherit); the engine then evaluates all
    joints of a type at once in its own layout and differentiates them through each body's
    frame (rbjax/_engine/joints.py). That is an engine detail, not part of the interface.
    """

    body_i: AbstractVar[int | str]
    body_j: AbstractVar[int | str]
    name: AbstractVar[str]
    _vectorised: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_vectorised" not in cls.__dict__:  # a fast path is declared, never inherited
            cls._vectorised = False

    @abc.abstractmethod
    def residual(self, q_i, q_j, t) -> Float[Array, " m"]:
        """Φ(q_i, q_j, t) for one system: q_i, q_j (7,), t () -> (m,)."""

    def frame(self):
        """(s̄_i, s̄_j, R̄_i, R̄_j): joint points in body i / body j axes and the joint frames
        (columns x̄, ȳ, z̄) in which reactions are reported; defaults to the body frames."""
        z = jnp.zeros(3)
        return z, z, jnp.eye(3), jnp.eye(3)


def _vec(name, x):
    if np.shape(x) != (3,):
        raise ValueError(
            f"{name} has shape {np.shape(x)}, expected (3,). Fix: pass one 3-vector in body axes."
        )
    check_finite(name, x, "give a finite 3-vector")
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def _check_f(name, f):
    if not callable(f):
        raise ValueError(
            f"{name}.f = {f!r} is not callable. Fix: pass a driving function f(t), e.g. lambda t: 0.5 * t."
        )
    return f


class Frame(NamedTuple):
    """A body's placement as world position r (3, ...) and transform A = E(p)G(p)ᵀ (3, 3, ...).

    The built-in constraints are written through :func:`point` and :func:`axis`, so they accept
    either the coordinates q (7, ...) or a Frame. The engine differentiates them with respect to
    the Frame (chain rule through A(p) done once per body instead of once per joint row; see
    rbjax/_engine/joints.py); the residual, its Jacobian and γ are the same functions of q.
    """

    r: Array
    T: Array


def point(q, s):
    """World position r + A s̄ of the body point s̄ (component-first; A s̄ = E(p)G(p)ᵀ s̄)."""
    if isinstance(q, Frame):
        return q.r + cf.matvec_cols(q.T, s)
    return q[0:3] + cf.transform(q[3:7], s)


def axis(q, a):
    """World direction A ā of the body vector ā (component-first)."""
    if isinstance(q, Frame):
        return cf.matvec_cols(q.T, a)
    return cf.transform(q[3:7], a)


def _points(qi, qj, si, sj):
    """d_ij = r_j + A_j s̄_j − r_i − A_i s̄_i (Negrut ME751)."""
    return point(qj, sj) - point(qi, si)


class DP1(AbstractConstraint):
    """Φ^DP1 = āᵢᵀ Aᵢᵀ Aⱼ āⱼ − f(t) (Negrut ME751): the dot product of two body-fixed vectors."""

    _vectorised: ClassVar[bool] = True
    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    a_i: Float[Array, "3"]
    a_j: Float[Array, "3"]
    f: Callable = _zero

    def __init__(self, body_i, a_i, body_j, a_j, f: Callable = _zero, *, name: str = "DP1"):
        self.body_i, self.body_j, self.name = body_i, body_j, name
        self.a_i, self.a_j = _vec(f"{name}.a_i", a_i), _vec(f"{name}.a_j", a_j)
        self.f = _check_f(name, f)

    def residual(self, qi, qj, t):
        return cf.stack(cf.dot3(axis(qi, self.a_i), axis(qj, self.a_j)) - self.f(t))


class DP2(AbstractConstraint):
    """Φ^DP2 = āᵢᵀ Aᵢᵀ d_ij − f(t) (Negrut ME751)."""

    _vectorised: ClassVar[bool] = True
    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    a_i: Float[Array, "3"]
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    f: Callable = _zero

    def __init__(self, body_i, a_i, s_i, body_j, s_j, f: Callable = _zero, *, name: str = "DP2"):
        self.body_i, self.body_j, self.name = body_i, body_j, name
        self.a_i = _vec(f"{name}.a_i", a_i)
        self.s_i, self.s_j = _vec(f"{name}.s_i", s_i), _vec(f"{name}.s_j", s_j)
        self.f = _check_f(name, f)

    def residual(self, qi, qj, t):
        d = _points(qi, qj, self.s_i, self.s_j)
        return cf.stack(cf.dot3(axis(qi, self.a_i), d) - self.f(t))

    def frame(self):
        return self.s_i, self.s_j, jnp.eye(3), jnp.eye(3)


class D(AbstractConstraint):
    """Φ^D = d_ijᵀ d_ij − f(t) (Negrut ME751): squared distance between two body points."""

    _vectorised: ClassVar[bool] = True
    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    f: Callable = _zero

    def __init__(self, body_i, s_i, body_j, s_j, f: Callable = _zero, *, name: str = "D"):
        self.body_i, self.body_j, self.name = body_i, body_j, name
        self.s_i, self.s_j = _vec(f"{name}.s_i", s_i), _vec(f"{name}.s_j", s_j)
        self.f = _check_f(name, f)

    def residual(self, qi, qj, t):
        d = _points(qi, qj, self.s_i, self.s_j)
        return cf.stack(cf.dot3(d, d) - self.f(t))

    def frame(self):
        return self.s_i, self.s_j, jnp.eye(3), jnp.eye(3)


class CD(AbstractConstraint):
    """Φ^CD = cᵀ d_ij − f(t) (Negrut ME751): a coordinate difference along the world vector c."""

    _vectorised: ClassVar[bool] = True
    body_i: int | str = eqx.field(static=True)
    body_j: int | str = eqx.field(static=True)
    name: str = eqx.field(static=True)

    c: Float[Array, "3"]
    s_i: Float[Array, "3"]
    s_j: Float[Array, "3"]
    f: Callable = _zero

    def __init__(self, c, body_i, s_i, body_j, s_j, f: Callable = _zero, *, name: str = "CD"):
        self.body_i, self.body_j, self.name = body_i, body_j, name
        self.c = _vec(f"{name}.c", c)
        self.s_i, self.s_j = _vec(f"{name}.s_i", s_i), _vec(f"{name}.s_j", s_j)
        self.f = _check_f(name, f)

    def residual(self, qi, qj, t):
        return cf.stack(cf.dot3(self.c, _points(qi, qj, self.s_i, self.s_j)) - self.f(t))

    def frame(self):
        return self.s_i, self.s_j, jnp.eye(3), jnp.eye(3)


def _ground(dtype):
    return jnp.asarray([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], dtype)


def constraint_residual(con: AbstractConstraint, q: Float[Array, "nb 7"], t) -> Float[Array, " m"]:
    """Φ(q, t) of one constraint for ONE system with coordinates q (nb, 7) (integer bodies)."""
    g = _ground(q.dtype)
    for b in (con.body_i, con.body_j):
        if not isinstance(b, (int, np.integer)):
            raise ValueError(
                f"constraint '{con.name}' names body {b!r}; constraint_residual needs integer body "
                "indices. Fix: build an rbjax.Model, which resolves body names."
            )
    qi = g if con.body_i == GROUND else q[con.body_i]
    qj = g if con.body_j == GROUND else q[con.body_j]
    return con.residual(qi, qj, jnp.asarray(t, q.dtype))


def constraint_jacobian(
    con: AbstractConstraint, q: Float[Array, "nb 7"], t
) -> Float[Array, "m nb 7"]:
    """Φ_q = ∂Φ/∂q by ``jax.jacfwd`` (the δp flavour of Negrut ME751: columns per (r_k, p_k))."""
    return jax.jacfwd(lambda qq: constraint_residual(con, qq, t))(q)


def constraint_gamma(
    con: AbstractConstraint, q: Float[Array, "nb 7"], qdot: Float[Array, "nb 7"], t
) -> Float[Array, " m"]:
    """γ = −(Φ_q q̇)_q q̇ − 2 Φ_qt q̇ − Φ_tt, so that Φ_q q̈ = γ (nested jvp, no hand derivation).

    Obtained as −Φ̈ evaluated with q̈ = 0: the second derivative of t ↦ Φ(q + q̇ τ, t + τ) at
    τ = 0 along the straight line, which contains exactly the three terms above.
    """
    t = jnp.asarray(t, q.dtype)

    def along(tau):
        return constraint_residual(con, q + tau * qdot, t + tau)

    def first(tau):
        return jax.jvp(along, (tau,), (jnp.ones_like(tau),))[1]

    zero = jnp.zeros((), q.dtype)
    return -jax.jvp(first, (zero,), (jnp.ones_like(zero),))[1]


def constraint_jacobian_pi(
    con: AbstractConstraint, q: Float[Array, "nb 7"], t
) -> Float[Array, "m nb 6"]:
    """[Φ_r, Φ_π̄]: the Jacobian with respect to virtual translations and body-frame virtual
    rotations δπ̄ (the δπ̄ flavour of Negrut ME751), for unit quaternions.

    A virtual rotation moves p by δp = ½ p (0, δπ̄) = ½ G(p)ᵀ δπ̄, so Φ_π̄ = ½ Φ_p G(p)ᵀ. It is
    obtained by autodiff (one jvp per direction), never from per-constraint formulas.
    """
    t = jnp.asarray(t, q.dtype)
    nb = q.shape[0]
    eye6 = jnp.eye(6, dtype=q.dtype)

    def direction(k, body):
        dr = jnp.zeros((nb, 3), q.dtype).at[body].set(eye6[k, 0:3])
        dpi = jnp.zeros((nb, 3), q.dtype).at[body].set(eye6[k, 3:6])
        zeros = jnp.zeros((nb, 1), q.dtype)
        dp = 0.5 * quat.mul(q[:, 3:7], jnp.concatenate([zeros, dpi], axis=-1))
        return jnp.concatenate([dr, dp], axis=-1)

    cols = [
        [
            jax.jvp(lambda qq: constraint_residual(con, qq, t), (q,), (direction(k, b),))[1]
            for k in range(6)
        ]
        for b in range(nb)
    ]
    return jnp.stack([jnp.stack(c, axis=-1) for c in cols], axis=-2)
