"""The model-file expression language: values against NumPy, derivatives against the closed
form, and every refusal names the field, the column and the fix (never eval/exec)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rbjax
from rbjax._io.expressions import ExpressionError


def test_values_and_derivatives():
    t = np.linspace(0.0, 2.0, 9)
    e = rbjax.Expression("A*sin(2*pi*w*t) + (1 if t > 0.5 else 0) - clip(t, 0, 1)**2", A=0.5, w=1.5)
    want = 0.5 * np.sin(2 * np.pi * 1.5 * t) + (t > 0.5) - np.clip(t, 0, 1) ** 2
    np.testing.assert_allclose(e(jnp.asarray(t)), want, atol=1e-15)
    assert e(0.25).shape == ()
    # d/dA and d/dt against the closed forms
    g = jax.grad(lambda a: rbjax.Expression("A*t**2 + exp(-t)", A=a)(2.0))(3.0)
    assert float(g) == pytest.approx(4.0)
    dt = jax.grad(rbjax.Expression("atan2(sin(t), cos(t)) + sqrt(t)"))(0.7)
    assert float(dt) == pytest.approx(1.0 + 0.5 / np.sqrt(0.7))


def test_a_driver_from_text_prescribes_the_angle_it_says():
    """RotationDriver(f=Expression(...)): its residual sin(φ − θ(t)) vanishes where the body
    is turned by θ(t) = 0.5 sin(2πt) and not where it is turned by anything else."""
    q = np.array([[0.5, 0, 0, 1.0, 0, 0, 0]])
    driver = rbjax.RotationDriver.at(
        q, rbjax.GROUND, 0, point=[0, 0, 0], axis=[0, 0, 1], f=rbjax.Expression("0.5*sin(2*pi*t)")
    )
    ground = jnp.array([0.0, 0, 0, 1, 0, 0, 0])

    @jax.jit
    def residual(phi, t):
        turned = jnp.concatenate(
            [jnp.zeros(3), jnp.array([jnp.cos(phi / 2), 0, 0, jnp.sin(phi / 2)])]
        )
        return driver.residual(ground, turned, t)[0]

    for t in (0.0, 0.1, 0.25, 0.9):
        theta = 0.5 * np.sin(2 * np.pi * t)
        assert abs(float(residual(theta, t))) < 1e-15
        assert float(residual(theta + 0.2, t)) == pytest.approx(np.sin(0.2), rel=1e-12)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("0.5*sn(t)", "unknown function 'sn' at column 5"),
        ("0.5*x", "unknown name 'x' at column 5"),
        ("t.__class__", "Attribute is not part of the expression language at column 1"),
        (
            "__import__('os').system('true')",
            "is not part of the expression language|unknown function",
        ),
        ("sin(t", "syntax error"),
        ("[t for t in ()]", "ListComp is not part of the expression language"),
        ("clip(t, 1)", r"clip\(\) takes 3 argument\(s\), got 2"),
        ("'abc'", "constant 'abc' is not a number"),
        ("t if t else", "syntax error"),
        ("0 < t < 1", "only one comparison"),
        ("t or 1", "BoolOp is not part of the expression language"),
        ("1" * 2001, "at most 2000"),
    ],
)
def test_refusals_name_field_column_and_fix(source, message):
    with pytest.raises(ExpressionError, match=message) as info:
        rbjax.Expression(source, where="joints[3].driver")
    assert str(info.value).startswith("joints[3].driver: ") and "Fix:" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_parameters_are_checked():
    with pytest.raises(ExpressionError, match="reserved or invalid"):
        rbjax.Expression("pi*t", pi=3.0)
    with pytest.raises(ExpressionError, match="not a finite number"):
        rbjax.Expression("A*t", A=float("nan"))
