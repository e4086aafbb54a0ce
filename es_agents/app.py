"""Where adapters are chosen from settings (the composition root, growing)."""

from __future__ import annotations

from es_agents.errors import ConfigError
from es_agents.models import ModelClient
from es_agents.payloads import ClaimCheck
from es_agents.settings import ModelSettings, Settings


def build_model(settings: ModelSettings | None = None) -> ModelClient:
    """The model client ``ES_AGENTS_MODEL_*`` describes, on the official SDK."""
    s = settings if settings is not None else ModelSettings()
    key = s.api_key.get_secret_value() if s.api_key is not None else None
    if s.provider == "openai":
        from es_agents.adapters.openai_model import OpenAIChatModel  # noqa: PLC0415

        return OpenAIChatModel(s.base_url, s.name, api_key=key, timeout=s.timeout)
    if s.provider == "anthropic":
        from es_agents.adapters.anthropic_model import AnthropicModel  # noqa: PLC0415

        return AnthropicModel(
            s.name,
            api_key=key,
            base_url=s.base_url,
            timeout=s.timeout,
            max_tokens=s.max_tokens,
        )
    raise ConfigError(f"unknown model provider {s.provider!r}")


def build_claim_check(settings: Settings) -> ClaimCheck | None:
    """The payload claim check ``ES_AGENTS_PAYLOADS`` asks for (S3 by default)."""
    if settings.payloads == "off":
        return None
    from es_agents.adapters.s3 import S3BlobStore  # noqa: PLC0415

    store = S3BlobStore(
        settings.s3_endpoint,
        settings.s3_bucket,
        settings.s3_access_key,
        settings.s3_secret_key.get_secret_value(),
    )
    return ClaimCheck(store, settings.payload_threshold)
