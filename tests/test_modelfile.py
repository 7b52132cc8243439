"""The rbjax model file (TOML): save → load is bit for bit, a hand-written file loads and
assembles, and every error names the field path and the fix."""

import pathlib
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"


def _same_arrays(a, b):
    la = jax.tree_util.tree_leaves_with_path(eqx.filter(a, eqx.is_array))
    lb = jax.tree.leaves(eqx.filter(b, eqx.is_array))
    assert len(la) == len(lb)
    for (path, x), y in zip(la, lb, strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)
    assert jax.tree.structure(eqx.filter(a, eqx.is_array)) == jax.tree.structure(
        eqx.filter(b, eqx.is_array)
    )


@pytest.mark.parametrize("name", ["cart_pole.xml", "humanoid.xml", "pendulum_driven.toml"])
def test_save_then_load_is_bit_for_bit(tmp_path, name):
    pytest.importorskip("mujoco")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MJCF: unsupported elements
        maximal = None if name.endswith(".toml") else rbjax.ScalableDAE()
        first = rbjax.load(MODELS / name, formulation=maximal)
    path = tmp_path / "model.toml"
    rbjax.save(path, first.model, first.state, timestep=first.timestep)
    again = rbjax.load(path)
    _same_arrays(first.model, again.model)
    assert first.model.names == again.model.names
    assert first.model.joint_names == again.model.joint_names
    assert [type(f) for f in first.model.forces] == [type(f) for f in again.model.forces]
    assert np.array_equal(first.state.q, again.state.q) and np.array_equal(
        first.state.u, again.state.u
    )
    assert again.timestep == first.timestep


def test_hand_written_file_loads_its_expression_driver_and_assembles_its_state(tmp_path):
    text = (MODELS / "pendulum_driven.toml").read_text()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file's velocities satisfy the driver: no assembly
        exact = rbjax.load(MODELS / "pendulum_driven.toml")
    # the same file at rest violates the driver's rate: assembled, with a warning
    rest = [line for line in text.splitlines() if line.startswith("u = ")]
    zeros = "u = [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]"
    (tmp_path / "rest.toml").write_text(text.replace(rest[0], zeros))
    with pytest.warns(UserWarning, match="velocities changed by up to 3.14"):
        loaded = rbjax.load(tmp_path / "rest.toml")
    # assembly finds the hand-computed velocities (crank ω = π about y, COM speeds 0.1π, 0.2π)
    np.testing.assert_allclose(loaded.state.u, exact.state.u, atol=1e-12)
    motor = loaded.model.joints[1]
    assert isinstance(motor.f, rbjax.Expression) and motor.f.source == "A*sin(2*pi*t)"
    assert float(motor.f(0.25)) == pytest.approx(0.5)
    # the driver's rate at t = 0, A·2π = π rad/s, now in the crank's angular velocity
    assert float(loaded.state.u[0, 5]) == pytest.approx(np.pi, rel=1e-10)
    assert loaded.timestep == 0.001 and loaded.source is None


