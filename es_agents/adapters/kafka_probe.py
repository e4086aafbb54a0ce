"""Whether the brokers answer at all: one metadata request with a deadline, and one
line that says why not (a refused login, an unknown host) when they do not."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, Producer

from es_agents.adapters.kafka_producer import _client
from es_agents.errors import Unavailable
from es_agents.settings import KafkaSettings

# Errors that say why brokers did not answer better than "all brokers are down".
_TELLING = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError._SSL,
        KafkaError._RESOLVE,
    }
)


def reachable(settings: KafkaSettings, timeout: float) -> None:
    """The brokers answer a metadata request within ``timeout`` seconds, or
    ``Unavailable`` says which ones did not. (A producer handle asks: the admin
    client's module alone costs a command line 40 ms of imports.)"""
    errors: list[KafkaError] = []  # what librdkafka met, e.g. a refused login
    conf = {
        **_client(settings.to_librdkafka()),
        "error_cb": errors.append,
        "allow.auto.create.topics": False,  # asking about a topic creates nothing
    }
    probe = Producer(conf)
    try:
        # One topic's metadata, not the cluster's: it may hold thousands of topics.
        probe.list_topics(topic=settings.events_topic, timeout=timeout)
    except KafkaException as e:
        probe.poll(0.1)  # serves the error callbacks queued meanwhile
        telling = [err for err in errors if err.code() in _TELLING] or errors
        why = f" ({telling[0].str()})" if telling else ""
        raise Unavailable(
            f"Kafka at {settings.bootstrap_servers} did not answer within "
            f"{timeout:g} s{why} (ES_AGENTS_BOOTSTRAP_SERVERS and the ES_AGENTS_SASL_*"
            " / ES_AGENTS_SSL_* settings; the dev stack starts with "
            "`es-agents dev up`)"
        ) from e
