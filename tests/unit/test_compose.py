"""docker-compose.yml offers the stack `es-agents dev up` runs: the same pinned
versions and endpoints, health checks, the bucket, and the example app's services.
(No Docker engine runs here; this checks the file against the dev stack's settings.)"""

import re
from pathlib import Path

from es_agents.dev.config import KAFKA_VERSION, S3PROXY_VERSION, DevSettings

COMPOSE = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()


def _services() -> dict[str, str]:
    body = COMPOSE.split("\nservices:\n", 1)[1].split("\nvolumes:\n", 1)[0]
    parts = re.split(r"(?m)^  (?=[a-z][a-z0-9-]*:\n)", body)
    return {p.split(":", 1)[0]: p for p in parts if p.strip()}


def test_images_are_pinned_to_the_dev_stack_versions() -> None:
    images = re.findall(r"image: (\S+)", COMPOSE)
    assert f"apache/kafka:{KAFKA_VERSION}" in images
    assert f"andrewgaul/s3proxy:s3proxy-{S3PROXY_VERSION}" in images
    assert all(":" in i and not i.endswith(":latest") for i in images), images


def test_the_endpoints_are_the_dev_stack_s() -> None:
    dev = DevSettings()
    for port in (dev.kafka_port, dev.postgres_port, dev.s3_port):
        assert f'"127.0.0.1:{port}:' in COMPOSE, port
    assert f"/data/{dev.s3_bucket}" in COMPOSE  # the bucket is made


def test_services_are_checked_and_the_example_app_is_there() -> None:
    services = _services()
    for name in ("kafka", "postgres", "s3"):
        assert "healthcheck:" in services[name], name
    for name in ("serve", "ui", "ticket-service"):
        assert 'profiles: ["app"]' in services[name], name
    # The worker and a projector, supervised: `es-agents serve`.
    assert '["serve", "--agent", "es_agents.lab.research:agent"' in services["serve"]
    assert "condition: service_healthy" in services["serve"]


def test_the_cluster_profile_has_three_replicated_brokers() -> None:
    services = _services()
    voters = "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
    assert f"KAFKA_CONTROLLER_QUORUM_VOTERS: {voters}" in COMPOSE
    assert "KAFKA_MIN_INSYNC_REPLICAS: 2" in COMPOSE
    for n in (1, 2, 3):
        node = services[f"kafka-{n}"]
        assert 'profiles: ["cluster"]' in node
        assert f"KAFKA_NODE_ID: {n}" in node
        assert "healthcheck:" in node


def test_kafka_keeps_its_log_on_the_volume_and_services_restart() -> None:
    services = _services()
    for name in ("kafka", "kafka-1", "kafka-2", "kafka-3"):
        node = services[name]
        mount = re.search(r"- (\S+):(/\S+)\n", node)
        assert mount, name
        if name == "kafka":
            assert f"KAFKA_LOG_DIRS: {mount.group(2)}" in node, name
        else:  # from the cluster's shared environment
            assert f"KAFKA_LOG_DIRS: {mount.group(2)}" in COMPOSE.split("services:")[0]
    for name, body in services.items():
        if name != "s3-bucket":  # a one-off job
            assert "restart: unless-stopped" in body, name
    assert 'profiles: ["app"]' in services["ui"]
