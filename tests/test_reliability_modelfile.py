"""Issue 36's model-file probes ("nothing silently wrong on the new surfaces"): every field of
the rbjax model file (TOML) has a type, and a value of the wrong type, shape or encoding is a
ModelFileError naming the field path, the value and the fix (a "Fix:", which the command line
turns into exit code 2 and one line), never a silent conversion (``scalable = "false"`` made a
rigid body scalable: ``bool("false")`` is True) nor a raw exception (RecursionError,
UnicodeDecodeError, KeyError). Also the depth and size limits of the expression language,
hypothesis fuzzing of model files and expressions, and the writer's round trip of every field
the reader accepts. Loading only: no rollouts; no model here has both joints and an initial
state, so nothing is compiled beyond a few eager operations."""

from __future__ import annotations

import json
import math
import re
import warnings

import equinox as eqx
import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

import rbjax
from rbjax._cli import main
from rbjax._io import modelfile
from rbjax._io.expressions import MAX_DEPTH, MAX_LENGTH, MAX_NODES, ExpressionError
from rbjax._io.modelfile import MAX_NESTING, ModelFileError

TEXT = """format = "rbjax-model 1"
gravity = [0.0, 0.0, -9.81]
timestep = 0.001
merge_welded = false

[[bodies]]
name = "crank"
mass = 1.0
inertia = [0.001, 0.01, 0.01]

[[bodies]]
name = "rod"
mass = 0.5
inertia = [0.02, 0.02, 0.0005]
scalable = false

[[joints]]
type = "Revolute"
name = "pivot"
body_i = "ground"
body_j = "crank"
z_i = [0.0, 1.0, 0.0]

[[joints]]
type = "RotationDriver"
name = "motor"
body_i = "ground"
body_j = "crank"
z_i = [0.0, 0.0, 1.0]
f = "A*sin(2*pi*t)"
params = { A = 0.5 }

[[forces]]
type = "AxialSpringDamper"
body_i = "crank"
body_j = "rod"
s_i = [0.0, 0.0, 0.0]
s_j = [0.0, 0.0, 0.0]
axis_i = [0.0, 0.0, 1.0]
stiffness = 2.0

[forces.actuator]
gain = [1.0, 0.0, 0.0]
control = { values = [0.0, 1.0], dt = 0.1 }
"""

ONE = """format = "rbjax-model 1"
[[bodies]]
name = "a"
mass = 1.0
inertia = [1.0, 1.0, 1.0]
"""


