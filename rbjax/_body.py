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


def definite_rtol(dtype) -> float:
    """Smallest principal moment accepted, relative to the largest: 10³ ε in float64 (2.2e-13)
    and 10 ε in float32 (1.2e-6). A moment below it is zero to rounding: a rotated
    diag(0, 1, 1) has eigenvalues of order ±1e-17 whose sign is chance, and a body with one is
    a point mass or an ideal rod, whose spin about that axis is undetermined (Θ⁻¹ amplifies
    rounding by 1/rtol). A real slender rod (radius 1 mm, length 1 m) has a ratio of 6e-6."""
    eps = float(np.finfo(np.dtype(dtype)).eps) if np.issubdtype(dtype, np.floating) else 2.2e-16
    return max(1e3 * float(np.finfo(np.float64).eps), 10.0 * eps)


def rounding_tol(dtype) -> float:
    """Relative rounding allowed in the symmetry and triangle-inequality checks of an inertia:
    1e-12, or 10 ε of the dtype where that is larger (1.2e-6 in float32, where a flat body's
    exact I1 + I2 = I3 is rounded by the dtype and may read 4e-9 short)."""
    eps = float(np.finfo(np.dtype(dtype)).eps) if np.issubdtype(dtype, np.floating) else 2.2e-16
    return max(1e-12, 10.0 * eps)


def validate_inertia(field: str, inertia) -> None:
    """Θ must be symmetric positive definite and satisfy the triangle inequalities.

    The principal moments (I1, I2, I3) of a physical body obey I_i + I_j >= I_k (every mass
    element contributes ρ_j² + ρ_k² to I_i); a violation means the numbers cannot come from
    any mass distribution. Positive definite means I1 > rtol·I3 (:func:`definite_rtol`), not
    merely I1 > 0: a zero moment rounded to +1e-17 is still zero. Checked on concrete values;
    under jit/vmap/grad the rollout checks the same conditions in its program.
    """
    check_shape(field, inertia, (3, 3))
    check_finite(field, inertia, "give a finite 3x3 inertia matrix in kg m^2")
    if not is_concrete(inertia):
        return
    rtol = definite_rtol(np.asarray(inertia).dtype)
    rounding = rounding_tol(np.asarray(inertia).dtype)
    arr = np.asarray(inertia, dtype=float).reshape(-1, 3, 3)
    lead = np.shape(inertia)[:-2]
    for k, th in enumerate(arr):
        name = field
        if lead:
            name += "[" + ", ".join(str(int(i)) for i in np.unravel_index(k, lead)) + "]"
        scale = max(np.abs(th).max(), 1e-300)
        if not np.allclose(th, th.T, rtol=0.0, atol=rounding * scale):
            fail(name, th, "is not symmetric", "pass (Θ + Θᵀ)/2 or check the products of inertia")
        w = np.linalg.eigvalsh(th)
        if w[0] <= rtol * max(w[2], 0.0) or w[2] <= 0.0:
            fail(
                name,
                th,
                f"is not positive definite (principal moments {w}; the smallest must exceed "
                f"{rtol:.1g} x the largest)",
                "every principal moment of inertia must be > 0; a point mass or an ideal rod "
                "has a zero moment: give it a physical size (a rod of radius r: m r²/2 about "
                "its axis, a sphere of radius r: 2 m r²/5), or weld it to the body that carries "
                "it (rbjax.Body.point_mass and rbjax.Fixed: the Model merges the two)",
            )
        tol = rounding * w.sum()
        if w[0] + w[1] < w[2] - tol:
            fail(
                name,
                th,
                f"violates the triangle inequality I1 + I2 >= I3 (principal moments {w})",
                "no mass distribution has these moments; check units and axes",
            )


def _is_real(x) -> bool:
    """An int or float scalar or array (a bool, a string, a complex number is a mistake)."""
    kind = getattr(x, "dtype", None)
    if kind is None:
        if isinstance(x, (str, bytes, bool)):
            return False
        try:
            kind = np.asarray(x).dtype
        except Exception:  # noqa: BLE001 - not array-like at all
            return False
    return np.issubdtype(kind, np.integer) or np.issubdtype(kind, np.floating)


class Body(eqx.Module):
    """One body: mass ``m`` [kg] and inertia Θ about its centre of mass in body axes [kg m²].

    ``scalable=True`` declares a Möller–Glocker scalable body (Möller & Glocker 2012 §4–6): three
    translations, three rotations and one uniform scaling, with no unit-length constraint. A
    rigid body (the default) is the same body plus the perfect constraint |A|² = 1 (eq. (77)).

    A point mass (zero inertia, :meth:`point_mass`) cannot move on its own (its mass matrix
    is singular) but can be welded: :class:`rbjax.Model` merges it into the body a
    :class:`rbjax.Fixed` joint welds it to (rbjax/_welds.py).
    """

    mass: Float[Array, ""]
    inertia: Float[Array, "3 3"]
    scalable: bool = eqx.field(static=True, default=False)
    name: str = eqx.field(static=True, default="body")
    point: bool = eqx.field(static=True, default=False)

    @classmethod
    def point_mass(cls, mass, *, name: str = "body") -> Body:
        """A point mass ``mass`` [kg] (inertia 0 about its centre of mass): a payload, a bolt,
        a sensor. Weld it with :class:`rbjax.Fixed` to the body that carries it;
        :class:`rbjax.Model` merges it there (parallel-axis theorem)."""
        return cls(mass, np.zeros((3, 3)), name=name, point=True)

    def __init__(
        self, mass, inertia, *, scalable: bool = False, name: str = "body", point: bool = False
    ):
        for field, value in (("mass", mass), ("inertia", inertia)):
            if not _is_real(value):
                fail(
                    f"{name}.{field}",
                    repr(value),
                    "is not a real number or array of them",
                    f"pass the {field} as numbers in SI units"
                    + (" (kg)" if field == "mass" else " (kg m², a (3, 3) or (3,) array)"),
                )
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
        if point:
            if scalable:
                fail(f"{name}.point", True, "is a scalable point mass", "a point mass is rigid")
            if is_concrete(inertia) and np.any(np.asarray(inertia) != 0.0):
                fail(
                    f"{name}.inertia",
                    np.asarray(inertia),
                    "is not zero, and point=True declares a point mass",
                    "use rbjax.Body.point_mass(mass), or drop point=True",
                )
        else:
            validate_inertia(f"{name}.inertia", inertia)
        self.point = bool(point)
        self.mass = jnp.asarray(mass, dtype=inertia.dtype)
        self.inertia = inertia
        self.scalable = bool(scalable)
        self.name = str(name)
