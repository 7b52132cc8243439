"""System identification, side by side: ``rbjax.identify`` and MuJoCo's ``mujoco.sysid``.

The same three problems, the same measurements, both tools. Each problem is an MJCF string
holding the TRUE parameters; the data are made once by MuJoCo itself (RK4 with a 1 ms step,
sampled at 100 Hz for 3 s, Gaussian noise from ``numpy.random.default_rng(seed)``) and both
tools fit them from the same deliberately wrong guess:

1. ``pendulum``: a pendulum's mass and hinge damping from its joint encoder (hinge angle,
   σ = 1 mrad). Released at rest from 60°. The body's central inertia is fixed (an explicit
   ``<inertial>``): the mass moves the centre-of-mass term and gravity.
2. ``double_pendulum``: both link masses and the damping of the first hinge from the two
   encoders (σ = 1 mrad each), which read with a common time delay (15 ms) and each its own
   zero offset (20 mrad, −15 mrad), fitted too: 6 unknowns. Released at rest from (70°, −40°).
3. ``tumbling``: a free body tumbling torque-free (no gravity) near its intermediate axis,
   measured by a rate gyro (σ = 0.01 rad/s) with a bias (3 components, fitted). Torque-free
   motion determines the moment RATIOS only (scaling the inertia leaves ω(t) unchanged), so
   I_xx is known and I_yy, I_zz are fitted with the bias: 5 unknowns.

Both tools know the initial state (released at rest; the tumbling body's true rates) and
integrate the same equations with RK4 at the same step ``--dt`` (default 0.01 s, the sample
interval): MuJoCo in joint coordinates through ``mujoco.rollout``, rbjax in its maximal
coordinates. The data come from a 10× finer step, so both fits carry the same (small) RK4
error of their own step. Accuracy is judged against the TRUE values, in units of each tool's
own standard error: z = (estimate − true) / σ (rbjax: ``fit.quantities()``, the
Gauss–Newton covariance in physical units; sysid: ``calculate_intervals``, s² (JᵀJ)⁻¹ with
s² estimated from the residuals).

How each tool is driven:

* rbjax: ``rbjax.load`` of the same MJCF (written to a temporary file); ``build(params)``
  sets the masses (``Model.mass``), the damping (the ``RotationalSpringDamper`` rbjax makes
  of a hinge's ``damping``) or the inertia (``Model.inertia``) with ``equinox.tree_at``;
  masses, damping and moments are ``rbjax.Positive``. Observations ``rbjax.JointEncoder``
  (``offset`` and ``delay`` are keys of the parameters) and ``rbjax.Gyro`` (``bias``).
  ``rbjax.identify`` with its defaults (Levenberg–Marquardt, forward-mode Jacobian, RK4),
  ``max_steps=100``. The ``rbjax joint`` rows (``--coordinates``, default both) fit the same
  problem in joint coordinates: ``rbjax.load(..., formulation=rbjax.JointCoordinates())``,
  build() setting the JointModel's ``mass``, ``damping`` (per DOF) or ``inertia``.
* sysid: ``Parameter`` objects whose modifiers write the MjSpec (``body.mass``,
  ``joint.damping[0]``, ``body.inertia``), ``ModelSequences`` with the measured sensor
  ``TimeSeries`` and the initial state from ``create_initial_state``, and a
  ``modify_residual`` that applies sysid's own ``apply_delay`` and ``apply_bias`` signal
  modifiers, resamples the prediction at the sample times and whitens by σ (the same
  weighting as rbjax). ``optimize(optimizer="mujoco")`` (MuJoCo's box-constrained
  Levenberg–Marquardt with a finite-difference Jacobian, its default), then
  ``calculate_intervals``.

  One correction for sysid, made in that ``modify_residual``: ``sysid_rollout`` labels the
  sensor values returned by ``mujoco.rollout`` with the time AFTER each step, but MuJoCo
  computes sensors in ``mj_forward`` BEFORE the step, so each prediction is stamped one step
  late (a spurious delay of one ``timestep``; checked: the first "sensor" value, stamped t₀ +
  dt, is the initial angle). Against correctly time-stamped data that delay biases every
  parameter; the benchmark shifts the predicted times back by one timestep. sysid's delay
  modifier interpolates linearly on the simulation grid (rbjax: cubic Hermite), an error of
  up to h² |q̈| / 8 (a few tenths of σ at h = 0.01 s here, systematic over every sample)
  that biases the fitted delay and, through it, the masses: on the problem with a delay sysid also runs with the finer step
  ``--sysid-fine-dt`` (default 0.005 s), the comparison at equal accuracy.

  Two more workarounds, for sysid's sake: ``model_residual`` compares the predicted and
  measured signal mappings with ``!=``, which raises for equal numpy index arrays of more
  than one element (the 3-axis gyro), so the prediction is returned with the measured
  mapping object; and ``MjSpec.compile`` raises for a trial inertia that violates the
  triangle inequality (I_xx + I_yy ≥ I_zz), so such a trial point gets NaN residuals, which
  MuJoCo's least squares rejects (it raises its damping).

Reported per problem and tool: estimates, true values, standard errors and z; steps
(iterations of the optimiser); evaluations (rbjax: (r, J) evaluations by forward mode,
``fit.evaluations`` where rbjax reports it, else counted by wrapping its compiled function
as benchmarks/solvers.py does; sysid: rollouts, i.e. residual evaluations, p + 1 of them per
finite-difference Jacobian); wall time of the first call (rbjax: tracing and XLA
compilation included; the MJCF import by ``rbjax.load`` is timed apart) and the median of
``--repeats`` further calls on the same data (rbjax: compiled code reused); compile time =
first call − median further call.
JAX's persistent compilation cache is NOT turned on and ``jax.clear_caches()`` runs before
each problem's first rbjax call: compile times are cold (the problems run in one process).

    python benchmarks/identify.py [--quick] [--repeats 3] [--dt 0.01] [--seed 0]
        [--problems pendulum,double_pendulum,tumbling] [--json benchmarks/results/identify_cpu.json]
    python benchmarks/identify.py --table benchmarks/results/identify_cpu.json

``--quick``: 1.5 s of data and one further call (a smoke test; compiling dominates either
way). ``--table``: the tables of a JSON file written by ``--json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import io
import json
import os
import re
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable

import jax

jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
from free_body import write_records  # noqa: E402

import rbjax  # noqa: E402

try:  # the optional extra mujoco[sysid]; without it `import mujoco.sysid` exports nothing
    from mujoco import sysid
except ImportError:  # pragma: no cover
    sysid = None
HAVE_SYSID = sysid is not None and hasattr(sysid, "optimize")

_identify = importlib.import_module("rbjax._identify.identify")  # the module, not the function

RATE, DT_GEN, MAX_STEPS = 100.0, 1e-3, 100  # Hz, s (data), optimiser steps (both tools)
Z_OK = 3.0  # an estimate is consistent with the truth when every |z| <= this

PENDULUM = """<mujoco model="pendulum">
  <option integrator="RK4" timestep="0.01" gravity="0 0 -9.81"><flag contact="disable"/></option>
  <worldbody>
    <body name="link">
      <joint name="hinge" type="hinge" axis="0 1 0" damping="0.05"/>
      <inertial pos="0 0 -0.3" mass="1.0" diaginertia="0.04 0.04 0.01"/>
    </body>
  </worldbody>
  <sensor><jointpos name="enc" joint="hinge"/></sensor>
