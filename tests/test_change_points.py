"""Change points (singular configurations) of mechanisms, issue 36.

A spatial slider-crank whose crank length r equals its rod length l has a change point at
θ = 90°: the slider reaches the crank's pivot, and the motion can continue on x = 2r cos θ
(the smooth branch) or fold onto x = 0. References the code does not produce: that closed
form and its θ-derivatives, the singular values of rbjax.mobility's NumPy SVD, and the
structural redundancy of the planar loops of tests/test_redundant_loops.py (dependent at
every configuration, so never singular). Before issue 36 the analysis folded onto x = 0
beyond a time exactly at the change point (|x − 2r cos θ| up to 0.38 m) and nothing said so.

One kinematic analysis program serves both time grids (same shapes: compiled once).
"""

import re
import warnings

import numpy as np
import pytest
from conftest import assert_close
from test_mechanisms import slider_crank_parts
from test_redundant_loops import door, planar_loop

import rbjax
from rbjax import SingularConfigurationWarning
from rbjax._analysis.checks import check_mechanism_state

R, TH0, W = 0.2, 0.3, 2.0  # crank = rod length [m], initial crank angle [rad], motor [rad/s]
TC = (np.pi / 2 - TH0) / W  # the change point: θ = 90°
H = 2 * TC / 20  # step of the time grids


def slider_crank(*, driven=True, th=TH0):
    """The slider-crank of tests/test_mechanisms.py with r = l = R, on the smooth branch at
    crank angle ``th``: rod angle −θ, slider at x = 2r cos θ. ``driven``: a motor θ = θ₀ + ω t."""
    bodies, joints, model, state = slider_crank_parts(R, R, th, W, [0.0, 0.0, -9.81])
    if not driven:
        model = rbjax.Model(bodies, joints=joints, gravity=[0.0, 0.0, -9.81])
    return model, state


