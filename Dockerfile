# The kvscale operator image. Not built in CI (no container engine there):
#   docker build -t ghcr.io/kvscale/kvscale:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY kvscale ./kvscale
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM python:3.11-slim
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin kvscale
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "kvscale[operator]" && rm -rf /wheels
USER 65532:65532
ENV MPLCONFIGDIR=/tmp PYTHONUNBUFFERED=1
EXPOSE 8080 8081
ENTRYPOINT ["kvscale"]
CMD ["operator", "--liveness=http://0.0.0.0:8080/healthz"]