</mujoco>"""

DOUBLE_PENDULUM = """<mujoco model="double_pendulum">
  <option integrator="RK4" timestep="0.01" gravity="0 0 -9.81"><flag contact="disable"/></option>
  <worldbody>
    <body name="link1">
      <joint name="hinge1" type="hinge" axis="0 1 0" damping="0.08"/>
      <inertial pos="0 0 -0.25" mass="1.2" diaginertia="0.03 0.03 0.005"/>
      <body name="link2" pos="0 0 -0.5">
        <joint name="hinge2" type="hinge" axis="0 1 0"/>
        <inertial pos="0 0 -0.2" mass="0.7" diaginertia="0.02 0.02 0.003"/>
      </body>
    </body>
  </worldbody>
  <sensor>
    <jointpos name="enc1" joint="hinge1"/>
    <jointpos name="enc2" joint="hinge2"/>
  </sensor>
</mujoco>"""

TUMBLING = """<mujoco model="tumbling">
  <option integrator="RK4" timestep="0.01" gravity="0 0 0"><flag contact="disable"/></option>
  <worldbody>
    <body name="box">
      <freejoint name="free"/>
      <inertial pos="0 0 0" mass="1.0" diaginertia="0.02 0.03 0.045"/>
      <site name="imu"/>
    </body>
  </worldbody>
  <sensor><gyro name="gyro" site="imu"/></sensor>