@pytest.fixture(scope="module")
def analyses():
    """The analysis on a grid with a time exactly at the change point (times[10] = TC) and on
    the same grid shifted by 0.37 steps (the change point between times[9] and times[10])."""
    model, st0 = slider_crank()
    exact = np.linspace(0.0, 2 * TC, 21)
    straddle = exact + 0.37 * H
    out = {}
    for name, times in (("exact", exact), ("straddle", straddle)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out[name] = (times, rbjax.kinematic_analysis(model, st0, times), caught)
    return model, out


def test_kinematic_analysis_continues_through_a_change_point(analyses):
    model, out = analyses
    for name, (times, res, _) in out.items():
        th = TH0 + W * times
        x, v, a = (np.asarray(z[:, 2, 0]) for z in (res.q, res.u, res.udot))
        # the smooth branch x = 2r cos θ beyond the change point (the folded one gives x = 0);
        # at the time exactly on it Newton converges only linearly (residual ~ error²)
        assert_close(x, 2 * R * np.cos(th), atol=1e-12 if name == "straddle" else 1e-9)
        regular = np.abs(times - TC) > 1e-9  # velocity and acceleration are unique there
        assert_close(v[regular], -2 * R * W * np.sin(th[regular]), atol=1e-10)
        assert_close(a[regular], -2 * R * W**2 * np.cos(th[regular]), atol=1e-9)
        assert np.max(np.asarray(res.residual)) < 1e-12


def test_kinematic_analysis_reports_the_change_point(analyses):
    model, out = analyses
    times, res, caught = out["exact"]
    assert np.flatnonzero(np.asarray(res.singular)).tolist() == [10]
    assert float(res.first_singular) == pytest.approx(TC, abs=1e-12)
    assert np.isnan(np.asarray(res.singular_time)[np.arange(21) != 10]).all()
    # conditioning: σ_min/σ_max of W̃, against rbjax.mobility's NumPy SVD
    for k in (3, 10):
        state = rbjax.State(t=res.t[k], q=res.q[k], u=res.u[k])
        sv = np.asarray(rbjax.mobility(model, state).singular_values)
        assert float(res.conditioning[k]) == pytest.approx(sv[-1] / sv[0], rel=1e-6, abs=1e-12)
    assert float(res.conditioning[10]) < 1e-9 < 1e-3 < float(res.conditioning[9])
    [w] = [w for w in caught if w.category is SingularConfigurationWarning]
    assert "passes a singular configuration (a change point" in str(w.message)
    assert "t = 0.635398 s (an analysed time)" in str(w.message)
    assert "followed the branch that continues the motion smoothly" in str(w.message)

    # between two analysed times: the smallest singular value changes sign; its zero,
    # interpolated linearly, estimates the time to O(h²) (h = 0.064 s here)
    times, res, caught = out["straddle"]
    assert np.flatnonzero(np.asarray(res.singular)).tolist() == [10]
    assert times[9] < TC < times[10]
    assert float(res.first_singular) == pytest.approx(TC, abs=1e-4)
    assert float(np.min(np.asarray(res.conditioning))) > 1e-3  # no analysed time is singular
    [w] = [w for w in caught if w.category is SingularConfigurationWarning]
    assert re.search(r"at t = 0\.6353\d* s\. Beyond it", str(w.message)), str(w.message)


def test_change_points_of_a_saved_motion(analyses):
    """rbjax.change_points on saved states (here the analysed motion, seen by the undriven
    mechanism, as a rollout's would be): the same passages as the analysis's own test."""
    free, _ = slider_crank(driven=False)
    _, out = analyses
    for name in ("exact", "straddle"):
        _, res, _ = out[name]
        found = rbjax.change_points(free, rbjax.State(t=res.t, q=res.q, u=res.u))
        assert np.flatnonzero(np.asarray(found.singular)).tolist() == [10]
        assert float(found.first) == pytest.approx(float(res.first_singular), abs=1e-6)
    # a batch of two motions: the regular half of the path has none
    _, res, _ = out["straddle"]
    both = rbjax.State(
        t=np.stack([res.t, res.t]), q=np.stack([res.q, res.q[::-1]]), u=np.stack([res.u, res.u])
    )
    assert rbjax.change_points(free, both).singular.shape == (2, 21)
    first_half = rbjax.State(t=res.t[:8], q=res.q[:8], u=res.u[:8])
    assert not np.any(np.asarray(rbjax.change_points(free, first_half).singular))
    with pytest.raises(ValueError, match=r"^change_points: states = .*Fix: pass rollout"):
        rbjax.change_points(free, rbjax.State(t=res.t[0], q=res.q[0], u=res.u[0]))


def test_a_start_at_a_change_point_is_reported():
    free, regular = slider_crank(driven=False)
    _, at_cp = slider_crank(driven=False, th=np.pi / 2)
    mob = rbjax.mobility(free, at_cp)
    # in-plane, and the rod's spin about its own axis (along the slider's pin there)
    assert (mob.rank_drop, mob.singular, mob.dof) == (2, True, 3)
    assert rbjax.mobility(free, regular).rank_drop == 0
    check_mechanism_state(free, regular)  # no warning (warnings are errors here)
    # the build-time check of rollout (and identify, monte_carlo, the CLI) warns before compiling
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingularConfigurationWarning)
        with pytest.raises(SingularConfigurationWarning, match="the initial configuration is "):
            rbjax.rollout(free, at_cp, 1e-3, 10)


def _parallelogram(phi):
    """The parallelogram of tests/test_redundant_loops.py (four revolute joints: three
    equations dependent at every configuration) with its crank at ``phi`` from the vertical;
    at φ = π/2 all links lie on the ground line, where it can switch to the antiparallelogram
    (a change point)."""
    d, p = np.array([np.sin(phi), 0.0, -np.cos(phi)]), np.array([1.0, 0.0, 0.0])
    return planar_loop(d, p + d, p)


def test_structural_redundancy_is_not_a_change_point():
    model, state = _parallelogram(0.7)
    for m, st in ((model, state), door()):
        mob = rbjax.mobility(m, st)
        assert mob.redundant and mob.rank_drop == 0, mob
        check_mechanism_state(m, st)  # no warning (warnings are errors here)
    mob = rbjax.mobility(*_parallelogram(np.pi / 2))
    assert (mob.rank_drop, mob.dof, len(mob.redundant)) == (1, 2, 4)

    def path(phis):
        states = [_parallelogram(phi)[1] for phi in phis]
        q, u = (np.stack([getattr(s, f) for s in states]) for f in ("q", "u"))
        return rbjax.State(t=np.asarray(phis), q=q, u=u)  # "time" = crank angle

    through = rbjax.change_points(model, path(np.linspace(1.2, 1.9, 8)))
    assert np.flatnonzero(np.asarray(through.singular)).tolist() == [4]
    assert float(through.first) == pytest.approx(np.pi / 2, abs=1e-4)
    away = rbjax.change_points(model, path(np.linspace(0.3, 1.0, 8)))
    assert not np.any(np.asarray(away.singular))
