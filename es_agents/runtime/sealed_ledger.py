"""The effect ledger of an agent that encrypts its payloads: a call's stored result
is encrypted under its run's key (the dedupe table keeps it for reconciliation),
so forgetting the run's key forgets the result too."""

from __future__ import annotations

from dataclasses import replace
from typing import final

from es_agents.ports import EffectLedger, EffectRecord, EffectStatus
from es_agents.vault import PREFIX, Cipher


@final
class SealedLedger:
    """An effect ledger whose stored results are encrypted under their run's key
    (the dedupe table keeps a call's result for reconciliation)."""

    def __init__(self, inner: EffectLedger, cipher: Cipher) -> None:
        self.inner = inner
        self.cipher = cipher

    @staticmethod
    def _run(key: str) -> str:
        return key.rsplit(":", 1)[0]  # idempotency keys are run_id:step

    def _open(self, key: str, record: EffectRecord) -> EffectRecord:
        if record.result_json is None or not record.result_json.startswith(PREFIX):
            return record
        text = self.cipher.decrypt_text(self._run(key), record.result_json)
        return replace(record, result_json=text)

    def begin(self, key: str, run_id: str, step: int, tool: str) -> EffectRecord:
        return self._open(key, self.inner.begin(key, run_id, step, tool))

    def finish(self, key: str, result_json: str | None, error: str | None) -> None:
        if result_json is not None:
            result_json = self.cipher.encrypt_text(self._run(key), result_json)
        self.inner.finish(key, result_json, error)

    def release(self, key: str) -> None:
        self.inner.release(key)

    def get(self, key: str) -> EffectRecord | None:
        record = self.inner.get(key)
        return self._open(key, record) if record is not None else None

    def entries(self, run_prefix: str = "") -> list[tuple[str, str, EffectStatus]]:
        return self.inner.entries(run_prefix)
