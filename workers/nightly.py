"""A nightly batch under a daily cap: 1 a second, 20 a minute, 200 an hour, 800 a day.

The cap is a whole-task limit (``governor_tasks`` in :mod:`workers.app`): every call of
:func:`run_job`, on any worker, counts against it. The producer books every job's start with
:func:`governor.celery.submit_batch` before sending it, so no job is ever denied and re-sent:
jobs due soon go out with their ETA, later ones are parked in Redis and released when nearly
due (jobs beyond today's 800 wait for tomorrow's room without sitting in worker memory). How
long a batch takes, without running it: ``governor plan "1/s, 20/m, 200/h, 800/d" --jobs 1000``.

Enqueue a batch with ``python -m workers.nightly --jobs 1000`` (``--unbooked`` sends plain
messages instead and lets the workers' gate pace them).
"""

from __future__ import annotations

import argparse
import logging
import time

from governor.celery import submit_batch

from .app import app

if __name__ == "__main__":  # run the module the app imported: its task exists once, not twice
    from workers.nightly import main

    main()
    raise SystemExit(0)

logger = logging.getLogger(__name__)


@app.task(name="workers.nightly.run_job")  # the name governor_tasks uses
def run_job(job_id: int) -> None:
    """Process one job of the nightly batch (simulated: a short sleep)."""
    time.sleep(0.01)
    logger.info("nightly job %d done (simulated)", job_id)


def enqueue(jobs: int, first: int = 0, *, booked: bool = True, queue: str | None = None) -> int:
    """Enqueue jobs ``first`` .. ``first + jobs - 1``; returns how many were sent.

    ``booked`` (the default) books each job's start before sending it (needs Redis);
    otherwise the messages go out plain and the gate on the workers paces them. ``queue``
    overrides the task's route (Celery's default queue).
    """
    options = {"queue": queue} if queue else {}
    ids = range(first, first + jobs)
    if booked:
        return len(submit_batch(run_job.s(job_id).set(**options) for job_id in ids))
    with app.producer_or_acquire() as producer:
        for job_id in ids:
            run_job.apply_async((job_id,), producer=producer, **options)
    return jobs


def main(argv: list[str] | None = None) -> None:
    """Enqueue a nightly batch of jobs (python -m workers.nightly)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--jobs", type=int, default=1000, help="how many jobs to enqueue")
    parser.add_argument("--first", type=int, default=0, help="id of the first job")
    parser.add_argument(
        "--unbooked",
        action="store_true",
        help="send plain messages and let the workers pace them (no booking up front)",
    )
    parser.add_argument("--queue", help="queue to send to (default: the task's route)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.first < 0:
        parser.error("--jobs must be at least 1 and --first at least 0")
    sent = enqueue(args.jobs, args.first, booked=not args.unbooked, queue=args.queue)
    print(f"enqueued {sent} nightly jobs (limit 1/s, 20/m, 200/h, 800/d)")
