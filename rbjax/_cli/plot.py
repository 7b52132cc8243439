"""``rbjax plot RUN``: draw quantities of a run file (runfile.py) against time into a PNG.

Quantities (``--quantity``, repeatable, one panel each; default ``qpos`` and ``energy``):

* ``qpos`` / ``qvel``: joint coordinates and velocities (angles in rad, slides in m); a run
  in joint coordinates draws qpos grouped by joint type (hinges, slides, balls, free joints),
  hinge angles unwrapped;
* ``positions``: the bodies' centres of mass x, y, z [m];
* (``residual`` and ``reactions`` need a run in maximal coordinates);
* ``energy``: kinetic, potential and total energy [J];
* ``invariants``: the change of total energy E − E(0) [J] (conserved without dissipation or
  work of applied forces and drivers);
* ``momentum``: the change of linear momentum [kg m/s] and of angular momentum about the
  origin [kg m²/s], world frame (conserved without external forces and gravity);
* ``residual``: the largest joint residuals |Φ| and |W u + Φ_t| (log scale): the drift;
* ``reactions``: the magnitude of each joint's force [N] and torque [N m] on its body j.

``--select a,b`` keeps the series whose name contains one of the strings (joint or body
names). A batch run draws ``--sample I``, or with ``--samples K`` the first K samples in thin
lines (energy and invariants: the total only).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from . import runfile
from .arguments import integer
from .common import CliError, output_path, pyplot, writing

QUANTITIES = (
    "qpos",
    "qvel",
    "positions",
    "energy",
    "invariants",
    "momentum",
    "residual",
    "reactions",
)
NEEDS = {  # the arrays each panel draws (qpos, qvel, residual, reactions say more when missing)
    "energy": ("kinetic_energy", "potential_energy", "total_energy"),
    "invariants": ("total_energy",),
    "momentum": ("linear_momentum", "angular_momentum"),
}
MAX_PIXELS = 10**8  # 400 MB of RGBA: a larger image is a mistyped --dpi


def add_parser(sub):
    p = sub.add_parser(
        "plot",
        help="draw joint angles, energies, invariants, residuals or reactions of a run (PNG)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run_file", metavar="RUN", help="run file written by 'rbjax simulate'")
    p.add_argument(
        "--quantity", "-q", action="append", choices=QUANTITIES, help="panel to draw (repeatable)"
    )
    p.add_argument("--select", default=None, metavar="NAMES", help="comma-separated name filters")
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--sample",
        type=integer("--sample", "0", minimum=0),
        default=None,
        help="the sample of a batch run to draw",
    )
    g.add_argument(
        "--samples",
        type=integer("--samples", "10"),
        default=None,
        metavar="K",
        help="draw the first K samples",
    )
    p.add_argument("--out", default="run.png", help="PNG to write (default run.png)")
    p.add_argument(
        "--dpi",
        type=integer("--dpi", "120", minimum=10, maximum=2000),
        default=120,
        help="resolution, 10 to 2000 (default 120)",
    )
    p.set_defaults(run=run)


def _series(run, quantity, select):
    """[(label, values (..., T), unit)] of one panel, values with the run's sample axis."""

    def keep(name):
        return not select or any(s in name for s in select)

    out = []
    missing = [k for k in NEEDS.get(quantity, ()) if k not in run]
    if missing:
        raise CliError(
            f"--quantity {quantity}: the run file has no {', '.join(missing)}. Fix: plot "
            "another quantity, or write the run with 'rbjax simulate'."
        )
    if quantity in ("qpos", "qvel"):
        if quantity not in run:
            raise CliError(
                f"--quantity {quantity}: the run has no joint coordinates (scalable bodies). "
                "Fix: plot positions, energy, invariants or residual."
            )
        names = run.names(f"{quantity}_names") or _numbered(quantity, run[quantity].shape[-1])
        out = [(n, run[quantity][..., i], "") for i, n in enumerate(names) if keep(n)]
        if quantity == "qpos" and "qpos_kinds" in run:
            out = _grouped(run, names, keep)
    elif quantity == "positions":
        com = run["xipos"] if run.joint else run["q"]  # centres of mass, (..., T, nb, 3 or 7)
        bodies = run.names("body_names") or _numbered("body", com.shape[-2])
        for b, name in enumerate(bodies):
            if keep(name):
                out += [(f"{name}.{c}", com[..., b, k], "m") for k, c in enumerate("xyz")]
    elif quantity == "energy":
        out = [
            ("kinetic", run["kinetic_energy"], "J"),
            ("potential", run["potential_energy"], "J"),
            ("total", run["total_energy"], "J"),
        ]
    elif quantity == "invariants":
        e = run["total_energy"]
        out = [("E - E(0)", e - e[..., :1], "J")]
    elif quantity == "momentum":
        for key, label in (("linear_momentum", "p"), ("angular_momentum", "L")):
            v = run[key]
            out += [
                (f"{label}{c} - {label}{c}(0)", v[..., k] - v[..., :1, k], "")
                for k, c in enumerate("xyz")
            ]
    elif quantity in ("residual", "reactions") and run.joint:
        raise CliError(
            f"--quantity {quantity}: the run is in joint coordinates, where the joints are the "
            "coordinates (no joint equations to drift, no joint multipliers). Fix: simulate "
            "with --coordinates maximal, or plot qpos, qvel, positions, energy, invariants or "
            "momentum."
        )
    elif quantity == "residual":
        if "position_residual" not in run:
            raise CliError(
                "--quantity residual: the model has no joints. Fix: plot energy or invariants."
            )
        out = [
            ("|Phi|", run["position_residual"], ""),
            ("|W u + Phi_t|", run["velocity_residual"], ""),
        ]
    elif quantity == "reactions":
        if "reaction_force" not in run:
            raise CliError(
                "--quantity reactions: the run has no reactions (no joints, or simulated with "
                "--no-reactions). Fix: simulate again without --no-reactions."
            )
        joints = run.names("joint_names") or _numbered("joint", run["reaction_force"].shape[-2])
        for k, name in enumerate(joints):
            if keep(name):
                out.append(
                    (f"{name} |F|", np.linalg.norm(run["reaction_force"][..., k, :], axis=-1), "N")
                )
                out.append(
                    (
                        f"{name} |T|",
                        np.linalg.norm(run["reaction_torque"][..., k, :], axis=-1),
                        "N m",
                    )
                )
    if not out:
        raise CliError(
            f"--select {','.join(select)!r} matches no series of {quantity}. Fix: use a joint or body name."
        )
    return out


