"""The brokers the pool and broker tests run worker nodes on: the suite's Redis, RabbitMQ on
127.0.0.1:5672 (guest/guest), Amazon SQS as moto's local server (``moto_server``, a subprocess
on a free loopback port).

Each :class:`Broker` tells how many messages of some queues are still on the broker or held by
a worker (delivered and not acknowledged: prefetched, an ETA, running), and deletes the queues
a test made.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import redis

from governor.embedded import free_port

from .worker_nodes import Nodes

RABBITMQ = ("127.0.0.1", 5672)
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
REGION = "us-east-1"
SQS_KEY = "testing"


def reachable(address: tuple[str, int]) -> bool:
    try:
        with socket.create_connection(address, timeout=1.0):
            return True
    except OSError:
        return False


def node_names(nodes: Nodes) -> list[str]:
    """The names of the nodes still running (as ``worker_nodes`` names them)."""
    host = socket.gethostname()
    return [
        f"node{i}-{nodes.key}@{host}" for i, proc in enumerate(nodes.procs) if proc.poll() is None
    ]


class Broker:
    name = ""
    url = ""
    conf: dict[str, Any] = {}
    """App settings the nodes need for this broker."""

    def __init__(self) -> None:
        self.made: list[str] = []
        """Queues the test's nodes consume: :meth:`cleanup` deletes them."""

    def waiting(self, queues: list[str], nodes: Nodes) -> int:
        """Messages of ``queues`` on the broker or held by one of ``nodes``."""
        raise NotImplementedError

    def describe(self, queues: list[str]) -> str:
        """What of ``queues`` is left on the broker (for a failure's message)."""
        return ""

    def cleanup(self) -> None:
        """Delete the queues made (and what the transport made for them)."""


def _headline(payload: dict[str, Any]) -> str:
    """A kombu message's task, id, arguments and governor headers, in a line."""
    h = payload.get("headers") or {}
    mine = {k: v for k, v in h.items() if k.startswith("governor")}
    return f"{h.get('task')} {h.get('id')} {h.get('argsrepr')} eta={h.get('eta')} {mine}"


class RedisBroker(Broker):
    """kombu's Redis transport: a list per queue (and per priority), delivered messages in the
    ``unacked`` hash until acknowledged."""

    name = "redis"

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.conf = {}
        self.client = redis.Redis.from_url(url)

    def _lists(self, queue: str) -> list[bytes]:
        return [queue.encode(), *self.client.scan_iter(match=f"{queue}\x06\x16*", _type="list")]

    def waiting(self, queues: list[str], nodes: Nodes) -> int:
        queued = sum(int(self.client.llen(key)) for q in queues for key in self._lists(q))
        unacked = [json.loads(v) for v in self.client.hvals("unacked")]
        return queued + sum(1 for _, _, routing_key in unacked if routing_key in queues)

    def describe(self, queues: list[str]) -> str:
        lines = []
        for q in queues:
            for key in self._lists(q):
                for raw in self.client.lrange(key, 0, -1):
                    lines.append(f"queued on {key!r}: {_headline(json.loads(raw))}")
        for tag, raw in self.client.hgetall("unacked").items():
            payload, _, routing_key = json.loads(raw)
            if routing_key in queues:
                lines.append(f"unacked {tag!r} ({routing_key}): {_headline(payload)}")
        return "\n".join(lines)

    def cleanup(self) -> None:
        for queue in self.made:
            self.client.delete(*self._lists(queue), f"_kombu.binding.{queue}")
        self.client.close()


class RabbitBroker(Broker):
    """RabbitMQ: ready messages from a passive declare; what workers hold from ``celery
    inspect`` (reserved, scheduled, active), as unacknowledged messages are not counted there."""

    name = "rabbitmq"

    def __init__(self, url: str = RABBITMQ_URL) -> None:
        super().__init__()
        self.url = url
        self.conf = {}

    def waiting(self, queues: list[str], nodes: Nodes) -> int:
        from amqp.exceptions import NotFound
        from kombu import Connection

        ready = 0
        with Connection(self.url) as conn:
            for queue in queues:
                try:
                    ready += conn.channel().queue_declare(queue=queue, passive=True).message_count
                except NotFound:
                    continue
        return ready + held_by_workers(self.url, queues, nodes)

    def cleanup(self) -> None:
        from kombu import Connection

        with Connection(self.url) as conn:
            for queue in self.made:
                channel = conn.channel()
                with contextlib.suppress(Exception):
                    channel.queue_delete(queue)
                channel = conn.channel()
                with contextlib.suppress(Exception):
                    channel.exchange_delete(queue)


def held_by_workers(url: str, queues: list[str], nodes: Nodes) -> int:
    """Messages of ``queues`` the running nodes hold (``celery inspect`` reserved, scheduled
    and active, by the queue they came from)."""
    from celery import Celery

    names = node_names(nodes)
    if not names:
        return 0
    client = Celery("inspector", broker=url, set_as_current=False)
    try:
        inspect = client.control.inspect(destination=names, timeout=10, limit=len(names))
        held = 0
        for kind in ("reserved", "scheduled", "active"):
            replies = getattr(inspect, kind)() or {}
            if len(replies) < len(names):
                raise RuntimeError(f"inspect {kind}: {len(replies)} of {len(names)} nodes replied")
            for tasks in replies.values():
                for task in tasks:
                    request = task.get("request", task)
                    if (request.get("delivery_info") or {}).get("routing_key") in queues:
                        held += 1
        return held
    finally:
        client.close()


class SQSBroker(Broker):
    """kombu's SQS transport against moto's server: a message delivered to a worker and not
    yet deleted is "not visible" until its visibility timeout."""

    name = "sqs"

    def __init__(self, port: int) -> None:
        super().__init__()
        self.port = port
        self.url = f"sqs://{SQS_KEY}:{SQS_KEY}@127.0.0.1:{port}"
        self.conf = {
            "broker_transport_options": {
                "is_secure": False,
                "region": REGION,
                "wait_time_seconds": 1,
                "polling_interval": 0.1,
            }
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "sqs",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            region_name=REGION,
            aws_access_key_id=SQS_KEY,
            aws_secret_access_key=SQS_KEY,
        )

    def waiting(self, queues: list[str], nodes: Nodes) -> int:
        sqs = self.client()
        total = 0
        for queue in queues:
            try:
                url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
            except sqs.exceptions.QueueDoesNotExist:
                continue
            names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
            names.append("ApproximateNumberOfMessagesDelayed")
            found = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
            total += sum(int(found.get(name, 0)) for name in names)
        return total

    def cleanup(self) -> None:
        sqs = self.client()
        for queue in self.made:
            with contextlib.suppress(Exception):
                sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"])


def moto_executable() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "moto_server")
    return here if os.access(here, os.X_OK) else shutil.which("moto_server")


@contextlib.contextmanager
def moto_server(timeout: float = 60.0) -> Iterator[int]:
    """moto's server (``moto[server]``) on a free loopback port: yields the port; stopped by
    its pid."""
    executable = moto_executable()
    if executable is None:
        raise FileNotFoundError("moto_server is not installed: pip install 'moto[server]'")
    port = free_port()
    log = open(f"/tmp/moto-{port}.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [executable, "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not reachable(("127.0.0.1", port)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: see /tmp/moto-{port}.log")
            time.sleep(0.05)
        yield port
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
