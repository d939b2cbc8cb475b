#!/usr/bin/env bash
# Start one peer proxy in the foreground (exec) in front of 127.0.0.1:UPSTREAM_PORT, on
# 127.0.0.1:LISTEN_PORT, with its config in WORKDIR. One worker/thread each, as nginx's in
# bench-proxy.sh: every proxy gets the same share of the 2 cores.
#   peers.sh envoy|haproxy|litellm UPSTREAM_PORT LISTEN_PORT WORKDIR [BINARY]
set -euo pipefail
kind="$1"; up="$2"; port="$3"; dir="$4"; bin="${5:-}"
mkdir -p "$dir"
case "$kind" in
  envoy)
    # Envoy streams responses as they come; keepalive to the upstream is its default.
    cat > "$dir/envoy.yaml" <<CONF
static_resources:
  listeners:
    - name: l
      address: {socket_address: {address: 127.0.0.1, port_value: $port}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                codec_type: AUTO
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route: {cluster: up, timeout: 0s}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
    - name: up
      type: STATIC
      connect_timeout: 2s
      circuit_breakers:
        thresholds: [{max_connections: 100000, max_pending_requests: 100000, max_requests: 100000}]
      load_assignment:
        cluster_name: up
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $up}}}}]}]
CONF
    exec "$bin" -c "$dir/envoy.yaml" --concurrency 1 --log-level error --base-id $((port % 60000))
    ;;
  haproxy)
    # http-no-delay: without it HAProxy batches SSE events.
    cat > "$dir/haproxy.cfg" <<CONF
global
  maxconn 8000
  nbthread 1
defaults
  mode http
  timeout connect 2s
  timeout client 300s
  timeout server 300s
  option http-no-delay
  option http-keep-alive
frontend f
  bind 127.0.0.1:$port
  default_backend b
backend b
  http-reuse always
  server s1 127.0.0.1:$up maxconn 4000
CONF
    exec haproxy -f "$dir/haproxy.cfg" -db
    ;;
  litellm)
    # No outside calls: the local cost map, telemetry off.
    cat > "$dir/litellm.yaml" <<CONF
model_list:
  - model_name: sim-model
    litellm_params:
      model: openai/sim-model
      api_base: http://127.0.0.1:$up/v1
      api_key: sk-bench
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: ${LITELLM_KEY:-sk-goodput-bench-7f3a9c2e5b1d4f8a6c0e9b2d7a5f3c1e}
CONF
    export LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_TELEMETRY=False DISABLE_SCHEMA_UPDATE=True
    exec "$bin" --config "$dir/litellm.yaml" --host 127.0.0.1 --port "$port" --num_workers 1 --telemetry False
    ;;
  *) echo "unknown peer $kind" >&2; exit 2 ;;
esac