</mujoco>"""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One identification problem: the MJCF (true parameters), the initial state, the
    sensors (MuJoCo sensor names, each read from ``signal(model, data)`` columns), the
    sensor errors of the data, the unknowns (name -> (true, guess, sysid bounds)) and σ."""

    name: str
    xml: str
    qpos: tuple
    qvel: tuple
    sensors: tuple[str, ...]
    sigma: float
    unknowns: dict  # name -> (true, guess, (low, high))
    delay: float = 0.0  # s, common to all sensors
    offsets: tuple = ()  # per sensor column (added to the reading)
    description: str = ""


PROBLEMS = {
    "pendulum": Problem(
        "pendulum",
        PENDULUM,
        qpos=(np.deg2rad(60.0),),
        qvel=(0.0,),
        sensors=("enc",),
        sigma=1e-3,
        unknowns={
            "mass": (1.0, 1.3, (0.1, 10.0)),
            "damping": (0.05, 0.03, (1e-4, 1.0)),
        },
        description="pendulum: mass, hinge damping from 1 encoder",
    ),
    "double_pendulum": Problem(
        "double_pendulum",
        DOUBLE_PENDULUM,
        qpos=(np.deg2rad(70.0), np.deg2rad(-40.0)),
        qvel=(0.0, 0.0),
        sensors=("enc1", "enc2"),
        sigma=1e-3,
        unknowns={
            "mass1": (1.2, 1.56, (0.1, 10.0)),
            "mass2": (0.7, 0.49, (0.1, 10.0)),
            "damping1": (0.08, 0.05, (1e-4, 1.0)),
            "delay": (0.015, 0.0, (-0.05, 0.1)),
            "offset1": (0.02, 0.0, (-0.2, 0.2)),
            "offset2": (-0.015, 0.0, (-0.2, 0.2)),
        },
        delay=0.015,
        offsets=(0.02, -0.015),
        description="double pendulum: 2 masses, 1 damping, encoder delay + 2 offsets",
    ),
    "tumbling": Problem(
        "tumbling",
        TUMBLING,
        qpos=(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0),
        qvel=(0.0, 0.0, 0.0, 0.2, 3.0, 0.3),
        sensors=("gyro",),
        sigma=0.01,
        unknowns={
            "I_yy": (0.03, 0.035, (0.005, 0.2)),
            "I_zz": (0.045, 0.04, (0.005, 0.2)),
            "bias_x": (0.01, 0.0, (-0.2, 0.2)),
            "bias_y": (-0.02, 0.0, (-0.2, 0.2)),
            "bias_z": (0.015, 0.0, (-0.2, 0.2)),
        },
        offsets=(0.01, -0.02, 0.015),
        description="tumbling body: I_yy, I_zz (I_xx known) + 3 gyro biases",
    ),
}
I_XX = 0.02  # kg m², the known moment of the tumbling body


# ---------------------------------------------------------------------------------------------
# data: MuJoCo, from the MJCF with the true parameters


def measure(prob: Problem, t_end: float, seed: int):
    """(times (K,), readings (K, n)) of the problem's sensors: a MuJoCo RK4 run with a 1 ms
    step from the known initial state; the true signal at t_k − delay (the state before the
    release for t_k < delay: the system is held at rest until t = 0), plus the sensor's
    offsets/bias and Gaussian noise. Signals are read from the state after each step (joint
    angles; the free joint's angular velocity, which MuJoCo keeps in body axes = the gyro's
    site axes), so their time stamps are exact."""
    spec = mujoco.MjSpec.from_string(prob.xml)
    spec.option.timestep = DT_GEN
    m = spec.compile()
    d = mujoco.MjData(m)
    d.qpos[:] = prob.qpos
    d.qvel[:] = prob.qvel
    mujoco.mj_forward(m, d)

    def signal():
        return d.qvel[3:6].copy() if prob.name == "tumbling" else d.qpos.copy()

    n = round(t_end / DT_GEN)
    fine = [signal()]
    for _ in range(n):
        mujoco.mj_step(m, d)
        fine.append(signal())
    fine = np.array(fine)
    every = round(1.0 / (RATE * DT_GEN))
    lag = round(prob.delay / DT_GEN)
    idx = np.maximum(np.arange(0, n + 1, every) - lag, 0)
    times = np.arange(0, n + 1, every) * DT_GEN
    y = fine[idx] + (np.asarray(prob.offsets) if prob.offsets else 0.0)
    y = y + prob.sigma * np.random.default_rng(seed).normal(size=y.shape)
    return times, y


