"""``opacus.accountants`` under dpnotebook (:mod:`dpnotebook._opacus.accountants`)."""

from dpnotebook._opacus.accountants import (
    GaussianAccountant,
    IAccountant,
    PRVAccountant,
    RDPAccountant,
    create_accountant,
)

__all__ = ["IAccountant", "RDPAccountant", "PRVAccountant", "GaussianAccountant", "create_accountant"]
