"""The privacy-attack explorer: state, plots and widget."""

from dpnotebook.widgets.attack.state import Attack, AttackState, AttackView, attacks_from_runs, simulated_attacks
from dpnotebook.widgets.attack.widget import PrivacyAttackExplorer

__all__ = ["PrivacyAttackExplorer", "AttackState", "AttackView", "Attack", "attacks_from_runs", "simulated_attacks"]
