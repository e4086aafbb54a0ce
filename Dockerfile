# es-agents with the example agents, for docker-compose.yml's worker, projector and
# ticket-service services (profile "app"). Build: docker compose --profile app build
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE ./
COPY es_agents ./es_agents
COPY projectors ./projectors
COPY schemas ./schemas
COPY examples ./examples
RUN pip install --no-cache-dir .
ENTRYPOINT ["es-agents"]
