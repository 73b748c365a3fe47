# governor and its example apps (workers/), for docker-compose.yml.
FROM python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONPATH=/app
WORKDIR /app

COPY pyproject.toml README.md ./
COPY governor ./governor
RUN pip install ".[celery,cli]"
COPY workers ./workers

RUN useradd --create-home --uid 1000 app
USER app

CMD ["celery", "-A", "workers.app", "worker", "-Q", "celery,emails", "--loglevel", "INFO"]
