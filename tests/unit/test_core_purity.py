import subprocess
import sys


def test_core_imports_no_io_libraries() -> None:
    code = (
        "import sys, es_agents.core; "
        "bad = [m for m in ('confluent_kafka', 'psycopg', 'boto3', 'botocore', "
        "'http.client', 'urllib3', 'requests', 'fastavro') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""
