"""What a governed call under test came to: :class:`Denied`, and :class:`GovernedCall`, the
record :func:`~governor.testing.governed` keeps of every eager call of the app's tasks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import Ignore

__all__ = ["Denied", "GovernedCall"]


class Denied(Ignore):  # type: ignore[misc]
    """A call a limit denies: it would wait ``retry_after`` seconds in production.

    Under test it never waits: it is not run and counts nothing. It is raised in the task's
    ``before_start``, like governor's own deferral (an :class:`~celery.exceptions.Ignore`: the
    eager result's state is ``IGNORED`` and its ``result`` this exception), and kept in
    ``Governed.denials``; with ``on_denied="raise"``, ``delay()`` / ``apply()`` raise it.

    ``limit`` is the limit's label as logs and metrics show it (``"partner-api"`` for a per-key
    limit, ``"queue:emails"``, ``"task:proj.sync"``), ``subject`` what it counts (the key, the
    queue, the task name); ``rule`` the rule that denies (``"5/s"``), or None when a manual
    block or pause (``blocked``, its reason) or a full concurrency cap (``capped``) denies.
    """

    def __init__(
        self,
        limit: str,
        rule: str | None,
        retry_after: float,
        *,
        subject: str = "",
        task: str = "",
        task_id: str = "",
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        blocked: str | None = None,
        capped: str | None = None,
        at: float = 0.0,
    ) -> None:
        self.limit = limit
        self.rule = rule
        self.retry_after = retry_after
        self.subject = subject
        self.task = task
        self.task_id = task_id
        self.args = args
        self.kwargs = dict(kwargs or {})
        self.blocked = blocked
        self.capped = capped
        self.at = at
        """The test clock's time of the decision."""
        super().__init__(str(self))

    @property
    def why(self) -> str:
        """The rule, the block or the cap that denies, in words."""
        if self.rule is not None:
            return f"rule {self.rule}"
        if self.capped is not None:
            return f"its concurrency cap ({self.capped})"
        return f"a block ({self.blocked or 'no reason given'})"

    def __str__(self) -> str:
        return (
            f"{self.task or 'the call'} denied by {self.limit} ({self.why}): "
            f"it would wait {self.retry_after:.3f}s"
        )

    def __repr__(self) -> str:
        return (
            f"Denied(limit={self.limit!r}, rule={self.rule!r}, "
            f"retry_after={self.retry_after!r}, task={self.task!r}, subject={self.subject!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _denied,
            (self.limit, self.rule, self.retry_after),
            {k: v for k, v in vars(self).items() if k not in ("limit", "rule", "retry_after")},
        )


def _denied(limit: str, rule: str | None, retry_after: float) -> Denied:
    return Denied(limit, rule, retry_after)


@dataclass(frozen=True, slots=True)
class GovernedCall:
    """One eager call of one of the app's tasks while :func:`~governor.testing.governed` ran."""

    task: str
    task_id: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    at: float
    """The test clock's time of the decision (0.0 with the limits off)."""
    limits: tuple[str, ...] = ()
    """Labels of the limits that govern it (none: an ungoverned task)."""
    denied: Denied | None = field(default=None, compare=False)

    @property
    def admitted(self) -> bool:
        return self.denied is None