UNITS = {"hinge": "rad", "slide": "m", "ball": "", "free": ""}


def _grouped(run, names, keep):
    """qpos series of a joint-coordinate run grouped by joint type (hinges, slides, then
    ball and free joints' positions and quaternions), each with its unit; hinge angles
    unwrapped (a jump of more than π between saved times is taken as a wrap of ±2π: MuJoCo's
    angles are continuous, so this only changes an angle that was saved wrapped)."""
    kinds = run.names("qpos_kinds")
    q = run["qpos"]
    out = []
    for group in ("hinge", "slide", "ball", "free"):
        for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
            if kind != group or not keep(name):
                continue
            v = np.unwrap(q[..., i], axis=-1) if kind == "hinge" else q[..., i]
            unit = "m" if kind == "free" and name.split(".")[-1] in "xyz" else UNITS[kind]
            out.append((name, v, unit))
    return out


def _numbered(what: str, n: int) -> list[str]:
    """Labels of a run file's series that it does not name: what[0], what[1], ..."""
    return [f"{what}[{i}]" for i in range(n)]


def run(args) -> int:
    output_path(args.out, (".png",), "plot")
    data = runfile.read(args.run_file)
    select = [s for s in (args.select or "").split(",") if s]
    quantities = args.quantity or ["qpos" if "qpos" in data else "positions", "energy"]
    width, height = 8 * args.dpi, round(2.6 * len(quantities) * args.dpi)
    if width * height > MAX_PIXELS:
        raise CliError(
            f"--dpi {args.dpi} draws {len(quantities)} panel(s) as a {width} x {height} pixel "
            f"image, more than {MAX_PIXELS:.0e} pixels. Fix: a lower --dpi, e.g. --dpi 120."
        )
    t = data["t"]
    if data.batch:
        if args.samples is not None:
            if not 1 <= args.samples <= data.batch:
                raise CliError(
                    f"--samples {args.samples} is not in 1..{data.batch}. Fix: e.g. --samples 10."
                )
            pick = slice(0, args.samples)
        else:
            i = 0 if args.sample is None else args.sample
            if not 0 <= i < data.batch:
                raise CliError(
                    f"--sample {i} is not in 0..{data.batch - 1} (the run has {data.batch} samples). Fix: e.g. --sample 0."
                )
            pick = i
    else:
        if args.sample not in (None, 0) or args.samples not in (None, 1):
            raise CliError(
                "--sample/--samples: the run is a single simulation. Fix: leave them out."
            )
        pick = None
    if data.batch is None:
        failed = runfile.failures(data, None)
    else:
        picked = range(data.batch)[pick] if isinstance(pick, slice) else [pick]
        failed = runfile.failures(data, picked)
    if failed:
        print(f"warning: {args.run_file}: {failed}", file=sys.stderr)
    plt = pyplot()
    fig, axes = plt.subplots(
        len(quantities), 1, figsize=(8, 2.6 * len(quantities)), sharex=True, squeeze=False
    )
    many = isinstance(pick, slice)
    for ax, quantity in zip(axes[:, 0], quantities, strict=True):
        series = _series(data, quantity, select)
        if many and quantity in ("energy", "invariants"):
            series = series[2:3] if quantity == "energy" else series[:1]
        for k, (label, values, _) in enumerate(series):
            v = values if pick is None else values[pick]
            style = dict(lw=0.6, alpha=0.6) if many else dict(lw=1.2)
            lines = ax.plot(
                t, np.asarray(v).T, color=f"C{k % 10}", **style
            )  # samples share a colour
            lines[0].set_label(label)
        units = {u for _, _, u in series if u}
        ax.set_ylabel(quantity + (f" [{units.pop()}]" if len(units) == 1 else ""))
        if quantity == "residual":
            ax.set_yscale("log")
        if len(series) <= 12:
            ax.legend(fontsize="small", loc="best", ncols=min(4, len(series)))
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("t [s]")
    title = str(data.meta.get("model", ""))
    if data.batch:
        title += f" (sample {pick})" if isinstance(pick, int) else f" ({args.samples} samples)"
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    try:
        with writing(args.out):
            fig.savefig(args.out, dpi=args.dpi)
    finally:
        plt.close(fig)
    print(f"wrote {args.out}")
    return 0