# ---------------------------------------------------------------------------------------------
# rbjax


def rbjax_problem(prob: Problem, times, y, joint: bool = False):
    """(build, params0, data, to_physical) for rbjax: the MJCF loaded by rbjax.load (``joint``:
    in joint coordinates, a JointModel), build() setting the unknown leaves with
    equinox.tree_at; to_physical maps fit.quantities() to the problem's unknowns (name ->
    (value, std))."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{prob.name}.xml")
        with open(path, "w") as fh:
            fh.write(prob.xml)
        with warnings.catch_warnings():  # "sensors [...] are NOT simulated": we observe them
            warnings.filterwarnings("ignore", message=".*no rbjax counterpart.*")
            formulation = rbjax.JointCoordinates() if joint else rbjax.ScalableDAE()
            loaded = rbjax.load(
                path, qpos=list(prob.qpos), qvel=list(prob.qvel), formulation=formulation
            )
    base, state0 = loaded.model, loaded.state
    # the damping of the first hinge: a JointModel's damping (nv,) or maximal coordinates'
    # RotationalSpringDamper (the first force element)
    if joint:
        damped = lambda m: m.damping  # noqa: E731
        damping = lambda m, d: m.damping.at[0].set(d)  # noqa: E731
    else:
        damped = lambda m: m.forces[0].damping  # noqa: E731
        damping = lambda m, d: d  # noqa: E731
    guess = {k: v[1] for k, v in prob.unknowns.items()}
    # every unknown in the interval sysid's box constraints give it (rbjax.Bounded), so that
    # both fits solve the same problem. Measured (README): the double pendulum then converges
    # to the truth (unbounded: a local minimum, reduced chi2 3.7e5; with only its delay and
    # damping bounded, both end on their bounds in the same minimum); the tumbling body stops
    # on bias_x's bound (reduced chi2 65; unbounded it converges): the sigmoid map's slope
    # vanishes at a bound, so a step that reaches one stays there, where sysid's bounded
    # solver moves along it
    lo_hi = {k: v[2] for k, v in prob.unknowns.items()}
    bounded = lambda k, x=None: rbjax.Bounded.from_value(  # noqa: E731
        guess[k] if x is None else x, *lo_hi[k]
    )
    sigma = prob.sigma

    if prob.name == "pendulum":
        params0 = {"mass": bounded("mass"), "damping": bounded("damping")}

        def build(p):
            model = eqx.tree_at(
                lambda m: (m.mass, damped(m)),
                base,
                (jnp.reshape(p["mass"].value, (1,)), damping(base, p["damping"].value)),
            )
            return model, state0

        obs = [rbjax.JointEncoder("hinge", y, sigma)]
        names = {"mass": "['mass']", "damping": "['damping']"}
    elif prob.name == "double_pendulum":
        params0 = {
            "mass1": bounded("mass1"),
            "mass2": bounded("mass2"),
            "damping1": bounded("damping1"),
            "delay": bounded("delay"),
            "offset1": bounded("offset1", [guess["offset1"]]),
            "offset2": bounded("offset2", [guess["offset2"]]),
        }

        def build(p):
            mass = jnp.stack([p["mass1"].value, p["mass2"].value])
            model = eqx.tree_at(
                lambda m: (m.mass, damped(m)), base, (mass, damping(base, p["damping1"].value))
            )
            return model, state0

        obs = [
            rbjax.JointEncoder("hinge1", y[:, :1], sigma, offset="offset1", delay="delay"),
            rbjax.JointEncoder("hinge2", y[:, 1:], sigma, offset="offset2", delay="delay"),
        ]
        names = {k: f"['{k}']" for k in ("mass1", "mass2", "damping1", "delay")}
        names |= {"offset1": "['offset1'][0]", "offset2": "['offset2'][0]"}
    elif prob.name == "tumbling":
        params0 = {
            "I_yy": bounded("I_yy"),
            "I_zz": bounded("I_zz"),
            "gyro_bias": bounded("bias_x", [guess[f"bias_{a}"] for a in "xyz"]),
        }

        def build(p):
            moments = jnp.stack([jnp.asarray(I_XX), p["I_yy"].value, p["I_zz"].value])
            return eqx.tree_at(lambda m: m.inertia, base, jnp.diag(moments)[None]), state0

        obs = [rbjax.Gyro("box", y, sigma, bias="gyro_bias")]
        names = {"I_yy": "['I_yy']", "I_zz": "['I_zz']"}
        names |= {f"bias_{a}": f"['gyro_bias'][{i}]" for i, a in enumerate("xyz")}
    else:  # pragma: no cover
        raise ValueError(prob.name)

    data = rbjax.Measurements(times, obs)

    def to_physical(fit):
        q = fit.quantities()
        idx = {n: i for i, n in enumerate(q.names)}
        return {k: (float(q.values[idx[n]]), float(q.std[idx[n]])) for k, n in names.items()}

    return build, params0, data, to_physical


class _Counted:
    """rbjax's compiled (r, J) function, counting its calls (identify looks it up per fit)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)


