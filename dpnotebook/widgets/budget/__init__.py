"""The privacy-budget explorer: state, plots and widget."""

from dpnotebook.widgets.budget.state import BudgetResult, BudgetState
from dpnotebook.widgets.budget.widget import PrivacyBudgetExplorer

__all__ = ["PrivacyBudgetExplorer", "BudgetState", "BudgetResult"]
