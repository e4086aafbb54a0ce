"""Payload bytes in an S3-compatible object store (boto3), keyed by content hash."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any, final

from es_agents.errors import PayloadUnavailable, Unavailable


@final
class S3BlobStore:
    """``BlobStore`` on one bucket. Objects are immutable: a key is its bytes' hash,
    so writing one twice writes the same bytes."""

    def __init__(
        self, endpoint: str, bucket: str, access_key: str, secret_key: str
    ) -> None:
        self.bucket = bucket
        self._config = (endpoint, access_key, secret_key)
        self._made: Any = None
        self._lock = threading.Lock()

    @property
    def _client(self) -> Any:
        """boto3's client, made on first use: importing and configuring boto3 takes
        a third of a second that a process which never touches a payload skips."""
        with self._lock:
            if self._made is None:
                import boto3  # noqa: PLC0415
                from botocore.config import Config  # noqa: PLC0415

                endpoint, access_key, secret_key = self._config
                self._made = boto3.client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id=access_key,
                    aws_secret_access_key=secret_key,
                    region_name="us-east-1",
                    config=Config(
                        s3={"addressing_style": "path"},
                        retries={"max_attempts": 5, "mode": "standard"},
                        connect_timeout=5,
                        read_timeout=60,
                    ),
                )
            return self._made

    def put(self, key: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (BotoCoreError, ClientError) as e:
            raise Unavailable(f"s3://{self.bucket}/{key}: cannot store: {e}") from e

    def get(self, key: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key)
            data: bytes = response["Body"].read()
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise PayloadUnavailable(
                    f"s3://{self.bucket}/{key}: no such object"
                ) from e
            raise Unavailable(f"s3://{self.bucket}/{key}: {e}") from e
        except BotoCoreError as e:
            raise Unavailable(f"s3://{self.bucket}/{key}: {e}") from e
        return data

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except (BotoCoreError, ClientError) as e:
            raise Unavailable(f"s3://{self.bucket}/{key}: cannot delete: {e}") from e

    def written_at(self, key: str) -> datetime | None:
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                return None
            raise Unavailable(f"s3://{self.bucket}/{key}: {e}") from e
        except BotoCoreError as e:
            raise Unavailable(f"s3://{self.bucket}/{key}: {e}") from e
        written: datetime = head["LastModified"]
        return written