def run_rbjax(prob: Problem, times, y, dt: float, repeats: int, joint: bool = False) -> dict:
    t0 = time.perf_counter()
    build, params0, data, to_physical = rbjax_problem(prob, times, y, joint)
    load_s = time.perf_counter() - t0
    counted = _Counted(_identify.eval_forward)

    def call():
        counted.calls = 0
        fit = rbjax.identify(build, params0, data, dt=dt, max_steps=MAX_STEPS)
        return fit, to_physical(fit), getattr(fit, "evaluations", 0) or counted.calls

    _identify.eval_forward = counted
    try:
        (fit, est, evals), first, runs = timed(call, repeats)
    finally:
        _identify.eval_forward = counted.fn
    n = sum(o.values.size for o in data.observations)
    return dict(
        estimates=est,
        steps=int(fit.steps),
        evals=int(evals),
        evals_what="(r, J) evaluations (forward mode)",
        first_s=first,
        runs_s=runs,
        setup_s=load_s,
        setup_what="rbjax.load of the MJCF",
        converged=bool(fit.converged),
        message=str(fit.message),
        reduced_chi2=float(fit.reduced_chi2),
        unidentifiable=list(fit.unidentifiable),
        measurements=int(n),
    )


# ---------------------------------------------------------------------------------------------
# mujoco.sysid


def _setter(kind: str, name: str, index: int | None = None) -> Callable:
    """A sysid modifier writing the Parameter's value into the MjSpec."""

    def body_mass(spec, p):
        spec.body(name).mass = float(p.value[0])

    def joint_damping(spec, p):
        spec.joint(name).damping[0] = float(p.value[0])

    def body_moment(spec, p):
        spec.body(name).inertia[index] = float(p.value[0])

    return {"mass": body_mass, "damping": joint_damping, "moment": body_moment}[kind]


def sysid_params(prob: Problem):
    """The sysid ParameterDict at the guess: physical parameters with spec modifiers, sensor
    parameters (delay, offsets, biases) without (applied by modify_residual)."""
    modifiers = {
        "mass": _setter("mass", "link"),
        "damping": _setter("damping", "hinge"),
        "mass1": _setter("mass", "link1"),
        "mass2": _setter("mass", "link2"),
        "damping1": _setter("damping", "hinge1"),
        "I_yy": _setter("moment", "box", 1),
        "I_zz": _setter("moment", "box", 2),
    }
    params = sysid.ParameterDict()
    for name, (true, guess, (lo, hi)) in prob.unknowns.items():
        par = sysid.Parameter(name, true, lo, hi, modifier=modifiers.get(name))
        par.value[:] = guess  # nominal = the true value, shown in sysid's own tables only
        params.add(par)
    return params


def sysid_modify_residual(prob: Problem):
    """The residual (measured − predicted)/σ at the sample times, with the sensor model
    applied by sysid's own signal modifiers (module docstring: the one-step time fix)."""
    sigma = prob.sigma

    def modify(params, pred, meas, model, return_pred_all, state=None, **kw):
        # sysid stamps each sensor value with the time after the step that followed it
        pred = sysid.TimeSeries(pred.times - model.opt.timestep, pred.data, pred.signal_mapping)
        if prob.name == "double_pendulum":
            for i, s in enumerate(prob.sensors):
                pred = sysid.apply_delay(pred, s, params["delay"])
                pred = sysid.apply_bias(pred, s, params[f"offset{i + 1}"])
        elif prob.name == "tumbling":
            bias = sysid.Parameter(
                "gyro_bias",
                np.concatenate([params[f"bias_{a}"].value for a in "xyz"]),
                -np.ones(3),
                np.ones(3),
            )
            pred = sysid.apply_bias(pred, "gyro", bias)
        pred = pred.resample(meas.times)
        # the same mapping OBJECT as the measurements: model_residual compares the two dicts
        # with !=, which raises for equal numpy index arrays of more than one element (gyro)
        pred = sysid.TimeSeries(pred.times, pred.data, meas.signal_mapping)
        return (meas.data - pred.data) / sigma, pred, meas

    return modify


