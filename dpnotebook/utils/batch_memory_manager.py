"""``opacus.utils.batch_memory_manager`` under dpnotebook."""

from dpnotebook.privacy import BatchMemoryManager

__all__ = ["BatchMemoryManager"]
