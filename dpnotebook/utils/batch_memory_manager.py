"""``opacus.utils.batch_memory_manager`` under dpnotebook.

>>> BatchMemoryManager.__module__
'dpnotebook.privacy._data'
"""

from dpnotebook.privacy import BatchMemoryManager

__all__ = ["BatchMemoryManager"]
