FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY strategies ./strategies
COPY storage ./storage
COPY agent-definitions ./agent-definitions
RUN pip install --no-cache-dir .
ENV MEMORY_PROXY_HOST=0.0.0.0 \
    MEMORY_PROXY_PORT=4000 \
    MEMORY_PROXY_AGENTS_DIR=/app/agent-definitions \
    LITELLM_LOCAL_MODEL_COST_MAP=True
EXPOSE 4000
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:4000/health'); sys.exit(0)"
CMD ["memory-proxy", "serve"]
