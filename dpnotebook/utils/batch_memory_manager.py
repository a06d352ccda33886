"""``opacus.utils.batch_memory_manager`` under dpnotebook.

>>> BatchMemoryManager.__module__
'dpnotebook.privacy.batch_memory'
"""

from dpnotebook.privacy.batch_memory import BatchMemoryManager

__all__ = ["BatchMemoryManager"]
