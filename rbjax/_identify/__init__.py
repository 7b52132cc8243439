"""System identification: fit parameters and initial conditions to measured motion.

API
---
``identify(build, params0, data, *, dt, free=None, solver=LevenbergMarquardt(), shooting=None,
...)
-> IdentificationResult``. One concept per module: observations.py, sensors.py,
references.py, measurements.py, quantities.py (physical units by the delta method),
shooting.py (schedule and segment states), problem.py (the compiled residuals), solvers.py,
linesearch.py, covariance.py (uncertainty and identifiability), gradient_check.py (a
non-finite gradient: stop and diagnose), result.py, identify.py.

* ``build(params) -> (model, state0)``: the user's map from ANY parameter pytree to a model
  and ONE initial state; the user chooses the parameterisation (``rbjax.Positive`` masses and
  dampers, ``rbjax.PrincipalInertia`` / ``rbjax.LogCholeskyInertia`` inertias, joint points,
  initial spin, ...), so that every raw value is physical and no projection is needed.
* ``free`` selects the fitted leaves (a pytree filter, as ``equinox.partition``'s
  ``filter_spec``): ``None`` = every floating-point array leaf, a bool pytree with
  ``params0``'s structure (or a prefix of it), or a callable ``leaf -> bool``.
* ``data = Measurements(times, observations)``: sample times of any spacing (each ≥ state0.t)
  and observations of body-fixed points (``Position``, markers), ``Orientation``,
  ``Velocity``, ``AngularVelocity``, joint reactions (``ReactionForce``), sensors (``Gyro``,
  ``Accelerometer``, ``IMU``, ``JointEncoder``: sensors.py) or any differentiable
  ``Custom(fn)`` of the state and the parameters, each with its noise standard deviation σ
  and an optional mask of missing samples. Sensor parameters (biases, scale factors,
  misalignments, mountings, lever arms, offsets, time delays) are references into the
  parameter pytree (references.py), fitted with the physical parameters. Everything is
  validated at build time (``ValueError`` naming the field, the value and the fix).

Joint coordinates
-----------------
``build`` may return an :class:`rbjax.JointModel` and its :class:`rbjax.JointState` (e.g. from
``rbjax.load(path, formulation=rbjax.JointCoordinates())``): the same API, every observation
and sensor. Bodies and joints are named as in the file; an observation reads what it reads in
maximal coordinates (a body's centre of mass and body axes, its centre-of-mass velocity, ω in
body axes, the reaction on the joint's child about the joint point; an encoder the hinge's or
slide's qpos − qpos0), so both formulations of a file give the same residuals at the same
state (rbjax/_identify/joint.py; tests/test_joint_identify.py). The parameters are the
JointModel's leaves (``mass``, ``damping``, ``inertia``, ...) and the initial (qpos, qvel).
Integrators: the explicit Runge–Kutta methods, ``SemiImplicitEuler`` and ``ImplicitFast``.
Not taken: a reaction in the maximal joint frame (``frame="joint"``), an encoder on a ball or
free joint, multiple shooting with equalities (ValueError naming the fix).

Statistical model and loss
--------------------------
Independent Gaussian noise: the negative log-likelihood is, up to a constant,

    L(θ) = ½ Σ_obs Σ_k m_k ‖(h_obs(x(t_k; θ), θ) − y_k) / σ_obs‖²        (m_k the mask)

a least-squares problem in the whitened residuals r(θ) = (h − y)/σ. Orientation residuals are
the rotation vector of conj(y_k) ⊗ A(t_k) (sign-invariant: q and −q are one measurement; the
quaternion log of rbjax.quaternion is smooth at the identity). ``residuals(build, params,
data, dt=...)`` exposes r(θ) as a differentiable function.

Simulation at the sample times
------------------------------
Each interval (t_{k−1}, t_k] is split into n_k = ⌈Δt_k / dt⌉ equal steps, counted on the host
from the concrete times (so the step counts are static), and ONE ``lax.scan`` runs every step
with its own step size h and the exact time of its end point; the state is gathered at the
ends of the intervals, i.e. exactly at the sample times (no interpolation). The integrator is
any rbjax integrator (its engine step; default ``RK4()``).

Multiple shooting (``shooting=Shooting(segments=S)``)
-----------------------------------------------------
The samples are split into S contiguous segments (Bock & Plitt 1984). The state at the start
of each segment s ≥ 1 (the time of its first sample) is an extra unknown, parameterised so
that every value is a valid state: position r, velocity v and angular velocity ω free; the
attitude as A_ref ⊗ exp(θ/2) with a free rotation vector θ (A_ref = the reference attitude,
so θ starts at 0); ν = 0 and |A| = 1 for rigid bodies (log-scale and ν free for scalable
ones). Mechanisms of rigid bodies: d position and d velocity coordinates in the tangent space
of the joint manifold (d = degrees of freedom): q = (r_ref + δr, A_ref ⊗ exp(δθ/2)) and
u = u_ref + (δv, 0, δω) with (δr, δθ) = N a and (δv, δω) = N b, N (6 nb, d) an orthonormal
basis of the null space of the velocity Jacobian W̃ at the reference state (right singular
vectors), mapped onto the manifold by :func:`rbjax.assemble`, so the state is consistent and
the 12 nb − 2d directions normal to the manifold (which no residual sees) are not unknowns
(the double pendulum: 4 per segment instead of 24, ~5× fewer tangents in forward mode).
Other mechanisms (with scalable bodies) assemble the free-body parameterisation. A JointModel
(a tree, no redundant coordinates): nv position coordinates in the tangent space of its qpos
(hinge and slide coordinates added, a ball's or free joint's quaternion turned by
exp(δ/2) in the joint's frame) and nv velocities, its gaps the inverse map (rotation vector of
the relative quaternion). The
references: the states of a simulation of ``params0``, segment by segment (start s+1 = end
of segment s), or ``Shooting.states0``, guesses at the sample times, e.g. estimated from the
measurements (Bock's recommendation: on chaotic or poorly guessed problems a simulation of
the guess leaves the data within a few segments and the fit stalls in a local minimum;
guesses from the data keep every segment near it). All segments are integrated in parallel
(``vmap`` over segments, padded to equal length with h = 0 steps whose states are never
read).
Continuity residuals √w·(end of segment s − start of segment s+1): position [m], rotation
vector [rad], velocity [m/s], angular velocity [rad/s] (and for scalable bodies ½ log|A|² and
ν). ``Shooting.continuity_weight`` w = 1/σ_c²: the default w = 1e6 treats a gap of σ_c = 1e-3 SI units
like a one-σ misfit, so at the optimum the gaps are far below typical measurement noise while
the problem stays well conditioned; the final gaps are reported (``continuity_gaps``). With
mechanisms, integrate with ``Projected(...)`` or ``ImplicitMidpoint()`` (or a small dt): a
segment that drifts off the joint manifold cannot meet its (assembled) successor, and the
drift remains as a gap.
Short segments keep the loss landscape smooth on chaotic or long horizons, where single
shooting has exponentially growing sensitivities.

Derivatives and optimisers
--------------------------
The whitened residuals and their Jacobian J = ∂r/∂θ are ONE compiled function (``jax.jacfwd``:
p tangents of one forward simulation, cheaper than reverse mode for the few parameters of an
identification, and the J is needed for the covariance anyway); with ``autodiff="reverse"``
(automatic above 64 free scalars) the optimiser uses reverse-mode gradients and J is formed
once at the end (``jacfwd`` or ``jacrev``, whichever is cheaper: p ≤ N or not). The compiled
functions are module-level ``equinox.filter_jit`` functions of (problem, parameters): a second
``identify`` call with the same ``build`` and the same shapes reuses them (e.g. Monte-Carlo
studies), only the data values change.

Solvers (rbjax/_identify/solvers.py): ``LevenbergMarquardt()`` (default: every fit here is a
least-squares problem; fewest steps, recommended with multiple shooting), ``LBFGS()`` or any
optax transform. Stopping rules (documented there): the scale-free gradient test, or a small
relative step AND a small relative decrease together; then Gauss–Newton steps from the end
point check it, and ``converged`` means they cannot lower the loss by more than
½ (0.01)² max(χ²_red, 1) (within 0.01 standard errors of a minimum). A non-finite loss at an
iterate raises ``ValueError`` naming the optimiser step; non-finite trial points of a line
search (or of an LM step) count as too long a step. A finite loss with a non-finite gradient
or Jacobian at the initial guess or at an accepted iterate is never handed to the optimiser:
``nonfinite="raise"`` (default) raises ``rbjax.NonfiniteGradientError`` with the diagnosis of
``rbjax.nonfinite_gradient`` replayed on the identification's own steps, ``"result"`` returns
the result there (gradient_check.py).

Uncertainty and identifiability
-------------------------------
At the estimate, the Gauss–Newton matrix H = JᵀJ of the whitened residuals is the Fisher
information, and its inverse the (asymptotic) covariance of the estimate (e.g. Bard,
"Nonlinear Parameter Estimation", 1974, ch. 7; Ljung, "System Identification", 1999, §9.3).
Identifiability is judged on the column-scaled Jacobian J D, D = diag(1/‖J_i‖) (free of
parameter units), by its singular values: those below ``rtol_identifiable`` × the largest
(default 1e-10 in float64: the accuracy of an autodiff Jacobian, not a statistical judgement;
a satellite whose inertia scale is seen only through a small torque has a ratio of 2e-5 and
a standard error of 20 %, which is reported as such, while torque-free it is 3e-16) are null
directions (the data cannot determine the parameters along them); a column whose parameter
moves the residuals by less than their rounding error over a change of max(|θ_i|, 1) is null
before any scaling. Each null direction is reported BY NAME, in the raw parameter
coordinates (D v, unit length, reduced row-echelon form when there
are several, so each names few parameters), e.g. "+0.577·['I'].raw[0] +0.577·['I'].raw[1]
+0.577·['I'].raw[2]" for the scale of an inertia under torque-free motion. The covariance is
the pseudo-inverse of H on the identifiable subspace; parameters that take part in a null
direction get an infinite standard error (and NaN covariances). With multiple shooting the
continuity equations are treated as exact for the covariance: the segment start states are
eliminated through the linearised continuity equations (J_red = J_θ − J_s C_s⁺ C_θ, the
marginal of the physical parameters in the limit w → ∞), so at a continuous estimate the
covariance is the single-shooting one; the finite weight w is an optimisation device, not a
noise model, and must not inflate the standard errors. The reduced χ² = 2 L_data / (N − p)
is ≈ 1 when σ is right and the model fits.
"""

from .identify import identify as identify
from .measurements import Measurements as Measurements
from .observations import (
    AbstractObservation as AbstractObservation,
    AngularVelocity as AngularVelocity,
    Custom as Custom,
    Orientation as Orientation,
    Position as Position,
    ReactionForce as ReactionForce,
    Velocity as Velocity,
)
from .problem import residuals as residuals
from .quantities import Estimate as Estimate, Quantities as Quantities
from .result import IdentificationResult as IdentificationResult
from .sensors import (
    IMU as IMU,
    Accelerometer as Accelerometer,
    Gyro as Gyro,
    JointEncoder as JointEncoder,
)
from .shooting import Shooting as Shooting
from .solvers import (
    LBFGS as LBFGS,
    AbstractSolver as AbstractSolver,
    LevenbergMarquardt as LevenbergMarquardt,
)
