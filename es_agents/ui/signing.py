"""Signed decisions from the run page: the page signs, the server never sees the key.

For a run at a gate, the page gets the exact bytes a signed approval and a signed
rejection cover (``core.approvals.signed_payload``: the pause, the decision, the
signed-in approver, an expiry), with a slot for the key's id. The approver picks
their private key file (``es-agents keys new``); ``static/sign.js`` reads it in the
browser, derives the key id from its public half, fills the slot and signs with
WebCrypto's Ed25519. Only the key id, the signature and the expiry are posted; the
worker verifies them against the registered keys, as it does ``approve --key``.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Any

from es_agents.core.approvals import Pause, signed_payload
from es_agents.core.commands import Approve, Reject

KEY_ID_SLOT = "__KEY_ID__"
SIGNED_FOR = timedelta(minutes=15)


def signing(pause: Pause | None, by: str | None) -> dict[str, str] | None:
    """What the page signs for each decision on ``pause`` by ``by`` (None: no
    pause at a gate, or nobody signed in)."""
    if pause is None or by is None:
        return None
    expires = (datetime.now(UTC) + SIGNED_FOR).replace(microsecond=0)

    def payload(decision: str) -> str:
        return signed_payload(pause, decision, by, KEY_ID_SLOT, expires).decode()

    return {
        "approve": payload("approved"),
        "reject": payload("rejected"),
        "expires_at": expires.isoformat(),
    }


def signed_decision(
    action: str, run_id: str, by: str, form: Any
) -> Approve | Reject | str | None:
    """The signed decision a form posts (None: the form is not signed), or why it
    cannot be one."""
    signature = form.get("signature")
    if not signature:
        return None
    key_id, expires_at = form.get("key_id"), form.get("expires_at")
    if not isinstance(key_id, str) or not isinstance(expires_at, str):
        return "a signed decision needs its key id and expiry"
    try:
        raw = base64.b64decode(str(signature), validate=True)
        expires = datetime.fromisoformat(expires_at)
    except (binascii.Error, ValueError) as e:
        return f"a signed decision that does not read: {e}"
    reason = form.get("reason") or None
    fields = {
        "run_id": run_id,
        "by": by,
        "key_id": key_id,
        "signature": raw,
        "expires_at": expires,
    }
    if action == "approve":
        return Approve(**fields, comment=reason)
    return Reject(**fields, reason=reason)
