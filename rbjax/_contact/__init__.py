"""Unilateral contact with Coulomb friction and joint limits (issue 38): the laws as proximal
maps and the percussions of one Moreau–Jean step (``prox.py``), the shapes against a plane and
their contact points (``shapes.py``), joint ranges as unilateral rows (``limits.py``), and the
time stepping (``stepping.py``, :class:`rbjax.MoreauJean`)."""
