# duo: one image for lead and back (the command picks the role).
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md chat.py ./
COPY lead lead
COPY back back
COPY chat chat
COPY shared shared
COPY bench bench
# RPC on, as make install builds it: --rpc and python -m shared.rpc work in the image.
RUN CMAKE_ARGS="-DGGML_RPC=on" pip install --no-cache-dir .
# Model presets are downloaded, assembled and verified into this volume on first start.
ENV DUO_CACHE=/models PYTHONUNBUFFERED=1
VOLUME /models
EXPOSE 5555
# lead listens on 127.0.0.1 unless told: to be reached from outside the container give it
# LEAD_HOST=0.0.0.0 and LEAD_API_KEY (docker-compose.yml does; it requires DUO_API_KEY).
CMD ["python", "-m", "lead"]
