"""Budget-aware memory: the store (recall, profiles and injection follow)."""

from ctxbudget.memory.store import MemoryStore, SQLiteMemoryStore
from ctxbudget.memory.types import DEFAULT_OWNER, InvalidMemory, Memory, MemoryLimits, NewMemory

__all__ = [
    "DEFAULT_OWNER",
    "InvalidMemory",
    "Memory",
    "MemoryLimits",
    "MemoryStore",
    "NewMemory",
    "SQLiteMemoryStore",
]
