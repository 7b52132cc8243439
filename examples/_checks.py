"""Shared by the mechanism examples: a dict of measured errors that prints PASS/FAIL lines."""

from __future__ import annotations


class Checks(dict):
    """Measured errors by key; ``check`` prints one line with PASS/FAIL against a tolerance."""

    failed: list

    def __init__(self, width: int = 52):
        super().__init__()
        self.failed = []
        self.width = width

    def check(self, key, label, err, tol):
        err = float(err)
        self[key] = err
        passed = err <= tol  # NaN fails
        if not passed:
            self.failed.append(key)
        mark = "PASS" if passed else "FAIL"
        print(f"  {label:{self.width}s} {err:10.2e}  (tol {tol:.0e})  {mark}")
