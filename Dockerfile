# recallq: one image for the API, the workers and migrations.
#   docker build -t recallq .
#   docker run --rm -p 8000:8000 recallq                   # API (default CMD)
#   docker run --rm recallq recallq worker --concurrency 32
FROM python:3.11-slim

# LITELLM_LOCAL_MODEL_COST_MAP: use litellm's bundled cost map instead of
# fetching it over the network at import time.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True

WORKDIR /src

# Dependencies first, in their own layer, so code changes don't reinstall them: recallq's own
# and those of its `service` extra (the API, the workers, Postgres, Redis) and `llm` extra.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = p['optional-dependencies']; print('\n'.join(d for d in p['dependencies'] + extras['service'] + extras['llm'] if not d.startswith('recallq')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself (see .dockerignore for what is left out).
COPY . .
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin recallq \
    && mkdir -p /app \
    && chown recallq:recallq /app

# Non-root; /app is writable for `recallq run` (SQLite file, results.jsonl).
USER recallq
WORKDIR /app

EXPOSE 8000
CMD ["recallq", "api", "--host", "0.0.0.0", "--port", "8000"]
