"""S3Proxy (Apache-2.0, from Maven Central) with its filesystem backend."""

from __future__ import annotations

import signal
import socket

from es_agents.dev.config import S3PROXY_VERSION, DevSettings
from es_agents.dev.process import (
    ManagedProcess,
    require_free_port,
    require_tool,
    run,
    wait_for,
)
from es_agents.errors import Unavailable


class DevS3:
    name = "s3"

    def __init__(self, dev: DevSettings) -> None:
        self.dev = dev
        self.dir = dev.root / "s3proxy"
        self.jar = self.dir / f"s3proxy-{S3PROXY_VERSION}-jar-with-dependencies.jar"
        self.proc = ManagedProcess(
            "s3", self.dir / "s3proxy.pid", self.dir / "s3proxy.log"
        )

    @property
    def endpoint(self) -> str:
        return self.dev.s3_endpoint

    def install(self) -> None:
        if self.jar.exists():
            return
        require_tool("java", ["openjdk-17-jre-headless"])
        mvn = require_tool("mvn", ["maven"])
        self.dir.mkdir(parents=True, exist_ok=True)
        run(
            [
                mvn,
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact=org.gaul:s3proxy:{S3PROXY_VERSION}:jar:jar-with-dependencies",
                f"-DoutputDirectory={self.dir}",
            ],
            f"fetching S3Proxy {S3PROXY_VERSION}",
        )

    def start(self) -> bool:
        if self.proc.pid() is not None:
            self.wait_ready()
            return False
        require_free_port(self.dev.host, self.dev.s3_port, "s3")
        self.install()
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "s3proxy.conf"
        conf.write_text(
            f"s3proxy.endpoint=http://{self.dev.host}:{self.dev.s3_port}\n"
            "s3proxy.authorization=aws-v2-or-v4\n"
            f"s3proxy.identity={self.dev.s3_access_key}\n"
            f"s3proxy.credential={self.dev.s3_secret_key}\n"
            "jclouds.provider=filesystem\n"
            f"jclouds.filesystem.basedir={data}\n"
        )
        self.proc.spawn(
            ["java", "-Xmx256m", "-jar", str(self.jar), "--properties", str(conf)]
        )
        self.wait_ready()
        self._create_bucket()
        return True

    def client(self) -> object:
        import boto3  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.dev.s3_access_key,
            aws_secret_access_key=self.dev.s3_secret_key,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
                connect_timeout=2,
                read_timeout=5,
            ),
        )

    def _create_bucket(self) -> None:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        s3 = self.client()
        try:
            s3.create_bucket(Bucket=self.dev.s3_bucket)  # type: ignore[attr-defined]
        except ClientError as e:
            if e.response["Error"]["Code"] not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise Unavailable(
                    f"cannot create bucket {self.dev.s3_bucket}: {e}"
                ) from e

    def answers(self) -> bool:
        try:
            with socket.create_connection(
                (self.dev.host, self.dev.s3_port), timeout=0.5
            ):
                pass
        except OSError:
            return False
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        try:
            self.client().list_buckets()  # type: ignore[attr-defined]
        except (BotoCoreError, ClientError):
            return False
        return True

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.pid() is None:
                raise Unavailable(
                    f"s3proxy exited during start:\n{self.proc.log_tail()}"
                )
            return self.answers()

        if not wait_for(ready, timeout, interval=0.2):
            raise Unavailable(f"s3proxy did not answer in {timeout}s")

    def stop(self) -> bool:
        return self.proc.stop(signal.SIGTERM, timeout=30)
