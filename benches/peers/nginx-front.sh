#!/usr/bin/env bash
# nginx as a front of `infergate bench --mode live --front`: round-robin over the emulated pods,
# streaming passed through unbuffered, upstream connections kept alive. The bench sets
# INFERGATE_FRONT_PORT (where to listen, on 127.0.0.1) and INFERGATE_FRONT_ADDRS (the pods,
# comma-separated HOST:PORT); this writes the configuration into a folder of its own and runs
# nginx in the foreground, so the bench stops it with its process group.
set -euo pipefail
: "${INFERGATE_FRONT_PORT:?set by infergate bench --front}"
: "${INFERGATE_FRONT_ADDRS:?set by infergate bench --front}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
DIR=$(mktemp -d "${TMPDIR:-/tmp}/infergate-nginx-front.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR/tmp"
servers=""
IFS=, read -ra addrs <<<"$INFERGATE_FRONT_ADDRS"
for a in "${addrs[@]}"; do servers+="    server $a;"$'\n'; done
cat >"$DIR/nginx.conf" <<CONF
worker_processes 1;
error_log stderr warn;
pid $DIR/nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $DIR/tmp/body;
  proxy_temp_path $DIR/tmp/proxy;
  fastcgi_temp_path $DIR/tmp/fastcgi;
  uwsgi_temp_path $DIR/tmp/uwsgi;
  scgi_temp_path $DIR/tmp/scgi;
  upstream pods {
$servers    keepalive 256;
  }
  server {
    listen 127.0.0.1:$INFERGATE_FRONT_PORT;
    location / {
      proxy_pass http://pods;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
CONF
"$NGINX" -p "$DIR" -c "$DIR/nginx.conf" -g 'daemon off;' &
child=$!
trap 'kill "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; rm -rf "$DIR"' EXIT TERM INT
wait "$child"