def run_sysid(prob: Problem, times, y, dt: float, repeats: int) -> dict:
    spec = mujoco.MjSpec.from_string(prob.xml)
    spec.option.timestep = dt
    model = spec.compile()
    n_ctrl = round(times[-1] / dt) + 2  # rollout to the last sample (the one-step time fix)
    control = sysid.TimeSeries(np.arange(n_ctrl) * dt, np.zeros((n_ctrl, model.nu)))
    init = sysid.create_initial_state(model, np.asarray(prob.qpos), np.asarray(prob.qvel))
    measured = sysid.TimeSeries.from_names(times, y, model)
    seqs = sysid.ModelSequences(prob.name, spec, "data", init, control, measured)
    base = sysid.build_residual_fn(models_sequences=[seqs], modify_residual=sysid_modify_residual(prob))  # fmt: skip
    count = {"rollouts": 0}

    def residual_fn(x, params, **kw):
        count["rollouts"] += 1 if np.ndim(x) == 1 else np.shape(x)[1]
        try:
            return base(x, params, **kw)
        except ValueError as e:  # MjSpec.compile refuses the trial point (A + B < C)
            if "inertia must satisfy" not in str(e):
                raise
            shape = (y.size,) if np.ndim(x) == 1 else (y.size, np.shape(x)[1])
            return [np.full(shape, np.nan)], [], []  # rejected: LM raises its damping

    def call():
        count["rollouts"] = 0
        params = sysid_params(prob)
        log = io.StringIO()
        opt, result = sysid.optimize(
            params, residual_fn, optimizer="mujoco", verbose=False, max_iters=MAX_STEPS, output=log
        )
        rollouts = count["rollouts"]
        r, _, _ = base(opt.as_vector(), opt)
        cov, _ = sysid.calculate_intervals(r, result.jac)
        std = np.sqrt(np.diag(cov))
        x = opt.as_vector()
        est = {k: (float(x[i]), float(std[i])) for i, k in enumerate(prob.unknowns)}
        rr = np.concatenate([np.ravel(a) for a in r])
        return est, log.getvalue(), rollouts, float(rr @ rr)

    (est, text, rollouts, chi2), first, runs = timed(call, repeats)
    m = re.search(r"Terminated after (\d+) iterations: (.*?) y:", text)
    steps = int(m.group(1)) if m else -1
    why = m.group(2).strip() if m else text.strip().splitlines()[-1]
    lo_hi = [prob.unknowns[k][2] for k in prob.unknowns]
    at_bound = [
        k for (k, (v, _)), (lo, hi) in zip(est.items(), lo_hi, strict=True) if v in (lo, hi)
    ]
    n = y.size
    return dict(
        estimates=est,
        steps=steps,
        evals=int(rollouts),
        evals_what="rollouts (residual evaluations; p + 1 per finite-difference Jacobian)",
        first_s=first,
        runs_s=runs,
        setup_s=0.0,
        setup_what="",
        converged=bool(m) and "maximum iterations" not in why and not at_bound,
        message=why + (f"; at a bound: {at_bound}" if at_bound else ""),
        reduced_chi2=chi2 / (n - len(prob.unknowns)),
        unidentifiable=[],
        measurements=int(n),
    )


# ---------------------------------------------------------------------------------------------
# driver


def timed(call, repeats: int):
    """(output of the first call, its wall time, wall times of ``repeats`` further calls)."""
    t0 = time.perf_counter()
    out = call()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return out, first, runs


