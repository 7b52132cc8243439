"""Bodies: mass and central inertia, validated once at build time (Möller & Glocker 2012, eqs. (62)-(64))."""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._errors import check_finite, check_shape, fail, is_concrete


def validate_mass(field: str, mass) -> None:
    """Every mass (any shape: a batch of models) must be finite and > 0. Checked only on
    concrete values; a mass set by ``equinox.tree_at`` (the batching route) bypasses
    :class:`Body`'s check, so rollouts and the Monte-Carlo runner call this."""
    if not is_concrete(mass):
        return
    m = np.asarray(mass, dtype=float)
    bad = ~(np.isfinite(m) & (m > 0.0))
    if np.any(bad):
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        fail(
            f"{field}[{', '.join(map(str, idx))}]",
            m[idx],
            "is not a positive finite mass",
            "every mass must be > 0 kg (check the value set with equinox.tree_at)",
        )


def validate_inertia(field: str, inertia) -> None:
    """Θ must be symmetric positive definite and satisfy the triangle inequalities.

    The principal moments (I1, I2, I3) of a physical body obey I_i + I_j >= I_k (every mass
    element contributes ρ_j² + ρ_k² to I_i); a violation means the numbers cannot come from
    any mass distribution. Checked only on concrete values (not under jit/vmap tracing).
    """
    check_shape(field, inertia, (3, 3))
    check_finite(field, inertia, "give a finite 3x3 inertia matrix in kg m^2")
    if not is_concrete(inertia):
        return
    arr = np.asarray(inertia, dtype=float).reshape(-1, 3, 3)
    for th in arr:
        scale = max(np.abs(th).max(), 1e-300)
        if not np.allclose(th, th.T, rtol=0.0, atol=1e-12 * scale):
            fail(field, th, "is not symmetric", "pass (Θ + Θᵀ)/2 or check the products of inertia")
        w = np.linalg.eigvalsh(th)
        if w[0] <= 0.0:
            fail(
                field,
                th,
                f"is not positive definite (principal moments {w})",
                "every principal moment of inertia must be > 0",
            )
        tol = 1e-12 * w.sum()
        if w[0] + w[1] < w[2] - tol:
            fail(
                field,
                th,
                f"violates the triangle inequality I1 + I2 >= I3 (principal moments {w})",
                "no mass distribution has these moments; check units and axes",
            )


class Body(eqx.Module):
    """One body: mass ``m`` [kg] and inertia Θ about its centre of mass in body axes [kg m²].

    ``scalable=True`` declares a Möller–Glocker scalable body (Möller & Glocker 2012 §4–6): three
    translations, three rotations and one uniform scaling, with no unit-length constraint. A
    rigid body (the default) is the same body plus the perfect constraint |A|² = 1 (eq. (77)).
    """

    mass: Float[Array, ""]
    inertia: Float[Array, "3 3"]
    scalable: bool = eqx.field(static=True, default=False)
    name: str = eqx.field(static=True, default="body")

    def __init__(self, mass, inertia, *, scalable: bool = False, name: str = "body"):
        if is_concrete(mass):
            m = np.asarray(mass, dtype=float)
            if m.shape != ():
                fail(f"{name}.mass", mass, "is not a scalar", "pass one mass per Body")
            if not np.isfinite(m) or m <= 0.0:
                fail(
                    f"{name}.mass",
                    mass,
                    "is not a positive finite number",
                    "mass must be > 0 kg; a fixed, massless support is not a body: attach joints "
                    "to rbjax.GROUND instead",
                )
        inertia = jnp.asarray(inertia)
        if not jnp.issubdtype(inertia.dtype, jnp.floating):  # [1, 2, 3]: not an integer model
            inertia = inertia.astype(jnp.result_type(float))  # JAX's default float
        if inertia.shape == (3,):
            inertia = jnp.diag(inertia)
        check_shape(f"{name}.inertia", inertia, (3, 3))
        if inertia.shape != (3, 3):  # (3, 3, 3) would silently become a batch of bodies
            fail(
                f"{name}.inertia",
                f"<array of shape {inertia.shape}>",
                "is not ONE inertia: (3, 3), or (3,) for the principal moments",
                "pass one body's inertia; batch models with equinox.tree_at on model.inertia "
                "or jax.vmap",
            )
        validate_inertia(f"{name}.inertia", inertia)
        self.mass = jnp.asarray(mass, dtype=inertia.dtype)
        self.inertia = inertia
        self.scalable = bool(scalable)
        self.name = str(name)
