# One image for every usp-webhooks service (migrate, api, worker, scheduler); the command differs.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv \
    PATH="/opt/venv/bin:$PATH"

RUN pip install --no-cache-dir "uv>=0.5,<1"

WORKDIR /app

# Dependencies first (cached until the lock or a pyproject changes), then the workspace itself.
COPY pyproject.toml uv.lock README.md ./
COPY schemas/pyproject.toml schemas/
COPY receiver/pyproject.toml receiver/
COPY workers/pyproject.toml workers/
COPY dispatcher/pyproject.toml dispatcher/
RUN uv sync --frozen --no-dev --no-install-workspace

COPY schemas/ schemas/
COPY receiver/ receiver/
COPY workers/ workers/
COPY dispatcher/ dispatcher/
RUN uv sync --frozen --no-dev

RUN useradd --system --uid 10001 --home-dir /app usp
USER usp

EXPOSE 8000
CMD ["usp-webhooks", "--help"]
