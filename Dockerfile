# ctxbudget in a container: docs/deploy.md ("In a container") says how to run it, and
# deploy/compose.yaml runs several of it on one PostgreSQL.
#
#   docker build -t ctxbudget .
#   docker run --rm -p 127.0.0.1:4141:4141 --env-file deploy/ctxbudget.env ctxbudget
#
# The image holds a plain (non-editable) install of the wheel and nothing of the checkout;
# tests/e2e/test_install.py runs its CMD with its ENV from such an install (the machines
# that test it have no container engine).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY caps caps
COPY memory memory
COPY proxy proxy
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && useradd --system --home-dir /var/lib/ctxbudget --create-home --shell /usr/sbin/nologin ctxbudget
COPY deploy/container.jsonc /etc/ctxbudget/ctxbudget.jsonc
USER ctxbudget
WORKDIR /var/lib/ctxbudget
# The report and memory databases (SQLite) live here unless database.url names PostgreSQL.
VOLUME ["/var/lib/ctxbudget"]
ENV CTXBUDGET_CONFIG=/etc/ctxbudget/ctxbudget.jsonc \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True
EXPOSE 4141
HEALTHCHECK --interval=30s --timeout=5s CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:4141/healthz', timeout=4)"]
CMD ["ctxbudget", "serve"]
