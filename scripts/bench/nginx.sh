#!/usr/bin/env bash
# Run nginx in the foreground as a streaming reverse proxy (the reference peer in benchmarks):
# proxy_buffering off, upstream keepalive, one worker (goodput gets the same 2 cores).
#   nginx.sh UPSTREAM_PORT LISTEN_PORT WORKDIR
set -euo pipefail
up="$1"; port="$2"; dir="$3"
mkdir -p "$dir"
cat > "$dir/nginx.conf" <<CONF
worker_processes ${NGINX_WORKERS:-auto};
daemon off;
error_log $dir/error.log warn;
pid $dir/nginx.pid;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $dir/body;
  proxy_temp_path $dir/proxy;
  upstream up { server 127.0.0.1:$up; keepalive 256; }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
CONF
exec nginx -c "$dir/nginx.conf"
