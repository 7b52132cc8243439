"""``rbjax animate``: GIFs of an MJCF and a model-file run, the drawn geometry against MuJoCo's
own geom and joint poses, the inertia box against its definition, and each input error's
message.

Run files are written directly (rbjax._cli.runfile.write), so these tests do not depend on
``rbjax simulate``.
"""

import pathlib

import numpy as np
import pytest

import rbjax
from rbjax._cli import animate, main, runfile

mujoco = pytest.importorskip("mujoco")
Image = pytest.importorskip("PIL.Image")
pytest.importorskip("matplotlib")

MODELS = pathlib.Path(__file__).resolve().parents[1] / "examples" / "models"
SMALL = ["--dpi", "20", "--size", "2,2", "--no-progress"]


def _write_run(path, names, q):
    """A run file of saved positions q ([B,] T, nb, 7) at t = 0, 0.02, ... s."""
    batch = q.shape[0] if q.ndim == 4 else None
    t = 0.02 * np.arange(q.shape[-3])
    arrays = {"t": t, "q": q, "body_names": np.array(names)}
    runfile.write(str(path), arrays, {"model": "test", "batch": batch})
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Models and run files: the MJCF double pendulum swept through 11 joint configurations
    (rbjax states from MuJoCo's kinematics, MujocoSource.state: what is drawn does not depend
    on how the motion was computed, and no rollout has to compile), also as a batch of 2 (the
    second sample the same motion backwards); the
    same pendulum saved as a model file (.toml: same bodies, drawn as inertia boxes); and a
    model file with two other bodies."""
    d = tmp_path_factory.mktemp("animate")
    xml = str(MODELS / "double_pendulum.xml")
    dp = rbjax.load(xml, formulation=rbjax.ScalableDAE())
    angles = np.stack([np.linspace(1.0, 0.0, 11), np.linspace(-0.5, 1.0, 11)], axis=-1)
    q = np.stack([np.asarray(dp.source.state(qpos).q) for qpos in angles])
    toml, other = str(d / "double_pendulum.toml"), str(d / "other.toml")
    rbjax.save(toml, dp.model)  # no initial state: loading one checks it (compiles)
    bodies = [rbjax.Body(1.0, np.eye(3), name=name) for name in ("crank", "rod")]
    rbjax.save(other, rbjax.Model(bodies))
    return {
        "dir": d,
        "xml": xml,
        "toml": toml,
        "other": other,
        "run": _write_run(d / "dp.npz", dp.model.names, q),
        "batch": _write_run(d / "dp_batch.npz", dp.model.names, np.stack([q, q[::-1]])),
    }


def _frames(path):
    with Image.open(path) as im:
        frames = []
        for k in range(im.n_frames):
            im.seek(k)
            frames.append(np.asarray(im.convert("RGB"), dtype=float))
    return frames


def _moved(first, last):
    """The frames differ below the title (the bodies moved, not just the time)."""
    rows = first.shape[0] // 5
    return np.abs(first[rows:] - last[rows:]).max() > 0


def test_gif_of_an_mjcf_run(runs, capsys):
    out = runs["dir"] / "dp.gif"
    assert main(["animate", runs["xml"], runs["run"], "--out", str(out), *SMALL]) == 0
    # states saved every 20 ms drawn in real time at 30 fps: every 2nd, saved states 0, 2, ..., 10
    assert "6 frames at 30 fps (--every 2 of 11" in capsys.readouterr().out
    frames = _frames(out)
    assert len(frames) == 6 and _moved(frames[0], frames[-1])


def test_gif_of_a_model_file_run_with_every_and_a_batch_sample(runs, monkeypatch):
    out = runs["dir"] / "boxes.gif"
    args = ["animate", runs["toml"], runs["run"], "--out", str(out), *SMALL]
    assert main([*args, "--every", "5", "--view", "10,-80", "--fps", "5"]) == 0
    frames = _frames(out)  # saved states 0, 5, 10
    assert len(frames) == 3 and _moved(frames[0], frames[-1])
    monkeypatch.setattr(animate, "MAX_FRAMES", 4)  # the default --every: ceil(11 / 4) = 3
    out = runs["dir"] / "dp_batch.gif"
    args = ["animate", runs["xml"], runs["batch"], "--out", str(out), "--sample", "1", *SMALL]
    assert main(args) == 0
    assert len(_frames(out)) == 4  # saved states 0, 3, 6, 9
    saved = runfile.read(runs["batch"])
    model = rbjax.load(runs["xml"]).model
    t, q = animate.trajectory(saved, model, runs["batch"], runs["xml"], sample=1)
    assert np.array_equal(q, saved["q"][0, ::-1]) and np.array_equal(t, saved["t"])


def _error(args, capsys):
    assert main(["animate", *args]) == 2
    return capsys.readouterr().err


def test_input_errors_name_the_fix(runs, capsys, monkeypatch):
    xml, run, d = runs["xml"], runs["run"], runs["dir"]
    gif = str(d / "m.gif")
    err = _error([xml, run, "--out", str(d / "m.png")], capsys)
    assert "'.png'" in err and "Fix: e.g. --out motion.gif" in err
    err = _error([xml, run, "--out", str(d / "missing" / "m.gif")], capsys)
    assert "does not exist. Fix: create it first" in err
    err = _error([runs["other"], run, "--out", gif], capsys)
    assert "bodies ['upper', 'lower'] but MODEL" in err and "has ['crank', 'rod']" in err
    assert "Fix: animate the run with the model that wrote it" in err
    err = _error([xml, runs["batch"], "--out", gif, "--sample", "2"], capsys)
    assert "holds 2 samples" in err and "between 0 and 1" in err
    err = _error([xml, run, "--out", gif, "--sample", "1"], capsys)
    assert "single run. Fix: leave out --sample" in err
    err = _error([xml, run, "--out", gif, "--view", "20"], capsys)
    assert "argument --view: '20' is not two numbers ELEV,AZIM" in err
    assert "Fix: e.g. --view 20,-60" in err
    err = _error([xml, run, "--out", gif, "--size", "0,2"], capsys)
    assert "positive" in err and "Fix: e.g. --size 6,5" in err
    from matplotlib import animation

    monkeypatch.setattr(animation.FFMpegWriter, "isAvailable", classmethod(lambda cls: False))
    err = _error([xml, run, "--out", str(d / "m.mp4")], capsys)
    assert "needs ffmpeg" in err and "install ffmpeg" in err and "write a .gif" in err
    assert not any(p.suffix in (".gif", ".mp4") and p.stem == "m" for p in d.iterdir())


BOXES = """<mujoco>
  <option><flag contact="disable"/></option>
  <worldbody>
    <geom type="plane" size="0 0 1"/>
    <geom type="box" pos="0.3 0.2 0.1" size="0.1 0.05 0.1" euler="0.3 0 0.2"/>
    <body name="arm" pos="0 0 1" euler="0.2 0.4 0">
      <joint name="shoulder" type="ball"/>
      <geom type="box" pos="0.2 0 0" size="0.2 0.04 0.03" euler="0.1 0.2 0.3" density="500"/>
      <body name="plate" pos="0.4 0 0" euler="0 0 0.5">
        <geom type="box" size="0.05 0.1 0.01" density="800"/>
        <body name="link" pos="0.05 0.1 0">
          <joint name="elbow" type="hinge" axis="1 0 0"/>
          <geom type="box" pos="0 0 -0.15" size="0.02 0.03 0.15" euler="0 0.3 0"/>
          <geom type="capsule" fromto="0 0 0 0 0.1 -0.3" size="0.02"/>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>"""


def _corners(points):
    """The distinct vertices of a set of faces, sorted (a box: its 8 corners)."""
    unique = np.unique(np.round(points.reshape(-1, 3), 12), axis=0)
    return unique[np.lexsort(unique.T[::-1])]


def test_geoms_and_joints_sit_where_mujoco_puts_them(tmp_path):
    """At a random qpos: every box geom's drawn corners are MuJoCo's (geom_xpos + geom_xmat ·
    (±size)), including a box on a body welded to its parent ("plate", merged into "arm") and a
    box on the world; the joint dots are at MuJoCo's joint anchors (xanchor); the infinite
    plane neither leaves the axis limits nor widens them."""
    path = tmp_path / "boxes.xml"
    path.write_text(BOXES)
    loaded = rbjax.load(str(path), formulation=rbjax.ScalableDAE())
    m = loaded.source.mjmodel
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    ball = rng.normal(size=4)
    d.qpos[:] = np.concatenate([ball / np.linalg.norm(ball), [0.7]])
    mujoco.mj_kinematics(m, d)
    scene = animate.build_scene(loaded)
    q = np.asarray(loaded.source.state(d.qpos.copy()).q)
    faces = animate.place(scene, q)
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
    world_box = None
    for g in range(m.ngeom):
        if m.geom_type[g] != mujoco.mjtGeom.mjGEOM_BOX:
            continue
        exact = d.geom_xpos[g] + (signs * m.geom_size[g]) @ d.geom_xmat[g].reshape(3, 3).T
        if loaded.source.body_of[m.geom_bodyid[g]] == rbjax.GROUND:
            world_box = exact
            continue
        drawn = _corners(faces[scene.geom == g])
        assert drawn.shape == (8, 3)
        np.testing.assert_allclose(drawn, _corners(exact), atol=1e-12)
    np.testing.assert_allclose(_corners(scene.static), _corners(world_box), atol=1e-12)
    assert set(scene.geom) == {2, 3, 4, 5}  # arm, plate, link: box, capsule; no inertia box

    points, coms = animate.joint_points(scene, q)
    anchors = d.xanchor[[0, 0, 1, 1]]  # ball: world side, arm side; hinge: arm side, link side
    np.testing.assert_allclose(points, anchors, atol=1e-12)
    np.testing.assert_allclose(coms[1:], q[[0, 0, 1], :3], atol=1e-15)

    centre, half, grid = animate.limits(scene, q[None])
    assert len(grid) == 18 and np.allclose(grid[..., 2], 0)  # 9 + 9 lines on z = 0
    lo, hi = centre - half, centre + half
    assert np.all(grid >= lo) and np.all(grid <= hi) and half.max() < 1.0


def test_inertia_box_has_the_mass_and_inertia_it_stands_for():
    """The second moment of a uniform box is mean(c cᵀ)/3 over its corners c, so
    I = m (tr S · 1 − S); here for a rotated, non-diagonal inertia, and a point mass, a rod and
    a plate get visible boxes."""
    rng = np.random.default_rng(1)
    rot = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    mass, inertia = 2.5, rot @ np.diag([0.3, 0.4, 0.5]) @ rot.T
    corners = _corners(animate.inertia_box(mass, inertia))
    assert corners.shape == (8, 3)
    second = corners.T @ corners / 8 / 3
    np.testing.assert_allclose(mass * (np.trace(second) * np.eye(3) - second), inertia, atol=1e-12)
    for moments in ([0.0, 0.0, 0.0], [0.0, 1.0, 1.0], [1.0, 1.0, 2.0]):
        sides = np.ptp(animate.inertia_box(1.0, np.diag(moments)).reshape(-1, 3), axis=0)
        assert sides.min() > 0 and np.isfinite(sides).all()


def test_default_stride_plays_in_real_time():
    """One frame per 1/fps s of simulated time (states saved every 3 ms, 30 fps: every 11th),
    coarser when that would exceed MAX_FRAMES frames."""
    assert animate._real_time(np.arange(1001) * 0.003, 30.0) == 11
    assert animate._real_time(np.arange(11) * 0.1, 30.0) == 1  # saves sparser than frames
    long = np.arange(100_001) * 0.003  # 300 s: 9000 real-time frames, capped
    assert animate._real_time(long, 30.0) == int(np.ceil(len(long) / animate.MAX_FRAMES))