def _load_text(tmp_path, text, name="m.toml"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return rbjax.load(path)


def _edit(old, new):
    assert old in TEXT, old
    return TEXT.replace(old, new, 1)


def test_the_base_file_loads(tmp_path):
    loaded = _load_text(tmp_path, TEXT)
    assert loaded.model.scalable == (False, False) and loaded.timestep == 0.001
    assert float(loaded.model.joints[1].f.params["A"]) == 0.5


HUGE = "1" + "0" * 400  # a TOML integer no float holds

PROBES = [
    # booleans: a bool field takes only TOML booleans; numbers refuse booleans (issue 36)
    (
        ("scalable = false", 'scalable = "false"'),
        'bodies[1].scalable = "false" is a string, not a boolean. Fix: write scalable = false '
        "(no quotes).",
    ),
    (("timestep = 0.001", "timestep = true"), "timestep = true is a boolean, not a number. Fix:"),
    (("A = 0.5", "A = true"), "joints[1].params.A = true is a boolean, not a number. Fix:"),
    (("scalable = false", "scalable = 0"), "bodies[1].scalable = 0 is an integer, not a boolean"),
    (
        ("merge_welded = false", 'merge_welded = "no"'),
        'merge_welded = "no" is a string, not a boolean. Fix: write merge_welded = true or '
        "merge_welded = false.",
    ),
    (("mass = 1.0", "mass = true"), "bodies[0].mass = true is a boolean, not a number. Fix:"),
    (
        ("gravity = [0.0, 0.0, -9.81]", "gravity = [0.0, 0.0, true]"),
        "gravity[2] = true is a boolean, not a number",
    ),
    # strings in numeric fields
    (
        ("mass = 0.5", 'mass = "0.5"'),
        'bodies[1].mass = "0.5" is a string, not a number. Fix: write mass = 0.5 (no quotes).',
    ),
    (
        ("gravity = [0.0, 0.0, -9.81]", 'gravity = ["0", "0", "-9.81"]'),
        'gravity[0] = "0" is a string, not a number. Fix: write 0 (no quotes) in the array.',
    ),
    (
        ("stiffness = 2.0", 'stiffness = "stiff"'),
        'forces[0].stiffness = "stiff" is a string, not a number. Fix:',
    ),
    (("dt = 0.1", 'dt = "0.1"'), 'forces[0].actuator.control.dt = "0.1" is a string'),
    (("timestep = 0.001", "timestep = 1979-05-27"), "timestep = 1979-05-27 is a date, not a"),
    (("A = 0.5", 'A = "0.5"'), 'joints[1].params.A = "0.5" is a string, not a number'),
    # shapes
    (
        ("gravity = [0.0, 0.0, -9.81]", "gravity = [0.0, -9.81]"),
        "gravity = [0.0, -9.81] has 2 numbers, not 3. Fix:",
    ),
    (
        ("gravity = [0.0, 0.0, -9.81]", "gravity = [[0.0, 0.0, -9.81]]"),
        "gravity = [[0.0, 0.0, -9.81]] is an array of arrays, not an array of 3 numbers",
    ),
    (("gravity = [0.0, 0.0, -9.81]", "gravity = []"), "gravity = [] has 0 numbers, not 3"),
    (
        ("gravity = [0.0, 0.0, -9.81]", "gravity = -9.81"),
        "gravity = -9.81 is a float, not an array of 3 numbers",
    ),
    (
        ("inertia = [0.001, 0.01, 0.01]", "inertia = [[0.001, 0.0], [0.0, 0.01]]"),
        "bodies[0].inertia = [[0.001, 0.0], [0.0, 0.01]] has 2 rows, not 3",
    ),
    (
        ("inertia = [0.001, 0.01, 0.01]", "inertia = [[1.0, 0.0, 0.0], [0.0, 1.0], [0, 0, 1]]"),
        "bodies[0].inertia[1] = [0.0, 1.0] has 2 numbers, not 3",
    ),
    (
        ("values = [0.0, 1.0]", "values = [[0.0, 1.0]]"),
        "forces[0].actuator.control.values = [[0.0, 1.0]] is an array of arrays",
    ),
    (("values = [0.0, 1.0]", "values = []"), "forces[0].actuator.control.values = [] is empty"),
    (("s_i = [0.0, 0.0, 0.0]", "s_i = [0.0, [0.0], 0.0]"), "forces[0].s_i[1] = [0.0] is an array"),
    # finite values
    (("mass = 1.0", "mass = nan"), "bodies[0].mass = nan is not finite. Fix:"),
    (("A = 0.5", "A = -inf"), "joints[1].params.A = -inf is not finite"),
    (("A = 0.5", "A = 0.5, where = 1.0"), "joints[1].params.where: is a name the expression"),
    (("z_i = [0.0, 0.0, 1.0]", "z_i = [0.0, 0.0, inf]"), "joints[1].z_i[2] = inf is not finite"),
    (("mass = 1.0", f"mass = {HUGE}"), "bodies[0].mass = 100000000"),
    (("timestep = 0.001", "timestep = -0.001"), "timestep = -0.001 is not positive. Fix:"),
    # a table where a value is expected, a value where a table is expected
    (
        ("mass = 1.0", "mass = { value = 1.0 }"),
        "bodies[0].mass = { value = 1.0 } is a table, not a number",
    ),
    (
        ('f = "A*sin(2*pi*t)"', 'f = ["A*sin(2*pi*t)"]'),
        'joints[1].f = ["A*sin(2*pi*t)"] is an array, not an expression',
    ),
    (("params = { A = 0.5 }", "params = 0.5"), "joints[1].params = 0.5 is a float, not a table"),
    (
        ("control = { values = [0.0, 1.0], dt = 0.1 }", "control = [0.0, 1.0]"),
        "forces[0].actuator.control = [0.0, 1.0] is an array, not a number, an expression",
    ),
    (("[forces.actuator]", "actuator = 1.0\n[forces.x]"), "forces[0].actuator = 1.0 is a float"),
    # strings: names and choices
    (('name = "rod"', "name = 3"), "bodies[1].name = 3 is an integer, not a string"),
    (('name = "rod"', 'name = "ground"'), 'bodies[1].name = "ground" names the fixed world'),
    (('name = "rod"', 'name = "crank"'), 'bodies[1].name = "crank" is the name of bodies[0] too'),
    (('body_j = "crank"', "body_j = 1"), "joints[0].body_j = 1 is an integer, not a string"),
    (('type = "Revolute"', "type = true"), "joints[0].type = true is a boolean, not a string"),
    (
        ('format = "rbjax-model 1"', "format = 1"),
        'format = 1 is an integer, not a string. Fix: write format = "rbjax-model 1"',
    ),
    (("dt = 0.1", 'dt = 0.1, hold = "cubic"'), 'control.hold = "cubic" is not one of'),
    (("dt = 0.1", "dt = 0.1, hold = false"), "control.hold = false is a boolean, not a string"),
]


@pytest.mark.parametrize(("edit", "message"), PROBES, ids=[m[:40] for _, m in PROBES])
def test_every_field_is_typed(tmp_path, edit, message):
    """A wrong type, shape or non-finite value is a named error at its exact field path."""
    with pytest.raises(ModelFileError) as info:
        _load_text(tmp_path, _edit(*edit))
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)
    assert "Fix:" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            '[[forces]]\ntype = "TranslationalSpringDamper"\nbody_i = "ground"\nbody_j = "a"\n',
            r"forces\[0\]\.s_i: is missing\. Fix:",
        ),
        (
            '[[forces]]\ntype = "RotationalSpringDamper"\nbody_i = "ground"\nbody_j = "a"\n',
            r"forces\[0\]\.axis_i: is missing\. Fix:",
        ),
        (
            '[[forces]]\ntype = "AxialSpringDamper"\nbody_i = "ground"\nbody_j = "a"\n'
            "s_i = [0, 0, 0]\ns_j = [0, 0, 0]\n",
            r"forces\[0\]\.axis_i: is missing\. Fix:",
        ),
        ("[initial]\nq = [0.0, 0, 0, 1, 0, 0, 0]\n", r"initial\.q = \[0\.0, 0, 0, 1, 0, 0, 0\] is"),
        ("[initial]\nq = [[0.0, 0, 0, 1, 0, 0, 0]]\nt = '0'\n", r"initial\.t = \"0\" is a string"),
        ("[initial]\nq = [[0.0, 0, 0, 1, 0, 0]]\n", r"initial\.q\[0\] = .* has 6 numbers, not 7"),
        ("[initial]\nq = []\n", r"initial\.q = \[\] is empty\. Fix:"),
        ("joints = 3\n", r"joints = 3 is an integer, not an array of tables"),
        ("[[joints]]\n", r"joints\[0\]\.type: is missing"),
        (
            '[[joints]]\ntype = "Spherical"\nbody_i = "ground"\nbody_j = "a"\nlength = 1.0\n',
            r"joints\[0\]\.length: is not a known field of a Spherical joint\. Fix:",
        ),
        (
            '[[joints]]\ntype = "Fixed"\nbody_i = "ground"\nbody_j = "a"\nparams = { A = 1 }\n',
            r"joints\[0\]\.params: is not a known field of a Fixed joint",
        ),
        # a point mass: scalable = true was ignored; an inertia is refused, and needed otherwise
        (
            '[[bodies]]\nname = "b"\nmass = 0.1\npoint = true\nscalable = true\n',
            r"bodies\[1\]: b\.point = True is a scalable point mass\. Fix:",
        ),
        (
            '[[bodies]]\nname = "b"\nmass = 0.1\npoint = true\ninertia = [1.0, 1.0, 1.0]\n',
            r"bodies\[1\]\.inertia: is given for a point mass\. Fix:",
        ),
        ('[[bodies]]\nname = "b"\nmass = 0.1\n', r"bodies\[1\]\.inertia: is missing\. Fix:"),
    ],
)
def test_required_fields_and_shapes_of_the_other_tables(tmp_path, extra, message):
    with pytest.raises(ModelFileError, match=message):
        _load_text(
            tmp_path, ONE.replace("format", extra + "format") if extra[0] == "j" else ONE + extra
        )


