"""Component-first kernels: the arithmetic every layer of rbjax is built from.

A *component-first* (``cf``) array keeps its small physical axis (3 for a vector, 4 for a
quaternion, 3x3 for a matrix) in FRONT and any batch / body axes BEHIND it: a quaternion is
``a[0..3]`` with each ``a[k]`` of shape ``(...)``. Every kernel here is written with scalar
arithmetic on those components only (no ``dot_general``, no gathers), so it

* broadcasts over any trailing axes (bodies, Monte-Carlo batch) for free,
* is valid for NON-unit quaternions exactly where Möller & Glocker 2012 is,
* keeps large batches in structure-of-arrays form in memory.

Why this layout: on a 2-core CPU, RK4 of the torque-free body runs at ~30 M body-steps/s
(B = 1024) and ~45 M (B = 8192) with component-first state, against ~8.5 M and ~11 M when the
same kernels see batch-first ``(B, 7)`` arrays (vmapped or broadcast) -- the interleaved
stack/concat on the minor axis, not the arithmetic, dominates (measured while designing;
see ``benchmarks/free_body.py`` for the maintained numbers).

Kernels read their inputs' components through :func:`comps` (one ``unstack``), not by
indexing ``a[k]``: in reverse mode each ``a[k]`` transposes to a zero-padded copy of the whole
array (``pad``) plus a sum, one per component, and those padded arrays split XLA's fusions.
With :func:`comps` the gradient of one RK4 step of the free body (B = 256) went from 248 pads
in 194 fusions and 1.13 ms to no pads in 94 fusions and 0.14 ms; the forward step is unchanged
(its slices were fused anyway).

The public quaternion API (:mod:`rbjax.quaternion`) takes the conventional ``(..., 4)`` layout
and moves the axis at its boundary; the engine keeps state component-first inside its loops.

Conventions: quaternions scalar-first ``(a0, a1, a2, a3) = (a0, a)`` (Möller & Glocker 2012, eq. (1));
the 3x3 matrix ``m`` is indexed ``m[i][j]`` = row i, column j.
"""

from __future__ import annotations

import jax.numpy as jnp


def comps(a):
    """The components a[0], a[1], ... of a component-first array, as ONE ``unstack``: its
    transpose in reverse mode is one ``stack`` of the cotangents, where separate ``a[k]``
    indexing would transpose to one zero-padded full-size array per component (``pad``) and
    their sum. Tuples/lists of components pass through."""
    if isinstance(a, (tuple, list)):
        return tuple(a)
    return tuple(jnp.unstack(a, axis=0))


def stack(*comps):
    """Stack components along a new leading axis (broadcasting them to a common shape)."""
    comps = jnp.broadcast_arrays(*comps)
    return jnp.stack(comps, axis=0)


# --------------------------------------------------------------------------- vectors


def dot3(a, b):
    a, b = comps(a), comps(b)
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def cross(a, b):
    """a x b; equals ``tilde(a) @ b`` (Möller & Glocker 2012, below eq. (5))."""
    a, b = comps(a), comps(b)
    return stack(
        a[1] * b[2] - a[2] * b[1],
        a[2] * b[0] - a[0] * b[2],
        a[0] * b[1] - a[1] * b[0],
    )


def matvec(m, x):
    """m @ x for a component-first 3x3 matrix ``m`` (shape (3, 3, ...))."""
    m = [comps(row) for row in comps(m)]
    x = comps(x)
    return stack(*(m[i][0] * x[0] + m[i][1] * x[1] + m[i][2] * x[2] for i in range(3)))


def matvec_cols(m, x):
    """m @ x like :func:`matvec`, as three column-times-component products over the whole row
    axis, ``m[:, 0] x[0] + m[:, 1] x[1] + m[:, 2] x[2]``: the same elementwise arithmetic and
    fusion, but about 17 operations to trace instead of about 80. The joints' world points and
    axes (rbjax/_constraints.py) use it: they are evaluated in every jvp of the frame route,
    and with it one RK4 step of the slider-crank has 12.8 k instead of 22.3 k operations
    (reverse mode: 16.8 k instead of 23.4 k, traced in 10 s instead of 15 s) at equal run
    time (double pendulum and slider-crank, B = 1 to 1024, benchmarks/mechanisms.py cases). Replacing :func:`matvec`, :func:`dot3` and :func:`cross` everywhere by
    such vectorised forms (or by reductions over the component axis) was measured too: it
    halved the free body's throughput, so the scalar forms stay the default."""
    m, x = jnp.asarray(m), jnp.asarray(x)
    nm, nx = m.ndim - 2, x.ndim - 1
    if nm < nx:  # right-align the trailing axes, as the components would broadcast
        m = m.reshape(m.shape[:2] + (1,) * (nx - nm) + m.shape[2:])
    elif nx < nm:
        x = x.reshape(x.shape[:1] + (1,) * (nm - nx) + x.shape[1:])
    mc, xc = jnp.unstack(m, axis=1), comps(x)
    return mc[0] * xc[0] + mc[1] * xc[1] + mc[2] * xc[2]


