"""The server's gate: the only port hospitals reach, passing the Fleet API and nothing else (docs/design.md,
"Trust model").

Flower 1.41 serves the Fleet API (SuperNodes), the Control API (``flwr run/ls/stop``, node registration) and the
ServerApp's runtime API on the SuperLink's one HTTPS port, and the Control API has no authentication in the
open-source distribution (../shared/reference/flower-1.41.md): anyone holding the public ``ca.crt`` could submit,
list and stop runs, and a submitted run's ServerApp is code that runs on the server. So the SuperLink listens on
127.0.0.1 only, and the address in the kit is this gate: nginx (Debian's ``nginx-light``, a standard reverse proxy;
https://nginx.org/en/docs/http/ngx_http_proxy_module.html) terminating TLS with the kit's server certificate and
forwarding only ``/v1/fleet/`` (the SuperNodes' routes, ``flwr.superlink.routers.fleet``) and ``/health`` to the
SuperLink, over TLS verified with the kit's CA. Everything else, the Control API's ``/v1/control/`` and the runtime
API included, is answered ``403`` at the gate. SuperNode authentication is unchanged: the SuperNode's signed
request headers pass through (``underscores_in_headers on``) and the SuperLink checks them.

The operator controls runs from the server machine through the SuperLink's loopback address
(``gastric-fl federation server`` prints it). nginx runs in the foreground (``daemon off``) in its own process
group, with its configuration, pid file, logs and temporary files in the server's state folder, and is stopped
with that group (``federation.flower.fleet_gate.FleetGate``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from federation.errors import FederationError
from federation.flower.kit import Kit

FLEET_PREFIX = "/v1/fleet/"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/bin/nginx")


def nginx_executable() -> str:
    """The nginx binary; a one-line ``FederationError`` saying how to install it when missing."""
    found = shutil.which("nginx") or next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)
    if found is None:
        raise FederationError(
            "nginx is not installed: the server's gate needs it (apt-get install nginx-light); "
            "see docs/deployment.md, 'Trust model'"
        )
    return found


def gate_config(*, kit: Kit, workdir: Path, host: str, port: int, upstream_port: int) -> str:
    """The nginx configuration of the gate (one file; every path absolute, inside ``workdir``)."""
    temp = workdir / "gate-temp"
    upstream = f"https://127.0.0.1:{upstream_port}"
    proxied = f"""
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_ssl_trusted_certificate {kit.ca_cert};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_set_header Host localhost;
            proxy_request_buffering off;
            proxy_buffering off;
            proxy_read_timeout 900s;
            proxy_send_timeout 900s;"""
    user = ""
    if os.geteuid() == 0:  # workers never run as root: nginx's own unprivileged account
        user = "user nobody nogroup;"
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sources = _source_rules(kit)
    return f"""# The gastric-fl server gate (federation.flower.gate): only the Fleet API reaches the SuperLink.
{user}
daemon off;
master_process on;
worker_processes 1;
pid {workdir / "gate.pid"};
error_log {workdir / "gate-error.log"} warn;
events {{ worker_connections 512; }}
http {{
{sources}
    log_format gate '$remote_addr [$time_local] "$request" $status hospital=$gate_hospital source_ok=$gate_source_ok';
    access_log {workdir / "gate-access.log"} gate;
    client_body_temp_path {temp / "body"};
    proxy_temp_path {temp / "proxy"};
    fastcgi_temp_path {temp / "fastcgi"};
    uwsgi_temp_path {temp / "uwsgi"};
    scgi_temp_path {temp / "scgi"};
    client_max_body_size 1024m;
    underscores_in_headers on;
    server_tokens off;
    server {{
        listen {listen} ssl;
        ssl_certificate {kit.server_cert};
        ssl_certificate_key {kit.server_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        location {FLEET_PREFIX} {{
            if ($gate_source_ok = 0) {{
                return 403 "this hospital's key may not connect from this address (the server's sources.toml)\\n";
            }}{proxied}
        }}
        location = /health {{{proxied}
        }}
        location / {{
            default_type text/plain;
            return 403 "only the Fleet API is served here: runs are controlled on the server machine\\n";
        }}
    }}
}}
"""


def _source_rules(kit: Kit) -> str:
    """nginx ``map``/``geo`` blocks: ``$gate_hospital``, the kit hospital whose public key a request carries
    (Flower's ``flwr-public-key`` header; ``-`` for none or an unknown key, which the SuperLink refuses itself), and
    ``$gate_source_ok``, 0 when that hospital has a source allow-list (``Kit.sources``) and the request's address is
    not in it. The header only names a hospital; the SuperLink still checks its signature, so a request that
    claims another hospital's key from an allowed address gains nothing."""
    sources = kit.sources()
    keys = "\n".join(f'        "{kit.fleet_key(b.name)}" "{b.name}";' for b in kit.hospitals)
    lines = [
        "    map_hash_bucket_size 512;",
        "    map $http_flwr_public_key $gate_hospital {",
        '        default "-";',
        keys,
        "    }",
    ]
    for i, (_, networks) in enumerate(sorted(sources.items())):
        lines += [f"    geo $gate_from_{i} {{", "        default 0;", *(f"        {n} 1;" for n in networks), "    }"]
    lines += ["    map $gate_hospital $gate_source_ok {", "        default 1;"]
    lines += [f'        "{name}" $gate_from_{i};' for i, name in enumerate(sorted(sources))]
    lines += ["    }"]
    return "\n".join(line for line in lines if line)
