# The eden-serve image: one TorchServe node (cloud, edge or both), run as a non-root user.
#   docker build -t eden-serve:cpu .                              torch's CPU build
#   docker build -t eden-serve:cuda --build-arg VARIANT=cuda .    torch's CUDA build (GPUs through the NVIDIA container runtime)
#   docker build ... --build-arg CHECKPOINT=hf://zhZ524/EDEN/eden.pt    archives baked into /models
#   docker run -p 8080:8080 eden-serve:cpu serve edge --model-store /models --checkpoint hf://zhZ524/EDEN/eden.pt \
#       --properties /opt/eden-serve/deploy/docker/container.properties
# docs/deploy.md says more.

ARG VARIANT=cpu

# Pinned by exact tag; pin the digest too in a registry you control.
FROM python:3.11.13-slim-bookworm AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/eden-serve/.venv/bin:$PATH
# Java 17 for TorchServe's frontend; tini as PID 1 reaps the workers TorchServe orphans. Versions
# are the release's current ones (the base tag fixes the release): pinned ones vanish with each
# security update. The man directory: the JRE's install scripts link into it, and slim has none.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini \
    && rm -rf /var/lib/apt/lists/* \
    && python -m venv /opt/eden-serve/.venv

# torch first and pinned, as in setup.sh. PyPI's wheel carries the CUDA libraries (GBs a CPU node
# never uses); the CPU build comes from PyTorch's own index.
FROM base AS torch-cpu
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"

FROM base AS torch-cuda
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN pip install --no-cache-dir "torch==2.13.0"

# One of the two stages above.
# hadolint ignore=DL3006
FROM torch-${VARIANT}
# A normal (not editable) install into the venv, owned by root, so the serving user cannot change
# it: the package carries what TorchServe reads (handler files, model-configs, the workflow,
# config.properties), and the sources are not kept. /opt/eden-serve holds the entrypoint and the
# container's properties.
WORKDIR /opt/eden-serve
COPY pyproject.toml src/
COPY eden_serve src/eden_serve
COPY deploy/docker deploy/docker
RUN pip install --no-cache-dir "./src[serve,hub,video]" \
    && rm -rf src \
    && useradd --uid 10001 --user-group --no-log-init --create-home eden \
    && install -d -o eden -g eden /models

# A hub reference or a path in the build context: the archives are built now, into the image.
ARG CHECKPOINT=""
RUN if [ -n "$CHECKPOINT" ]; then \
        HF_HOME=/tmp/hf eden-serve archive --checkpoint "$CHECKPOINT" --model-store /models \
        && rm -rf /tmp/hf && chown -R eden:eden /models; \
    fi

USER 10001:10001
WORKDIR /home/eden
EXPOSE 8080 8081 8082
ENTRYPOINT ["tini", "--", "/opt/eden-serve/deploy/docker/entrypoint.sh"]
CMD ["serve", "both", "--model-store", "/models", "--properties", "/opt/eden-serve/deploy/docker/container.properties"]