def summarise(prob: Problem, tool: str, rec: dict, dt: float, t_end: float) -> dict:
    params = {}
    for k, (true, guess, _) in prob.unknowns.items():
        v, s = rec["estimates"][k]
        z = (v - true) / s if np.isfinite(s) and s > 0 else float("nan")
        params[k] = dict(true=true, guess=guess, estimate=v, std=s, z=z)
    run = statistics.median(rec["runs_s"]) if rec["runs_s"] else float("nan")
    first = rec["first_s"]
    zs = [abs(p["z"]) for p in params.values()]
    return dict(
        problem=prob.name,
        description=prob.description,
        tool=tool,
        params=params,
        max_abs_z=max(zs),
        rms_z=float(np.sqrt(np.mean(np.square(zs)))),
        steps=rec["steps"],
        evals=rec["evals"],
        evals_what=rec["evals_what"],
        first_call_s=first,
        run_s=run,
        runs_s=rec["runs_s"],
        compile_s=max(first - run, 0.0) if tool.startswith("rbjax") else 0.0,
        setup_s=rec["setup_s"],
        setup_what=rec["setup_what"],
        converged=rec["converged"],
        message=rec["message"],
        reduced_chi2=rec["reduced_chi2"],
        unidentifiable=rec["unidentifiable"],
        measurements=rec["measurements"],
        dt=dt,
        t_end=t_end,
        rate_hz=RATE,
        sigma=prob.sigma,
    )


def _fmt(x: float) -> str:
    return f"{x:.6g}" if np.isfinite(x) else "inf"