def test_a_number_must_fit_the_float_jax_computes_in(tmp_path):
    """With JAX in float32 (x64 off) a mass of 1e39 used to load as inf and one of 1e-39 as 0
    (or a subnormal); both are refused. In float64 both fit."""
    big, small = ONE.replace("mass = 1.0", "mass = 1e39"), ONE.replace("mass = 1.0", "mass = 1e-39")
    assert float(_load_text(tmp_path, big).model.mass[0]) == 1e39
    assert float(_load_text(tmp_path, small).model.mass[0]) == 1e-39
    with pytest.raises(ModelFileError, match=r"bodies\[0\]\.mass = 5e-324 underflows float64"):
        _load_text(tmp_path, ONE.replace("mass = 1.0", "mass = 5e-324"))
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(ModelFileError, match=r"bodies\[0\]\.mass = 1e\+39 overflows float32"):
            _load_text(tmp_path, big)
        with pytest.raises(ModelFileError, match=r"bodies\[0\]\.mass = 1e-39 underflows float32"):
            _load_text(tmp_path, small)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_encodings_and_syntax(tmp_path):
    """Non-UTF-8 bytes are named with their line and column (they were a raw
    UnicodeDecodeError); a UTF-8 byte-order mark is read; bad syntax names the line."""
    raw = TEXT.encode().replace(b'name = "rod"', b'name = "r\xf6d"')  # Latin-1 'ö'
    with pytest.raises(ModelFileError, match=r"is not UTF-8 text: byte 0xf6 at line 12, col"):
        _load_text(tmp_path, raw)
    assert _load_text(tmp_path, b"\xef\xbb\xbf" + TEXT.encode()).model.names == ("crank", "rod")
    with pytest.raises(ModelFileError, match=r"not valid TOML \(.*line 3.*\)\. Fix:"):
        _load_text(tmp_path, TEXT.replace("timestep = 0.001", "timestep = = 1"))


@pytest.mark.parametrize(
    ("depth", "opener", "closer"),
    [(3000, "[", "]"), (3000, "{ a = ", "}"), (400, "[", "]"), (MAX_NESTING + 1, "[", "]")],
)
def test_deep_nesting_is_a_named_error(tmp_path, depth, opener, closer):
    """A 3000-deep TOML array made tomllib raise RecursionError; nesting is checked first."""
    value = opener * depth + ("1" if opener[0] == "{" else "") + closer * depth
    text = TEXT.replace("gravity = [0.0, 0.0, -9.81]", f'gravity = {value}\nx = "[[[{{"')
    with pytest.raises(ModelFileError, match=rf"line 2, column 11: .* more than {MAX_NESTING}"):
        _load_text(tmp_path, text)


def test_a_recursion_error_in_tomllib_cannot_escape(tmp_path, monkeypatch):
    """The guard behind the nesting check: with the check lifted, tomllib's RecursionError
    still becomes a named error."""
    monkeypatch.setattr(modelfile, "MAX_NESTING", 10**6)
    text = TEXT.replace("gravity = [0.0, 0.0, -9.81]", "gravity = " + "[" * 3000 + "]" * 3000)
    with pytest.raises(ModelFileError, match="nested too deeply to read. Fix:"):
        _load_text(tmp_path, text)