def sym_inv(m):
    """Inverse of a symmetric 3x3 matrix by its adjugate (component-first, elementwise).

    Used for Θ⁻¹: cheaper and more batch-friendly than a batched LU for 3x3 blocks, and exact
    in exact arithmetic; inertias are validated positive definite at build time.
    """
    m = [comps(row) for row in comps(m)]
    a, b, c = m[0][0], m[0][1], m[0][2]
    d, e = m[1][1], m[1][2]
    f = m[2][2]
    c00 = d * f - e * e
    c01 = c * e - b * f
    c02 = b * e - c * d
    c11 = a * f - c * c
    c12 = b * c - a * e
    c22 = a * d - b * b
    det = a * c00 + b * c01 + c * c02
    r = 1.0 / det
    return stack(
        stack(c00 * r, c01 * r, c02 * r),
        stack(c01 * r, c11 * r, c12 * r),
        stack(c02 * r, c12 * r, c22 * r),
    )


# ----------------------------------------------------------------------- quaternions


def qmul(a, b):
    """Quaternion product AB (Möller & Glocker 2012, eq. (5))."""
    a0, a1, a2, a3 = comps(a)
    b0, b1, b2, b3 = comps(b)
    return stack(
        a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
        a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
        a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
        a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0,
    )


def qconj(a):
    """A* = (a0, -a) (Möller & Glocker 2012, eq. (2))."""
    a = comps(a)
    return stack(a[0], -a[1], -a[2], -a[3])


def qnorm2(a):
    """|A|^2 = s, the scaling factor (Möller & Glocker 2012, eqs. (7), (23))."""
    a = comps(a)
    return a[0] * a[0] + a[1] * a[1] + a[2] * a[2] + a[3] * a[3]


def qdot4(a, b):
    """Euclidean inner product psi(A).psi(B) (Möller & Glocker 2012, eq. (14))."""
    a, b = comps(a), comps(b)
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]


def transform(a, x):
    """y = s R x, the imaginary part of A (0, x) A* (Möller & Glocker 2012, eqs. (22)-(24), (27)).

    Written out as y = (a0^2 - a.a) x + 2 (a.x) a + 2 a0 (a x x), which is eq. (22)
    expanded with Lagrange's formula (26). Valid for any quaternion.
    """
    a0, a1, a2, a3 = comps(a)
    v = (a1, a2, a3)
    x = comps(x)
    c = a0 * a0 - dot3(v, v)
    ax = dot3(v, x)
    axx = (a2 * x[2] - a3 * x[1], a3 * x[0] - a1 * x[2], a1 * x[1] - a2 * x[0])  # a × x
    return stack(*(c * x[k] + 2.0 * ax * v[k] + 2.0 * a0 * axx[k] for k in range(3)))


def transform_t(a, y):
    """x = s R^T y, the imaginary part of A* (0, y) A."""
    return transform(qconj(a), y)


def rotate(a, x):
    """R x with R from eq. (23): the pure rotation of A, whatever its length."""
    return transform(a, x) / qnorm2(a)


def rotate_t(a, y):
    """R^T y (world -> body frame for a rigid body)."""
    return transform_t(a, y) / qnorm2(a)


def transform_matrix(a):
    """s R = E(p) G(p)^T as a component-first 3x3 matrix (Möller & Glocker 2012 eq. (22); Negrut ME751 A = E G^T)."""
    a0, a1, a2, a3 = comps(a)
    return stack(
        stack(
            a0 * a0 + a1 * a1 - a2 * a2 - a3 * a3, 2 * (a1 * a2 - a0 * a3), 2 * (a1 * a3 + a0 * a2)
        ),
        stack(
            2 * (a1 * a2 + a0 * a3), a0 * a0 - a1 * a1 + a2 * a2 - a3 * a3, 2 * (a2 * a3 - a0 * a1)
        ),
        stack(
            2 * (a1 * a3 - a0 * a2), 2 * (a2 * a3 + a0 * a1), a0 * a0 - a1 * a1 - a2 * a2 + a3 * a3
        ),
    )


def kin_qdot(a, nu, omega):
    """Ȧ = A (ν, ω) / (2 |A|^2): scalable-body kinematics (Möller & Glocker 2012, eqs. (37), (84)-(85), (93))."""
    w = comps(omega)
    return qmul(a, (nu, w[0], w[1], w[2])) / (2.0 * qnorm2(a))
