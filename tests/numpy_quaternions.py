"""Quaternion helpers in plain NumPy for the tests: an independent implementation of what the
tests check rbjax's quaternion algebra against (scalar first, a = (a0, a1, a2, a3))."""

from __future__ import annotations

import numpy as np


def qmul(a, b):
    """The Hamilton product a ⊗ b."""
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    return np.array(
        [
            a0 * b0 - a1 * b1 - a2 * b2 - a3 * b3,
            a0 * b1 + a1 * b0 + a2 * b3 - a3 * b2,
            a0 * b2 - a1 * b3 + a2 * b0 + a3 * b1,
            a0 * b3 + a1 * b2 - a2 * b1 + a3 * b0,
        ]
    )


def rotmat(a):
    """R of the quaternion a (normalised here)."""
    a = np.asarray(a, float) / np.linalg.norm(a)
    a0, v = a[0], a[1:]
    sk = np.array([[0, -v[2], v[1]], [v[2], 0, -v[0]], [-v[1], v[0], 0]])
    return (a0**2 - v @ v) * np.eye(3) + 2 * np.outer(v, v) + 2 * a0 * sk


def quat_axis(axis, angle):
    """The unit quaternion of a rotation by ``angle`` about ``axis``."""
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    return np.r_[np.cos(angle / 2), np.sin(angle / 2) * axis]
