"""In-memory adapters for unit tests of the runtime on its ports."""

from __future__ import annotations

import threading
from typing import final

from es_agents.errors import PayloadUnavailable


@final
class InMemoryBlobStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = data

    def get(self, key: str) -> bytes:
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            raise PayloadUnavailable(f"{key}: no such object")
        return data