def test_nesting_within_the_limit_is_a_typed_error(tmp_path):
    value = "[" * MAX_NESTING + "]" * MAX_NESTING
    with pytest.raises(ModelFileError, match=r"^gravity = \[\[\[.*is an array of arrays"):
        _load_text(tmp_path, TEXT.replace("gravity = [0.0, 0.0, -9.81]", f"gravity = {value}"))
    # brackets inside strings and comments are not nesting
    text = TEXT.replace('name = "pivot"', 'name = "' + "[" * 100 + '" # ' + "{" * 100)
    assert _load_text(tmp_path, text).model.joint_names[0] == "[" * 100


# ---------------------------------------------------------------------------- expressions


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("+".join(["t"] * 999), rf"has 1997 terms and operations \(at most {MAX_NODES}\)"),
        ("+".join(["t"] * 300), rf"is nested 300 deep \(at most {MAX_DEPTH}\)"),
        ("-" * 1999 + "t", "terms and operations"),
        ("-" * 150 + "t", "is nested 151 deep"),
        ("**".join(["t"] * 120), "is nested 120 deep"),
        ("sin(" * 120 + "t" + ")" * 120, "is nested 121 deep"),
        ("1e999", "constant inf is not finite"),
        ("9" * 400, "constant 99999.* is too large"),
        ("t\x00", "syntax error"),
    ],
)
def test_expression_limits(source, message):
    """A 999-term sum raised RecursionError; size and depth are bounded with named errors."""
    with pytest.raises(ExpressionError, match=message) as info:
        rbjax.Expression(source, where="joints[1].f")
    assert str(info.value).startswith("joints[1].f: ") and "Fix:" in str(info.value)


