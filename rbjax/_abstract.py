"""The abstract types both formulations share: :class:`AbstractModel`, :class:`AbstractState`
and :class:`AbstractTrajectory` (docs/conventions.md, "Two formulations, one model type").

rbjax has two formulations of the same mechanics. Maximal coordinates (:class:`rbjax.Model`,
:class:`rbjax.State` (t, q, u), :class:`rbjax.Trajectory`) give every body its own seven
coordinates and hold joints by multipliers; joint coordinates (:class:`rbjax.JointModel`,
:class:`rbjax.JointState` (t, qpos, qvel), :class:`rbjax.JointTrajectory`) use MuJoCo's qpos and
qvel of a kinematic tree. The functions that take either (:func:`rbjax.rollout`,
:func:`rbjax.reactions`, the energies and momenta, :func:`rbjax.assemble`,
:func:`rbjax.monte_carlo`, :func:`rbjax.identify`, ...) are annotated with these types and
dispatch on the concrete class; the functions that read bodies' maximal coordinates keep
:class:`rbjax.Model`.

Only what both formulations have, with one meaning, is here (equinox's ``AbstractVar``: a
field, or a property, of every concrete subclass). The coordinates are not: q (nb, 7) holds
each body's centre of mass and unconstrained quaternion (Möller & Glocker 2012, eq. (35)),
qpos (nq,) the joints' displacements, so neither their names, their shapes nor a count
"nq"/"nv" mean the same in both. equinox's abstract/final pattern (docs/devdocs/architecture.md):
the concrete classes are final, and rbjax's functions accept these two formulations only; the
abstract types are what a caller annotates with, and what a function that takes either says.
"""

# No `from __future__ import annotations` here: equinox reads AbstractVar annotations at
# class creation and refuses them as strings.

import abc
from typing import TYPE_CHECKING, Any

import equinox as eqx
from jaxtyping import Array, Float, Int


class AbstractModel(eqx.Module):
    """A mechanism of nb rigid bodies in either formulation: :class:`rbjax.Model` (maximal
    coordinates) or :class:`rbjax.JointModel` (joint coordinates of a tree).

    What both have (equinox ``AbstractVar``; leaves may carry leading batch axes where the
    concrete class allows them):

    - ``mass`` (*batch, nb) [kg] and ``inertia`` (*batch, nb, 3, 3) [kg m²], each body's mass
      and its inertia about its centre of mass in body axes;
    - ``gravity`` (*batch, 3) [m/s²], world frame;
    - ``forces``: the applied forces, a tuple (a Model's :class:`rbjax.AbstractForce` on
      bodies; a JointModel's generalized forces τ(t, qpos, qvel) -> (nv,) of one system);
    - ``baumgarte``: (α, β) or None, the stabilisation c̈ + 2α ċ + β² c = 0 of the
      constraint equations c = 0 (a Model's joints, a JointModel's equalities; Baumgarte
      1972);
    - ``names`` (nb,) and ``nb``: the bodies, in body order; ``joint_names``: the joints, in
      the model's joint order.
    """

    mass: eqx.AbstractVar[Float[Array, "*batch nb"]]
    inertia: eqx.AbstractVar[Float[Array, "*batch nb 3 3"]]
    gravity: eqx.AbstractVar[Float[Array, "*batch 3"]]
    forces: eqx.AbstractVar[tuple[Any, ...]]
    baumgarte: eqx.AbstractVar[tuple[Float[Array, ""], Float[Array, ""]] | None]
    names: eqx.AbstractVar[tuple[str, ...]]
    joint_names: eqx.AbstractVar[tuple[str, ...]]
    nb: eqx.AbstractVar[int]


class AbstractState(eqx.Module):
    """The state of a system of either formulation at time ``t`` (*batch) [s]:
    :class:`rbjax.State` (t, q (*batch, nb, 7), u (*batch, nb, 7)) of a :class:`rbjax.Model`,
    :class:`rbjax.JointState` (t, qpos (*batch, nq), qvel (*batch, nv)) of a
    :class:`rbjax.JointModel` (module docstring: why only ``t`` is common)."""

    t: eqx.AbstractVar[Float[Array, "*batch"]]


class AbstractTrajectory(eqx.Module):
    """The saved states of a rollout of either formulation (:class:`rbjax.Trajectory`,
    :class:`rbjax.JointTrajectory`), the initial one first; T = n_steps // save_every + 1.

    What both have: ``t`` (*batch, T); ``result`` (*batch,) a :class:`rbjax.RESULTS` code per
    system and ``failed_step`` (*batch,) its first failing step, −1 if none; ``lam`` (*batch,
    T, m) the multipliers saved with ``rollout(..., multipliers=True)``, else None;
    ``measures`` and ``monitors`` (dict name -> (*batch, ...)) or None; :attr:`final` the
    state after the last step, and ``trajectory[i]`` the i-th saved state (their
    :class:`AbstractState`)."""

    # The concrete trajectories' __init__ is the dataclass one. Type checkers synthesise it
    # with a base class's annotations first, and they read an AbstractVar as a field (pyright:
    # Trajectory(t, result, failed_step, lam, measures, monitors, q, u) against the real
    # (t, q, u, lam, result, ...)); read-only properties give them the attributes without the
    # wrong signature. At run time these are equinox's AbstractVars, as in AbstractModel.
    if TYPE_CHECKING:

        @property
        def t(self) -> Float[Array, "*batch T"]: ...
        @property
        def result(self) -> Int[Array, "*batch"]: ...
        @property
        def failed_step(self) -> Int[Array, "*batch"]: ...
        @property
        def lam(self) -> Float[Array, "*batch T m"] | None: ...
        @property
        def measures(self) -> dict[str, Array] | None: ...
        @property
        def monitors(self) -> dict[str, Array] | None: ...
    else:
        t: eqx.AbstractVar[Float[Array, "*batch T"]]
        result: eqx.AbstractVar[Int[Array, "*batch"]]
        failed_step: eqx.AbstractVar[Int[Array, "*batch"]]
        lam: eqx.AbstractVar[Float[Array, "*batch T m"] | None]
        measures: eqx.AbstractVar[dict[str, Array] | None]
        monitors: eqx.AbstractVar[dict[str, Array] | None]

    @property
    @abc.abstractmethod
    def final(self) -> AbstractState:
        """The state after the last step."""

    @abc.abstractmethod
    def __getitem__(self, i) -> AbstractState:
        """The i-th saved state of every batch member."""
