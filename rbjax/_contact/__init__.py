"""Unilateral contact with Coulomb friction (issue 38): the laws as proximal maps and the
percussions of one Moreau–Jean step (:mod:`rbjax._contact.prox`)."""
