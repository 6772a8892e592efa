"""Budget-aware memory: store, recall and injection (arrives with the memory issue)."""

__all__: list[str] = []
