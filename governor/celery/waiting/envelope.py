"""A task's message kept in Redis while it waits (parked, in a cap's line, in a fair queue):
an envelope holds the signature serialized as its task would be sent, plus what the releaser
needs (its due time and the limit it waits for).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from kombu.serialization import dumps, loads, prepare_accept_content

__all__ = ["envelope", "open_envelope"]


def envelope(app: Any, sig: dict[str, Any], due: float, label: str) -> str:
    """Serialize a signature with the serializer its task would be sent with (the call's
    ``serializer`` option, else the task's, else ``task_serializer``), plus what the releaser
    needs."""
    task = app.tasks.get(sig.get("task")) if sig.get("task") else None
    serializer = (
        (sig.get("options") or {}).get("serializer")
        or getattr(task, "serializer", None)
        or app.conf.task_serializer
    )
    content_type, encoding, body = dumps(  # type: ignore[no-untyped-call]
        dict(sig), serializer=serializer
    )
    if isinstance(body, bytes):
        body, binary = base64.b64encode(body).decode("ascii"), True
    else:
        binary = False
    return json.dumps(
        {
            "ct": content_type,
            "enc": encoding,
            "body": body,
            "b64": binary,
            "due": due,
            "label": label,
            "task": sig.get("task"),
        }
    )


def open_envelope(app: Any, text: str | bytes) -> tuple[Any, float, dict[str, Any]]:
    """(signature, due, envelope) from a parked envelope."""
    env = json.loads(text)
    body = base64.b64decode(env["body"]) if env["b64"] else env["body"]
    accept = prepare_accept_content(app.conf.accept_content)  # type: ignore[no-untyped-call]
    data = loads(body, env["ct"], env["enc"], accept=accept)  # type: ignore[no-untyped-call]
    return app.signature(data), float(env["due"]), env
