# syntax=docker/dockerfile:1
# goodput's image: a multi-stage build that ends in a small non-root runtime with the ONNX
# Runtime library the perplexity scorer loads. CI does not build it (no image builder there);
# the Helm chart (helm/goodput) refers to it.
#
#   docker build -t goodput:0.1.0 .                                   # CPU scorer
#   docker build -t goodput:0.1.0-cuda --build-arg FEATURES=cuda \
#                --build-arg ORT_PACKAGE=onnxruntime-gpu .             # scorer on a GPU (CUDA 13)
#   docker build -t goodput-models:0.1.0 --target models .            # the scorer's model, for
#                                                                      # the chart's init container

ARG RUST_VERSION=1.95
ARG PYTHON_VERSION=3.11

FROM rust:${RUST_VERSION}-bookworm AS build
ARG FEATURES=""
# PGO=1: the profile-guided build (scripts/build-pgo.sh; twice the build time, and a request on
# a CPU it shares with other work takes a shorter path: BENCHMARKS.md). PGO=0: a plain build.
ARG PGO=1
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY scripts/build-pgo.sh scripts/
COPY scripts/bench/lib.sh scripts/bench/
RUN if [ "$PGO" = 1 ]; then scripts/build-pgo.sh; \
    else cargo build --profile production --locked --bin goodput ${FEATURES:+--features ${FEATURES}} \
         && mkdir -p target/pgo/use/production && cp target/production/goodput target/pgo/use/production/; fi

# libonnxruntime.so from the PyPI wheel, as scripts/setup-onnxruntime.sh takes it.
FROM python:${PYTHON_VERSION}-slim-bookworm AS onnxruntime
ARG ORT_PACKAGE=onnxruntime
ARG ORT_VERSION=1.31.1
RUN pip install --no-cache-dir "${ORT_PACKAGE}==${ORT_VERSION}" \
 && mkdir -p /opt/onnxruntime \
 && cp -L "$(python -c 'import glob, os, onnxruntime; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime*.so*")))[-1])')" /opt/onnxruntime/libonnxruntime.so \
 && cp -L $(python -c 'import glob, os, onnxruntime; print(" ".join(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime_providers_*.so"))))' ) /opt/onnxruntime/ 2>/dev/null || true
# The CUDA image: CUDA 13's runtime, cuBLAS and cuRAND beside the provider (goodput loads them
# from there before it); the NVIDIA device plugin mounts the driver (libcuda.so.1) at run time.
RUN if [ "${ORT_PACKAGE}" = onnxruntime-gpu ]; then \
      pip install --no-cache-dir "nvidia-cuda-runtime~=13.0" "nvidia-cublas~=13.0" "nvidia-curand~=10.0" \
      && lib="$(python -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')" \
      && for l in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcurand.so.10; do \
           cp -L "$lib/$l" /opt/onnxruntime/; done; \
    fi

# The reference model (SmolLM2-135M-Instruct, converted from its GGUF by the project's own
# scripts; no model hub is needed): what the scorer's init container copies.
FROM python:${PYTHON_VERSION}-bookworm AS models-build
RUN apt-get update && apt-get install -y --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts scripts
ENV GOODPUT_CACHE=/cache
RUN scripts/setup-models.sh && mkdir -p /models && cp -r /cache/models/smollm2-135m-instruct-onnx /models/

FROM debian:bookworm-slim AS models
COPY --from=models-build /models /models
USER 65532:65532

FROM debian:bookworm-slim AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/pgo/use/production/goodput /usr/local/bin/goodput
COPY --from=onnxruntime /opt/onnxruntime/ /usr/lib/goodput/
COPY config/goodput.yaml /etc/goodput/goodput.yaml
ENV ORT_DYLIB_PATH=/usr/lib/goodput/libonnxruntime.so
USER 65532:65532
EXPOSE 8080 9464
ENTRYPOINT ["/usr/local/bin/goodput"]
CMD ["serve", "--config", "/etc/goodput/goodput.yaml"]
