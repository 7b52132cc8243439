"""``rbjax check MODEL``: load a model and test what can be tested before integrating it.

Reported: the bodies (total mass) and joints by type; the degrees of freedom and the rank of
the joint equations (rbjax.mobility, from the SVD of the constraint Jacobian); the redundant
(dependent) equations, by joint and row; the largest position and velocity residual of every joint
at the initial state (|Φ| and |W u + Φ_t|); the kinetic, potential and total energy of the
initial state; and the initial accelerations (finite and their size). A check FAILS when:

* the initial state violates a joint by more than ``--tol`` (fix: rbjax.assemble);
* the accelerations or multipliers at the initial state are not finite (a singular mass
  matrix or a degenerate joint);
* a trial integration (``--steps`` RK4 steps of the file's timestep or ``--dt``) turns
  non-finite, or leaves a joint residual above ``--drift`` (fix: a smaller step).

Redundant joint equations are reported, not failed: every formulation runs them (minimum-norm
multipliers, rbjax/_engine/rank.py).

On joint coordinates (an MJCF/URDF tree, rbjax/_cli/joint.py) there are no joint equations
to violate: reported are the degrees of freedom nv (and nq), the equalities held, what the
loader does not simulate, the energies and the accelerations at the initial state, and the
trial's energy change and quaternion length drift.

Exit code 0 when every check passes, 1 when one fails (listed with its fix), 2 when the model
cannot be loaded.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys

import equinox as eqx
import numpy as np

from .._analysis.checks import _consistency
from .._analysis.invariants import kinetic_energy, potential_energy
from .._analysis.mobility import mobility
from .._dynamics import accelerations
from .._results import RESULTS
from .._rollout import rollout
from . import joint, quantities
from .arguments import integer, real
from .common import CliError, add_coordinates, add_meshes, load_model, print_check

MAX_TRIAL = 10**5  # steps of the trial integration, which saves every step: a check, not a run


def add_parser(sub):
    p = sub.add_parser(
        "check",
        help="degrees of freedom, redundant joints, assembly residual and energy of a model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model", metavar="MODEL", help="MJCF (.xml), URDF (.urdf) or rbjax model file (.toml)"
    )
    p.add_argument(
        "--tol",
        type=real("--tol", "a positive residual", "1e-8", positive=True),
        default=1e-8,
        help="largest joint residual accepted (> 0; default 1e-8)",
    )
    p.add_argument(
        "--steps",
        type=integer("--steps", "100", minimum=0, maximum=MAX_TRIAL),
        default=100,
        help=f"RK4 steps of the trial integration (0: none; at most {MAX_TRIAL}; default 100)",
    )
    p.add_argument(
        "--dt",
        type=real("--dt", "a positive number of seconds", "1e-3", positive=True),
        default=None,
        help="trial step [s] (default: the file's, else 1e-3)",
    )
    p.add_argument(
        "--drift",
        type=real("--drift", "a positive residual", "1e-6", positive=True),
        default=1e-6,
        help="largest joint residual accepted after the trial (> 0; default 1e-6)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    add_coordinates(p)
    add_meshes(p)
    p.set_defaults(run=run)


def _merged(model) -> dict:
    """{welded body: the body it was merged into, or "ground"} (rbjax.Model's merge)."""
    m = model.merged
    if m is None:
        return {}
    return {
        name: "ground" if m.carrier[b] < 0 else model.names[m.carrier[b]]
        for b, name in enumerate(m.names)
        if name in m.merged
    }


def report(model, state, tol: float, dt: float, steps: int, drift: float, coords=None) -> dict:
    """The checks as a dict (``failures``: a list of (what, fix) strings)."""
    out: dict = {
        "bodies": list(model.names),
        "total_mass": float(np.sum(np.asarray(model.mass))),
        "joints": dict(collections.Counter(type(j).__name__ for j in model.joints)),
        "merged": _merged(model),
        "formulation": type(model.formulation).__name__,
        "gravity": np.asarray(model.gravity).tolist(),
        "kinetic_energy": float(kinetic_energy(model, state)),
        "potential_energy": float(potential_energy(model, state)),
    }
    out["total_energy"] = out["kinetic_energy"] + out["potential_energy"]
    failures = []
    coords = quantities.Layout() if coords is None else coords
    js = coords.joint_space(model)
    if js is not None:
        out["coordinates"] = {
            "nq": js.nq,
            "nv": js.nv,
            "loops": list(js.loops),
            "kind": coords.kind,  # "mujoco": the file's qpos/qvel; "rbjax": JointSpace(model)
        }
    if model.joints:
        mob = mobility(model, state)
        out |= {
            "dof": mob.dof,
            "rank": mob.rank,
            "rows": mob.rows,
            "redundant": list(mob.redundant),
        }
        c, cd, _ = _consistency(model, state)
        residual = {
            n: (float(a), float(b))
            for n, a, b in zip(model.joint_names, np.asarray(c), np.asarray(cd), strict=True)
        }
        out["residual"] = {n: {"position": a, "velocity": b} for n, (a, b) in residual.items()}
        bad = [f"'{n}' ({max(a, b):.3g})" for n, (a, b) in residual.items() if not max(a, b) <= tol]
        if bad:
            failures.append(
                f"the initial state violates joints {', '.join(bad)} (tolerance {tol:g}). Fix: "
                "put it on the joints with rbjax.assemble(model, state), or correct the "
                "joints' points and axes."
            )
    else:
        out["dof"] = mobility(model, state).dof  # 6 per rigid body, 7 per scalable one
    udot, lam = eqx.filter_jit(accelerations)(model, state)  # op by op it takes 6x longer
    udot, lam = np.asarray(udot), np.asarray(lam)
    out["max_acceleration"] = float(np.max(np.abs(udot))) if udot.size else 0.0
    if not (np.all(np.isfinite(udot)) and np.all(np.isfinite(lam))):
        failures.append(
            "the accelerations at the initial state are not finite (a singular mass matrix or "
            "degenerate joint). Fix: check the bodies' masses and inertias and the joints' axes."
        )
    if steps and not failures:
        out["trial"] = _trial(model, state, dt, steps, drift, failures)
    out["failures"] = failures
    return out


def _trial(model, state, dt, steps, drift, failures) -> dict:
    """``steps`` RK4 steps of ``dt``: finite, the joints still held, the energy change."""
    traj = rollout(model, state, dt, steps, throw=False)
    out = {"dt": dt, "steps": steps, "finite": int(traj.result) == 0}
    if not out["finite"]:
        failures.append(
            f"the trial integration failed at step {int(traj.failed_step)} of {steps} "
            f"(dt = {dt:g} s): {RESULTS(int(traj.result)).message}. Fix: a smaller step "
            "(--dt), or check masses, inertias and spring stiffnesses."
        )
        return out
    final = traj.final
    e0 = float(kinetic_energy(model, state) + potential_energy(model, state))
    out["energy_change"] = float(kinetic_energy(model, final) + potential_energy(model, final)) - e0
    if model.joints:
        c, _, _ = _consistency(model, final)
        out["residual"] = float(np.max(np.asarray(c)))
        if not out["residual"] <= drift:
            failures.append(
                f"after {steps} steps of {dt:g} s the joints drifted to |Phi| = "
                f"{out['residual']:.3g} > {drift:g}. Fix: a smaller step (--dt), or the "
                "Projected integrator for long runs."
            )
    return out


def run(args) -> int:
    loaded = load_model(args.model, meshes=args.meshes, coordinates=args.coordinates)
    if loaded.state is None:
        raise CliError(
            f"MODEL {args.model!r} has no initial state to check. Fix: add an [initial] table "
            "to the model file."
        )
    dt = args.dt if args.dt is not None else (loaded.timestep or 1e-3)
    if not (dt > 0 and np.isfinite(dt)):
        raise CliError(f"--dt {dt!r} is not a positive step. Fix: e.g. --dt 1e-3.")
    if loaded.coordinates == "joint":  # rbjax/_cli/joint.py
        rep = joint.check_report(loaded, dt, args.steps)
    else:
        coords = quantities.layout(loaded)
        rep = report(loaded.model, loaded.state, args.tol, dt, args.steps, args.drift, coords)
    rep["model"] = args.model
    if args.json:
        json.dump(rep, sys.stdout, indent=2)
        print()
    else:
        print_check(rep)
    return 1 if rep["failures"] else 0