def table(records: list) -> str:
    """Two markdown tables: the estimates (per parameter) and the cost (per problem, tool)."""
    by = {(r["problem"], r["tool"]): r for r in records}
    problems = list(dict.fromkeys(r["problem"] for r in records))
    tools = sorted(
        dict.fromkeys(r["tool"] for r in records), key=lambda t: not t.startswith("rbjax")
    )
    head = "| problem | parameter | true | " + " | ".join(
        f"{t} estimate ± σ | {t} z" for t in tools
    )
    lines = [head + " |", "|" + "---|" * (3 + 2 * len(tools))]
    for p in problems:
        names = list(next(by[(p, t)] for t in tools if (p, t) in by)["params"])
        for k in names:
            true = next(by[(p, t)]["params"][k]["true"] for t in tools if (p, t) in by)
            cells = []
            for t in tools:
                e = by.get((p, t), {}).get("params", {}).get(k)
                cells += (
                    [f"{_fmt(e['estimate'])} ± {e['std']:.2g}", f"{e['z']:+.2f}"]
                    if e
                    else ["–", "–"]
                )
            lines.append(f"| {p} | {k} | {true:g} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| problem | tool | max abs z | steps | evals | first call s | compile s | further call s "
        "(median) | reduced χ² | converged |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in problems:
        for t in tools:
            r = by.get((p, t))
            if r is None:
                continue
            comp = f"{r['compile_s']:.1f}" if t.startswith("rbjax") else "none"
            first = f"{r['first_call_s']:.2f}"
            if r["setup_s"]:
                first += f" (+{r['setup_s']:.2f} load)"
            lines.append(
                f"| {p} | {t} | {r['max_abs_z']:.2f} | {r['steps']} | {r['evals']} | {first} | "
                f"{comp} | {r['run_s']:.3f} | {r['reduced_chi2']:.3f} | {r['converged']} |"
            )
    return "\n".join(lines)


CHI2_MISFIT = 10.0  # a reduced χ² this far above 1 is a misfit (a local minimum), not noise


def verdicts(records: list) -> list[str]:
    """One honest line per problem and sysid row: accuracy (max |z|, both against the truth)
    and wall time, first call (rbjax: load and compilation included) and further calls."""
    out = []
    by = {(r["problem"], r["tool"]): r for r in records}
    ours = [(p, t) for p, t in by if t.startswith("rbjax")]
    for p, mine in ours:
        a = by[(p, mine)]
        for (q, tool), b in by.items():
            if q != p or tool.startswith("rbjax"):
                continue
            za, zb = a["max_abs_z"], b["max_abs_z"]
            wrong = [n for n, r in ((mine, a), (tool, b)) if r["reduced_chi2"] > CHI2_MISFIT]
            if wrong:  # not a bias: the optimiser stopped where the model misses the data
                acc = f"{' and '.join(wrong)} stopped in a local minimum (reduced χ² > {CHI2_MISFIT:g})"
            elif za <= Z_OK and zb <= Z_OK:
                acc = f"equally accurate (both within {Z_OK:g} σ of the truth)"
            elif za <= Z_OK:
                acc = f"MORE accurate ({tool} is biased: max |z| > {Z_OK:g})"
            elif zb <= Z_OK:
                acc = f"LESS accurate (rbjax is biased: max |z| > {Z_OK:g})"
            else:
                acc = "both biased"
            a_first = a["first_call_s"] + a["setup_s"]
            first = "faster" if a_first < b["first_call_s"] else "SLOWER"
            warm = "faster" if a["run_s"] < b["run_s"] else "SLOWER"
            out.append(
                f"{p}, {mine} vs {tool}: {acc}, max |z| {za:.2f} vs {zb:.2f}; first call "
                f"{first} ({a_first:.2f} s, of which {a['compile_s']:.1f} s compiling, vs "
                f"{b['first_call_s']:.2f} s); further "
                f"calls {warm} ({a['run_s']:.3f} s vs {b['run_s']:.3f} s)"
            )
    return out


def versions() -> dict:
    out = {"mujoco": mujoco.__version__, "jax": jax.__version__, "numpy": np.__version__}
    for mod in ("jaxlib", "equinox", "scipy"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except ImportError:  # pragma: no cover
            out[mod] = None
    try:
        out["rbjax"] = importlib.metadata.version("rbjax")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        out["rbjax"] = None
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--repeats", type=int, default=3, help="further calls after the first")
    ap.add_argument("--dt", type=float, default=0.01, help="RK4 step of both fits [s]")
    ap.add_argument(
        "--sysid-fine-dt",
        type=float,
        default=0.005,
        help="also run sysid with this step on the problems with a delay (0: don't)",
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="length of the data [s]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--coordinates",
        default="maximal,joint",
        help="rbjax's formulations to run: maximal (rbjax.load's default), joint "
        "(rbjax.JointCoordinates(): the 'rbjax joint' rows), or both",
    )
    ap.add_argument("--quick", action="store_true", help="1.5 s of data, one further call")
    ap.add_argument("--json", default=None, help="write the records to this path")
    ap.add_argument("--table", default=None, help="print the tables of a --json file and exit")
    args = ap.parse_args(argv)
    if args.table:
        with open(args.table) as fh:
            records = json.load(fh)
        print("\n\n".join([table(records), "\n".join(verdicts(records))]))
        return records
    if args.quick:
        args.seconds, args.repeats = 1.5, 1
    if args.repeats < 1:
        ap.error("--repeats must be at least 1 (the further calls give the run time)")
    for dt in (args.dt, args.sysid_fine_dt or args.dt):
        if abs(round(1.0 / (RATE * dt)) * dt * RATE - 1.0) > 1e-9:
            ap.error(f"step {dt}: the sample interval {1 / RATE} s must be a multiple of it")
    if not HAVE_SYSID:
        print(
            "mujoco.sysid is not usable (install the extra: pip install 'mujoco[sysid]'); "
            "only rbjax runs."
        )
    records = []
    for name in args.problems.split(","):
        prob = PROBLEMS[name]
        times, y = measure(prob, args.seconds, args.seed)
        print(f"{prob.description}: {y.shape[0]} samples x {y.shape[1]}", flush=True)
        if HAVE_SYSID:
            steps = [("sysid", args.dt)]
            if prob.delay and args.sysid_fine_dt:
                steps.append((f"sysid dt={args.sysid_fine_dt:g}", args.sysid_fine_dt))
            for label, dt in steps:
                rec = run_sysid(prob, times, y, dt, args.repeats)
                records.append(summarise(prob, label, rec, dt, args.seconds))
                print(f"  {label}: first {rec['first_s']:.2f} s, {rec['steps']} steps", flush=True)
        for coords in args.coordinates.split(","):
            jax.clear_caches()  # no compiled code from the problems before: a cold first call
            rec = run_rbjax(prob, times, y, args.dt, args.repeats, joint=coords == "joint")
            label = "rbjax" if coords == "maximal" else "rbjax joint"
            records.append(summarise(prob, label, rec, args.dt, args.seconds))
            print(f"  {label}: first {rec['first_s']:.2f} s, {rec['steps']} steps", flush=True)
    info = versions()
    for r in records:
        r["versions"] = info
        r["seed"] = args.seed
    print()
    print(table(records))
    print()
    for line in verdicts(records):
        print(line)
    write_records(records, args.json)
    return records


if __name__ == "__main__":
    main()
