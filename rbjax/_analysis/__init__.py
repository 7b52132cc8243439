"""Analyses of a model and its motion: assembly, mobility, kinematic analysis, the pre-rollout
checks, invariants (energies, momenta) and gradient health. Public names are re-exported by
:mod:`rbjax`."""