def test_an_expression_at_the_limits_evaluates():
    """The deepest and the largest accepted expressions build and evaluate (recursion depth
    MAX_DEPTH, far below Python's limit) to their closed forms."""
    deep = rbjax.Expression("+".join(["t"] * MAX_DEPTH))
    assert float(deep(0.5)) == 0.5 * MAX_DEPTH
    grouped = "+".join("(" + "+".join(["t"] * 10) + ")" for _ in range(MAX_NODES // 22))
    n = 10 * (MAX_NODES // 22)
    assert float(rbjax.Expression(grouped)(0.25)) == 0.25 * n
    assert len(grouped) <= MAX_LENGTH


def test_expression_parameters_are_numbers():
    """params = {A = true} was read as A = 1.0, through Expression as well."""
    for value, kind in ((True, "a boolean"), ("0.5", "a string"), ([0.5], "not a finite")):
        with pytest.raises(ExpressionError, match=kind):
            rbjax.Expression("A*t", A=value)
    with pytest.raises(ExpressionError, match="reserved or invalid"):
        rbjax.Expression("t", **{"if": 1.0})


def test_a_deep_expression_in_a_file_names_its_field(tmp_path):
    text = _edit('f = "A*sin(2*pi*t)"', 'f = "' + "+".join(["t"] * 999) + '"')
    with pytest.raises(ValueError, match=r"^joints\[1\]\.f: the expression has 1997 terms"):
        _load_text(tmp_path, text)


# --------------------------------------------------------------------------- the command line


CLI_CASES = {  # one file per class of malformed input, and what the one line must name
    "type": (_edit("scalable = false", 'scalable = "false"'), "bodies[1].scalable = "),
    "string": (_edit("mass = 0.5", 'mass = "0.5"'), "bodies[1].mass = "),
    "shape": (_edit("gravity = [0.0, 0.0, -9.81]", "gravity = [0.0, -9.81]"), "gravity = "),
    "nan": (_edit("mass = 1.0", "mass = nan"), "bodies[0].mass = nan"),
    "utf8": (TEXT.encode().replace(b'"rod"', b'"r\xf6d"'), "byte 0xf6 at line 12"),
    "syntax": (_edit("timestep = 0.001", "timestep = = 1"), "not valid TOML"),
    "nesting": (_edit("gravity = [0.0, 0.0, -9.81]", "gravity = " + "[" * 3000), "line 2"),
    "expression": (_edit('f = "A*sin(2*pi*t)"', 'f = "' + "+".join(["t"] * 999) + '"'), "f: "),
}


@pytest.mark.parametrize("case", sorted(CLI_CASES))
@pytest.mark.parametrize("command", ["check", "simulate"])
def test_the_command_line_exits_2_with_one_line(tmp_path, capsys, case, command):
    """`rbjax check/simulate FILE.toml` on a malformed file: exit 2 and one line naming the
    field (or the line) and the fix; UTF-8, nesting and expressions gave tracebacks."""
    content, needle = CLI_CASES[case]
    path = tmp_path / "bad.toml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    args = [command, str(path)] + (["--out", str(tmp_path / "run.npz")] * (command == "simulate"))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rbjax {command}: error: ") and "Fix:" in err and needle in err, err
    assert "Traceback" not in err and err.count("\n") == 1


# ------------------------------------------------------------------------------- the writer


ALL = """format = "rbjax-model 1"
gravity = [0.0, -1.5, -9.81]
timestep = 0.002
formulation = "ScalableDAE"
baumgarte = [4.0, 2.5]
merge_welded = true

[[bodies]]
name = "a \\"quoted\\" \\\\ back\\tslash\\nnew line \\u007f é"
mass = 1.0
inertia = [[0.5, 0.01, 0.0], [0.01, 0.6, 0.0], [0.0, 0.0, 0.7]]

[[bodies]]
name = "b"
mass = 2
inertia = [1, 2, 2.5]
scalable = true

[[bodies]]
name = "c"
mass = 1.5
inertia = [0.3, 0.3, 0.3]

[[bodies]]
name = "d"
mass = 0.5
inertia = [0.1, 0.1, 0.1]

[[bodies]]
name = "bolt"
mass = 0.05
point = true

[[joints]]
type = "Spherical"
body_i = "ground"
body_j = "a \\"quoted\\" \\\\ back\\tslash\\nnew line \\u007f é"
s_j = [0.1, 0.2, 0.3]

[[joints]]
type = "Revolute"
name = "hinge ☃"
body_i = "a \\"quoted\\" \\\\ back\\tslash\\nnew line \\u007f é"
body_j = "b"
s_i = [0.5, 0.0, 0.0]
z_i = [0.0, 1.0, 0.0]
x_i = [1.0, 0.0, 0.0]
z_j = [0.0, 0.0, 1.0]
x_j = [0.0, 1.0, 0.0]

[[joints]]
type = "Universal"
body_i = "b"
body_j = "c"
z_i = [1.0, 0.0, 0.0]
z_j = [0.0, 1.0, 0.0]

[[joints]]
type = "Cylindrical"
body_i = "c"
body_j = "d"

[[joints]]
type = "Translational"
body_i = "c"
body_j = "d"
z_i = [0.0, 0.6, 0.8]

[[joints]]
type = "Fixed"
body_i = "d"
body_j = "bolt"
s_i = [0.0, 0.0, 0.2]

[[joints]]
type = "Distance"
body_i = "ground"
body_j = "c"
length = 1.25

[[joints]]
type = "Parallel"
body_i = "ground"
body_j = "b"

[[joints]]
type = "Perpendicular"
body_i = "ground"
body_j = "c"
z_i = [1.0, 0.0, 0.0]
z_j = [0.0, 0.0, 1.0]

[[joints]]
type = "PointOnLine"
body_i = "b"
body_j = "d"

[[joints]]
type = "RotationDriver"
body_i = "ground"
body_j = "b"
f = "A*sin(w*t) + é"
params = { A = 0.5, w = 3.0, "é" = 0.125 }

[[joints]]
type = "TranslationDriver"
body_i = "c"
body_j = "d"
f = 0.25

[[forces]]
type = "PointForce"
body = "b"
point_body = [0.0, 0.1, 0.0]
force_world = [1.0, 2.0, 3.0]
frame = "body"

[[forces]]
type = "BodyTorque"
body = "c"
torque_body = [0.0, 0.0, 0.5]
frame = "world"

[[forces]]
type = "TranslationalSpringDamper"
body_i = "ground"
body_j = "c"
s_i = [0.0, 0.0, 1.0]
s_j = [0.0, 0.0, 0.0]
stiffness = 10.0
damping = 0.5
rest_length = 0.75

[forces.actuator]
control = "0.2*sin(t)"

[[forces]]
type = "RotationalSpringDamper"
body_i = "a \\"quoted\\" \\\\ back\\tslash\\nnew line \\u007f é"
body_j = "b"
axis_i = [0.0, 1.0, 0.0]
axis_j = [0.0, 1.0, 0.0]
ref_i = [1.0, 0.0, 0.0]
ref_j = [0.0, 0.0, 1.0]
stiffness = 2.0
rest_angle = -1.0

[forces.actuator]
name = "servo"
gain = [3.0, 0.0, 0.0]
bias = [0.0, -3.0, -0.1]
gear = 2.0
offset = 0.1
ctrl_range = [-1.0, 1.0]
force_range = [-5.0, 5.0]
control = 0.5

[[forces]]
type = "AxialSpringDamper"
body_i = "c"
body_j = "d"
s_i = [0.0, 0.0, 0.0]
s_j = [0.0, 0.0, 0.0]
axis_i = [0.0, 0.0, 1.0]

[forces.actuator]
control = { values = [0.0, 0.5, -0.25], dt = 0.05, t0 = 0.1, hold = "linear" }
"""


def _same(a, b):
    la = jax.tree_util.tree_leaves_with_path(eqx.filter(a, eqx.is_array))
    lb = jax.tree.leaves(eqx.filter(b, eqx.is_array))
    assert len(la) == len(lb)
    for (path, x), y in zip(la, lb, strict=True):
        assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)
        assert np.asarray(x).dtype == np.asarray(y).dtype, jax.tree_util.keystr(path)


def test_the_writer_round_trips_every_field_the_reader_accepts(tmp_path):
    """Every joint type, every force with its options, every actuator field and kind of
    control, parameters (one named 'é', a key TOML must quote), names with quotes, backslashes,
    control characters and non-ASCII letters, welded point masses, a scalable body, the
    formulation, Baumgarte, the timestep: load → save → load gives the same arrays, names and
    static fields, and saving again gives the same text (UTF-8 bytes on every locale)."""
    first = _load_text(tmp_path, ALL)
    model = first.model
    a_name = 'a "quoted" \\ back\tslash\nnew line \x7f é'
    assert model.merged is not None and model.merged.names[0] == a_name
    assert model.scalable[model.names.index("b")] and first.timestep == 0.002
    rbjax.save(tmp_path / "out.toml", model, timestep=first.timestep)
    raw = (tmp_path / "out.toml").read_bytes()
    assert "é".encode() in raw
    again = rbjax.load(tmp_path / "out.toml")
    _same(model, again.model)
    assert jax.tree.structure(model) == jax.tree.structure(again.model)  # static fields too
    assert again.model.merged.names == model.merged.names
    assert again.timestep == first.timestep
    drivers = [j for j in again.model.merged.source[1] if type(j).__name__ == "RotationDriver"]
    assert drivers[0].f.source == "A*sin(w*t) + é"
    rbjax.save(tmp_path / "twice.toml", again.model, timestep=again.timestep)
    assert (tmp_path / "twice.toml").read_bytes() == raw


def test_the_writer_round_trips_the_initial_state(tmp_path):
    text = (
        ONE
        + "[initial]\nt = 0.5\nq = [[1.0, 2, 3, 0.6, 0.8, 0, 0]]\nu = [[0.1, 0, 0, 0, 1, 2, 3]]\n"
    )
    first = _load_text(tmp_path, text)
    rbjax.save(tmp_path / "out.toml", first.model, first.state)
    again = rbjax.load(tmp_path / "out.toml")
    for x in ("t", "q", "u"):
        assert np.array_equal(getattr(first.state, x), getattr(again.state, x))


def test_the_writer_refuses_what_the_reader_would_refuse(tmp_path):
    """save names what a file cannot hold instead of writing a file that load refuses (or a
    TypeError, a UnicodeEncodeError, a timestep of true written as 1.0)."""
    path = tmp_path / "v.toml"
    act = rbjax.Actuator(control=[0.5, 0.25])
    force = rbjax.AxialSpringDamper(
        rbjax.GROUND, 0, s_i=[0, 0, 0], s_j=[0, 0, 0], axis_i=[0, 0, 1], actuator=act
    )
    model = rbjax.Model(rbjax.Body(1.0, [1.0, 1.0, 1.0]), forces=[force])
    with pytest.raises(ModelFileError, match=r"forces\[0\]\.actuator\.control is 2 .*Fix:"):
        rbjax.save(path, model)
    plain = rbjax.Model(rbjax.Body(1.0, [1.0, 1.0, 1.0]))
    for timestep in (-0.001, 0.0):  # (True is refused too; the tests' type checker stops it first)
        with pytest.raises(ModelFileError, match="timestep = .* is not a positive number. Fix:"):
            rbjax.save(path, plain, timestep=timestep)
    with pytest.raises(ModelFileError, match=r"bodies\[0\] is named 'ground'.*Fix:"):
        rbjax.save(path, rbjax.Model(rbjax.Body(1.0, [1.0, 1.0, 1.0], name="ground")))
    with pytest.raises(ModelFileError, match="UTF-8 cannot encode .*Fix:"):
        rbjax.save(path, rbjax.Model(rbjax.Body(1.0, [1.0, 1.0, 1.0], name="a\ud800")))


# ---------------------------------------------------------------------------------- fuzzing


def _toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


class Raw(str):
    """TOML text written as it is (a date, a value nested thousands of times)."""


def _toml_value(v) -> str:
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return (
            "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
        )
    if isinstance(v, str):
        return _toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{_toml_string(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


def _toml(doc: dict) -> str:
    """Every value inline, one key a line: the same document as sections to tomllib."""
    return "".join(f"{_toml_string(k)} = {_toml_value(v)}\n" for k, v in doc.items())


MECHANISM = {
    "format": "rbjax-model 1",
    "gravity": [0.0, 0.0, -9.81],
    "timestep": 0.001,
    "formulation": "ScalableDAE",
    "baumgarte": [1.0, 2.0],
    "merge_welded": False,
    "bodies": [
        {"name": "crank", "mass": 1.0, "inertia": [0.001, 0.01, 0.01], "scalable": False},
        {"name": "rod", "mass": 0.5, "inertia": [[0.02, 0, 0], [0, 0.02, 0], [0, 0, 0.0005]]},
        {"name": "bolt", "mass": 0.01, "point": True},
    ],
    "joints": [
        {"type": "Revolute", "name": "pin", "body_i": "ground", "body_j": "crank", "z_i": [0, 1, 0]},
        {"type": "Fixed", "body_i": "rod", "body_j": "bolt", "s_i": [0.0, 0.0, 0.1]},
        {"type": "Distance", "body_i": "crank", "body_j": "rod", "length": 0.3},
        {"type": "RotationDriver", "body_i": "ground", "body_j": "crank", "z_i": [0, 0, 1],
         "f": "A*sin(2*pi*t)", "params": {"A": 0.5}},
    ],
    "forces": [
        {"type": "RotationalSpringDamper", "body_i": "crank", "body_j": "rod",
         "axis_i": [0, 1, 0], "axis_j": [0, 1, 0], "ref_i": [1, 0, 0], "ref_j": [1, 0, 0],
         "stiffness": 2.0, "damping": 0.05,
         "actuator": {"gain": [1.0, 0.0, 0.0], "ctrl_range": [-1.0, 1.0], "gear": 2.0,
                      "control": {"values": [0.0, 1.0], "dt": 0.1, "hold": "zero"}}},
        {"type": "PointForce", "body": "rod", "point_body": [0, 0, 0], "force_world": [1, 0, 0],
         "frame": "body"},
    ],
}  # fmt: skip
FREE = {
    "format": "rbjax-model 1",
    "bodies": [{"name": "top", "mass": 2.0, "inertia": [1.0, 1.0, 0.5]}],
    "forces": [
        {"type": "BodyTorque", "body": "top", "torque_body": [0.0, 0.0, 1.0]},
        {"type": "AxialSpringDamper", "body_i": "ground", "body_j": "top", "s_i": [0, 0, 0],
         "s_j": [0, 0, 0], "axis_i": [0, 0, 1], "actuator": {"control": "0.1*t", "offset": 0.2}},
    ],
    "initial": {"t": 0.0, "q": [[0, 0, 1.0, 1, 0, 0, 0]], "u": [[0, 0, 0, 0, 0, 0, 3.0]]},
}  # fmt: skip

# The field types, written here independently of the reader: what a field may hold.
KINDS = {
    "format": "str", "gravity": "vec3", "timestep": "num", "formulation": "str",
    "baumgarte": "vec2", "merge_welded": "bool", "bodies": "tables", "joints": "tables",
    "forces": "tables", "initial": "table", "name": "str", "mass": "num", "inertia": "inertia",
    "scalable": "bool", "point": "bool", "type": "str", "body_i": "str", "body_j": "str",
    "body": "str", "s_i": "vec3", "s_j": "vec3", "z_i": "vec3", "z_j": "vec3", "x_i": "vec3",
    "x_j": "vec3", "length": "num", "f": "expr", "params": "table", "axis_i": "vec3",
    "axis_j": "vec3", "ref_i": "vec3", "ref_j": "vec3", "stiffness": "num", "damping": "num",
    "rest_length": "num", "rest_angle": "num", "point_body": "vec3", "force_world": "vec3",
    "torque_body": "vec3", "frame": "str", "actuator": "table", "gain": "vec3", "bias": "vec3",
    "gear": "num", "offset": "num", "ctrl_range": "vec2", "force_range": "vec2",
    "control": "control", "values": "samples", "dt": "num", "t0": "num", "hold": "str",
    "t": "num", "q": "rows7", "u": "rows7",
}  # fmt: skip
# the keys a file must have: everywhere, and in a joint or force table by its type
REQUIRED = {"format", "bodies", "bodies.name", "bodies.mass", "joints.type", "joints.body_i",
            "joints.body_j", "forces.type", "initial.q", "control.values", "control.dt"}  # fmt: skip
REQUIRED_BY_TYPE = {
    "Distance": {"length"},
    "PointForce": {"body", "point_body", "force_world"},
    "BodyTorque": {"body", "torque_body"},
    "RotationalSpringDamper": {"body_i", "body_j", "axis_i", "axis_j", "ref_i", "ref_j", "stiffness"},
    "AxialSpringDamper": {"body_i", "body_j", "s_i", "s_j", "axis_i"},
}  # fmt: skip


def _kind(path) -> str:
    if len(path) > 1 and path[-2] == "params":
        return "num"
    return "table" if isinstance(path[-1], int) else KINDS[path[-1]]


def _required(base, path) -> bool:
    """Whether the file must have this key (by this test's own table)."""
    names = [p for p in path if isinstance(p, str)]
    if ".".join(names[-2:]) in REQUIRED or ".".join(names) in REQUIRED:
        return True
    if len(path) == 3 and path[0] in ("joints", "forces"):
        return path[2] in REQUIRED_BY_TYPE.get(base[path[0]][path[1]]["type"], ())
    body = base["bodies"][path[1]] if len(path) == 3 and path[0] == "bodies" else {}
    return path[-1] == "inertia" and not body.get("point", False)


def _number(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or isinstance(x, Raw):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _numbers(x, n=None) -> bool:
    return isinstance(x, list) and (len(x) == n if n else len(x) > 0) and all(map(_number, x))


def _admissible(kind: str, v) -> bool:
    """Whether a value has the field's type (the reader may still refuse its value)."""
    if isinstance(v, Raw):
        return False
    return {
        "str": lambda: isinstance(v, str),
        "bool": lambda: isinstance(v, bool),
        "num": lambda: _number(v),
        "vec3": lambda: _numbers(v, 3),
        "vec2": lambda: _numbers(v, 2),
        "inertia": lambda: (
            _numbers(v, 3)
            or (isinstance(v, list) and len(v) == 3 and all(_numbers(r, 3) for r in v))
        ),
        "samples": lambda: _numbers(v),
        "rows7": lambda: isinstance(v, list) and len(v) > 0 and all(_numbers(r, 7) for r in v),
        "expr": lambda: isinstance(v, str) or _number(v),
        "control": lambda: isinstance(v, (str, dict)) or _number(v),
        "table": lambda: isinstance(v, dict),
        "tables": lambda: isinstance(v, list) and all(isinstance(r, dict) for r in v),
    }[kind]()


def _fields(doc, prefix=()):
    """Every (path, value) of a document: tables, arrays of tables and leaves."""
    for key, value in doc.items():
        here = (*prefix, key)
        yield here, value
        if isinstance(value, dict):
            yield from _fields(value, here)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for k, item in enumerate(value):
                yield (*here, k), item
                yield from _fields(item, (*here, k))


def _dotted(path) -> str:
    return "".join(
        f"[{p}]" if isinstance(p, int) else ("." if i else "") + p for i, p in enumerate(path)
    )


WRONG = [
    True, False, "false", "1.0", "abc", "", 0, 7, -1.5, 2.5, 1e300, -1e300, 1e-300, 5e-324,
    10**30, 10**400,
    math.nan, math.inf, -math.inf, [], [1.0], [1.0, 2.0], [0.0, 0.0, 1.0], [[1.0, 0.0, 0.0]],
    [[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]], ["a", "b", "c"], [True, False, True], [[[1.0]]],
    {}, {"x": 1.0}, {"values": [1.0], "dt": 0.1}, {"source": 1.0}, Raw("1979-05-27"), Raw("07:32:00"),
    Raw("[" * 20 + "]" * 20), Raw("[" * 3000 + "]" * 3000), Raw("{a = " * 50 + "1" + "}" * 50),
]  # fmt: skip


def _check_error(err: Exception, path) -> None:
    text = str(err)
    assert isinstance(err, ValueError) and "Fix:" in text, repr(err)
    assert re.match(r"^(\S+\.toml: line \d+|[a-z_]+(\[\d+\])?[.:\[ =]|model:)", text), text
    assert path is None or _dotted(path) in text, (text, _dotted(path))


@given(
    base=st.sampled_from([MECHANISM, FREE]),
    choice=st.integers(0, 10**6),
    action=st.sampled_from(["replace", "replace", "replace", "drop", "rename"]),
    value=st.sampled_from(WRONG),
)
def test_fuzz_mutated_model_files_load_or_name_the_field(
    tmp_path_factory, base, choice, action, value
):
    """One field of a valid file replaced by a value of another type (or its key dropped or
    misspelt): load returns a model only if the value has the field's type (by this test's
    own table) or the dropped key is optional; otherwise a ValueError with a "Fix:" that names
    the field's path. Never another exception."""
    doc = json.loads(json.dumps(base))
    paths = [p for p, _ in _fields(doc) if not isinstance(p[-1], int) or action == "replace"]
    path = paths[choice % len(paths)]
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    if action == "drop" and isinstance(path[-1], str):
        del parent[path[-1]]
    elif action == "rename" and isinstance(path[-1], str):
        parent[path[-1] + "x"] = parent.pop(path[-1])
    else:
        action = "replace"
        parent[path[-1]] = value
    file = tmp_path_factory.mktemp("fuzz") / "m.toml"
    file.write_text(_toml(doc), encoding="utf-8")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # an assembled initial state
            rbjax.load(file)
    except ValueError as err:
        nested = max(value.count("["), value.count("{")) if isinstance(value, Raw) else 0
        if action == "replace" and nested > MAX_NESTING:
            _check_error(err, None)
            assert "nested more than" in str(err)
        elif action == "replace" and not _admissible(_kind(path), value):
            _check_error(err, path)
        elif action == "drop" and _required(base, path):
            _check_error(err, path)
            assert "is missing" in str(err)
        elif action == "rename":  # the misspelt key, or the key it should be if required
            missing = _required(base, path) and f"{_dotted(path)}: is missing" in str(err)
            free = path[-2:-1] == ("params",)  # parameter names are free: f names the unknown one
            _check_error(err, None if missing or free else (*path[:-1], path[-1] + "x"))
        else:
            _check_error(err, None)
        return
    assert action != "rename" or path[-2:-1] == ("params",)
    if action == "replace":
        assert _admissible(_kind(path), value), (_dotted(path), value)
    else:
        assert not _required(base, path), _dotted(path)


@given(data=st.binary(max_size=300), at=st.integers(0, 10**6))
def test_fuzz_random_bytes_are_a_named_error(tmp_path_factory, data, at):
    """Random bytes spliced into a valid file: a model or a ValueError with a "Fix:"."""
    raw = _toml(MECHANISM).encode()
    k = at % len(raw)
    file = tmp_path_factory.mktemp("bytes") / "m.toml"
    file.write_bytes(raw[:k] + data + raw[k + len(data) // 2 :])
    try:
        rbjax.load(file)
    except ValueError as err:
        assert "Fix:" in str(err), repr(err)


TOKENS = ["t", "1", "2.5", "pi", "A", "sin(", "atan2(", "clip(", ")", "(", ",", "+", "-", "*",
          "/", "**", "%", "<", "==", " if ", " else ", "not ", "[", "]", "lambda:", ".x", "1e999"]  # fmt: skip
CLOSE = {"(": ")", "sin(": ")", "[": "]", "{": "}"}


def _nested(spec) -> str:
    """``t`` nested n times in one construct: "((t))", "--t", "t+t+t", "1 if t else t"."""
    opener, n = spec
    return opener * n + "t" + CLOSE.get(opener, "") * n


OPENERS = ["(", "-", "sin(", "[", "{", "not ", "t+", "t**", "~", "1 if t else ", "t<"]


def test_any_nesting_of_any_construct_is_an_expression_or_a_named_error():
    """Every construct nested 1 to 2100 times (a 999-term sum raised RecursionError)."""
    for opener in OPENERS:
        for n in (1, 99, 100, 101, 199, 200, 300, 999, 1999, 2100):
            try:
                rbjax.Expression(_nested((opener, n)), where="f")
            except ExpressionError as err:
                assert str(err).startswith("f: ") and "Fix:" in str(err)


@given(
    st.one_of(
        st.text(max_size=60),
        st.lists(st.sampled_from(TOKENS), max_size=60).map("".join),
        st.tuples(st.sampled_from(OPENERS), st.integers(0, 2100)).map(_nested),
    )
)
def test_fuzz_expressions_compile_or_name_the_problem(source):
    """Any text: an Expression, or an ExpressionError (a ValueError) with a "Fix:" naming the
    field; never RecursionError, MemoryError or another exception."""
    try:
        rbjax.Expression(source, where="f", A=0.5)
    except ExpressionError as err:
        assert str(err).startswith("f: ") and "Fix:" in str(err)