BASE = """format = "rbjax-model 1"
[[bodies]]
name = "a"
mass = 1.0
inertia = [1.0, 1.0, 1.0]
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            '[[joints]]\ntype = "Revolut"\nbody_i = "ground"\nbody_j = "a"\n',
            r'joints\[0\]\.type = "Revolut" is not a joint type\. Fix: use one of',
        ),
        (
            '[[joints]]\ntype = "Revolute"\nbody_i = "ground"\nbody_j = "b"\n',
            r"joints\[0\]\.body_j: names body 'b'",
        ),
        (
            '[[joints]]\ntype = "Revolute"\nbody_i = "ground"\nbody_j = "a"\naxis = [0, 0, 1]\n',
            r"joints\[0\]\.axis: is not a known field",
        ),
        (
            '[[joints]]\ntype = "RotationDriver"\nbody_i = "ground"\nbody_j = "a"\nf = "0.5*sn(t)"\n',
            r"joints\[0\]\.f: unknown function 'sn' at column 5",
        ),
        (
            '[[joints]]\ntype = "Revolute"\nbody_i = "ground"\nbody_j = "a"\nz_i = [0, 0, 0]\n',
            r"joints\[0\]: .*zero length",
        ),
        ('[[forces]]\ntype = "Spring"\n', r'forces\[0\]\.type = "Spring" is not a force type'),
        ('[[forces]]\ntype = "BodyTorque"\nbody = "a"\n', r"forces\[0\]\.torque_body: is missing"),
        (
            '[[joints]]\ntype = "Distance"\nbody_i = "ground"\nbody_j = "a"\n',
            r"joints\[0\]\.length: is missing",
        ),
        ('formulation = "Lagrange"\n', r'formulation = "Lagrange" is not a formulation'),
        ("baumgarte = [1.0]\n", r"baumgarte = \[1\.0\] has 1 number, not 2\. Fix:"),
        ("baumgarte = [1.0, -2.0]\n", r"model: Model\.baumgarte .* >= 0"),
        ("[initial]\nq = [[0, 0, 0, 2.0, 0, 0, 0]]\n", r"initial: .*\|A\|² = 4"),
        (
            '[[bodies]]\nname = "b"\nmass = -1.0\ninertia = [1.0, 1.0, 1.0]\n',
            r"bodies\[1\]: b\.mass",
        ),
        ("[x]\ny = 1\n", r"^x: is not a known field\. Fix:"),
        ("mass = = 1\n", "not valid TOML"),
    ],
)
def test_errors_name_the_field_path(tmp_path, extra, message):
    path = tmp_path / "bad.toml"
    if extra.startswith(("formulation", "baumgarte")):  # top-level keys go before the tables
        text = BASE.replace("\n", "\n" + extra, 1)
    else:
        text = BASE + extra
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        rbjax.load(path)


def test_a_file_that_cannot_be_assembled_names_the_joints(tmp_path):
    path = tmp_path / "apart.toml"
    path.write_text(
        BASE
        + '[[joints]]\ntype = "Distance"\nname = "rope"\nbody_i = "ground"\nbody_j = "a"\nlength = 1.0\n'
        + '[[joints]]\ntype = "Distance"\nname = "rod"\nbody_i = "ground"\nbody_j = "a"\nlength = 2.0\n'
        + "[initial]\nq = [[0.0, 0.0, -1.5, 1.0, 0.0, 0.0, 0.0]]\n"
    )
    with pytest.raises(
        ValueError, match="cannot be assembled.*'rope'.*'rod'|cannot be assembled.*'rod'"
    ):
        rbjax.load(path)


def test_save_refuses_what_a_file_cannot_hold(tmp_path):
    body = rbjax.Body(1.0, [1.0, 1.0, 1.0])
    path = tmp_path / "m.toml"
    with pytest.raises(ValueError, match=r"forces\[0\] is a ForceFunction"):
        law = rbjax.ForceFunction(
            lambda t, s, p: (0.0 * s.q[:, :3], 0.0 * s.q[:, 3], 0.0 * s.q[:, :3])
        )
        rbjax.save(path, rbjax.Model(body, forces=[law]))
    q = np.array([[0.0, 0, -1, 1, 0, 0, 0]])
    lam = rbjax.RotationDriver.at(
        q, rbjax.GROUND, 0, point=[0, 0, 0], axis=[0, 1, 0], f=lambda t: t
    )
    with pytest.raises(ValueError, match=r"joints\[0\]\.f is function"):
        rbjax.save(path, rbjax.Model(body, joints=[lam]))
    state = rbjax.make_state(position=jnp.zeros((2, 1, 3)))
    with pytest.raises(ValueError, match="ONE initial state"):
        rbjax.save(path, rbjax.Model(body), state)
    with pytest.raises(ValueError, match="not a .toml path"):
        rbjax.save(tmp_path / "m.json", rbjax.Model(body))


def test_baumgarte_round_trip(tmp_path):
    """Baumgarte's α, β are written and read back, and act: with them the drift of a coarse
    RK4 rollout of a pendulum is smaller than without (the same file minus the line)."""
    q0 = np.array([[0.5, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])
    joint = rbjax.Revolute.at(q0, rbjax.GROUND, 0, point=(0, 0, 0), axis=(0, 1, 0), name="pin")
    body = rbjax.Body(1.0, np.diag([1e-3, 0.083, 0.083]), name="rod")
    model = rbjax.Model([body], joints=[joint], gravity=(0, 0, -9.81), baumgarte=(5.0, 5.0))
    state = rbjax.make_state(position=q0[:, :3], quaternion=q0[:, 3:])
    rbjax.save(tmp_path / "b.toml", model, state)
    text = (tmp_path / "b.toml").read_text()
    assert "baumgarte = [5.0, 5.0]" in text
    again = rbjax.load(tmp_path / "b.toml")
    assert [float(x) for x in again.model.baumgarte] == [5.0, 5.0]
    (tmp_path / "plain.toml").write_text(text.replace("baumgarte = [5.0, 5.0]\n", ""))
    plain = rbjax.load(tmp_path / "plain.toml")
    assert plain.model.baumgarte is None

    def drift(m):  # the largest hinge residual |Φ| along a coarse RK4 rollout
        tr = rbjax.rollout(m, again.state, 0.02, 200)
        res = jax.vmap(lambda q: rbjax.advanced.constraint_residual(m.joints[0], q, 0.0))(tr.q)
        return float(np.max(np.abs(np.asarray(res))))

    assert drift(again.model) < 0.2 * drift(plain.model)  # measured 6.8e-7 against 6.0e-6


@pytest.mark.parametrize("option", [{"control": [1.0]}, {"qpos": [0.1]}, {"dtype": np.float32}])
def test_mjcf_options_are_refused_for_a_model_file(option):
    """A model file carries its own state and controls: options meant for MJCF/URDF must not
    be silently ignored."""
    with pytest.raises(ValueError, match="apply to MJCF/URDF files"):
        rbjax.load(MODELS / "pendulum_driven.toml", **option)
