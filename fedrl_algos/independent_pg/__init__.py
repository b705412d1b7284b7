"""Independent policy gradient (no communication): the from-scratch baseline."""

from fedrl_algos.independent_pg.independent_pg import IndependentPG
from fedrl_algos.independent_pg.update import independent_pg_steps

__all__ = ["IndependentPG", "independent_pg_steps"]
