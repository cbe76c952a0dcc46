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

# Run unprivileged: nothing here needs root (Celery warns when it runs as root, and a hole in any
# dependency should not come with root's rights). The code and /opt/venv stay root-owned, so the
# service cannot rewrite itself; /data is its own working folder, where `usp-webhooks up` keeps
# its SQLite files when no database is configured. USER is numeric so Kubernetes'
# runAsNonRoot can verify it without reading /etc/passwd.
RUN groupadd --system --gid 10001 usp \
    && useradd --system --uid 10001 --gid usp --no-log-init --create-home --home-dir /home/usp \
       --shell /usr/sbin/nologin usp \
    && install --directory --owner=usp --group=usp --mode=0750 /data
WORKDIR /data
USER 10001:10001

EXPOSE 8000
CMD ["usp-webhooks", "--help"]
