# One image for every StraitMQ process. Build: docker build -t straitmq .
# (Not built on the development machines, which have no Docker engine.)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY straitmq straitmq
COPY services services
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 10001 --create-home strait && mkdir /data && chown strait /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
VOLUME /data
EXPOSE 9092 8080
ENTRYPOINT ["strait-broker", "--data-dir", "/data", "--listen", "0.0.0.0:9092", "--http", "0.0.0.0:8080"]
