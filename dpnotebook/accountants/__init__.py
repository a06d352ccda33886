"""``opacus.accountants`` under dpnotebook: the accountants by their Opacus names.

``RDPAccountant`` is dpnotebook's; ``PRVAccountant`` is its PLD accountant (the same
privacy loss distribution, computed by Google's ``dp_accounting``); Opacus'
``GaussianAccountant`` ("gdp") is refused, its central-limit approximation can
under-report epsilon.

>>> acc = RDPAccountant()
>>> acc.step(noise_multiplier=1.0, sample_rate=0.01)
>>> len(acc), acc.history
(1, [(1.0, 0.01, 1)])
>>> GaussianAccountant()
Traceback (most recent call last):
...
dpnotebook.errors.UnsupportedOptionError: accountant='gdp' is not supported: ...
"""

from __future__ import annotations

from dpnotebook.privacy._engine import check_accountant_name
from dpnotebook.privacy.accounting import Accountant, PLDAccountant, RDPAccountant, create_accountant

__all__ = ["IAccountant", "RDPAccountant", "PRVAccountant", "GaussianAccountant", "create_accountant"]

#: Opacus' accountant interface.
IAccountant = Accountant
#: Opacus' PRV accountant: dpnotebook's privacy-loss-distribution accountant.
PRVAccountant = PLDAccountant


class GaussianAccountant:
    """Opacus' GDP accountant: refused by design (see the module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        check_accountant_name("gdp")
