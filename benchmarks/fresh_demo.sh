#!/bin/bash
# `make demo` on a fresh clone with an engine, registry and cache of its own, beside the ones in use (issue 49).
#
#     bash benchmarks/fresh_demo.sh [WORKDIR] [COMMIT]      (as root; default /tmp/fresh-demo, HEAD)
#
# A fresh clone of this repository in WORKDIR; `make venv` timed (pip's cache: WORKDIR's own); then, in a network
# namespace of its own (its own loopback: 127.0.0.1:5000 is free there, the shared registry is not touched), its
# own dockerd (--data-root, --exec-root, --pidfile, socket; no bridge, no iptables) and `make demo` with
# BUILDER_CACHE and DOCKER_HOST of its own. debootstrap reaches the Debian mirror through a shim that runs it in
# this host's network namespace, pip's downloads through benchmarks/netns_proxy.py. What it still shares with this
# machine: the installed Debian packages (docker.io, docker-registry, squashfs-tools, debootstrap, pigz), the
# torch wheel in /opt/wheels and the file index, the page cache. Everything it started is stopped and removed.
set -u
W=${1:-/tmp/fresh-demo}
COMMIT=${2:-HEAD}
SRC=$(cd "$(dirname "$0")/.." && pwd)
HOSTNET=/proc/$$/ns/net
rm -rf "$W" && mkdir -p "$W/shims" "$W/d"
git clone -q "$SRC" "$W/repo" && git -C "$W/repo" checkout -q "$COMMIT" || exit 2
printf '#!/bin/sh\nexec nsenter --net=%s /usr/sbin/debootstrap "$@"\n' "$HOSTNET" > "$W/shims/debootstrap"
chmod +x "$W/shims/debootstrap"

secs() { python3 -c "import time; print(f'{time.time() - $1:.1f}')"; }
t=$(date +%s.%N)
(cd "$W/repo" && PIP_CACHE_DIR="$W/pip-cache" make --no-print-directory venv > "$W/venv.log" 2>&1) || { tail "$W/venv.log"; exit 1; }
echo "make venv: $(secs "$t") s"

cat > "$W/inner.sh" <<EOF
set -u
ip link set lo up
python3 $SRC/benchmarks/netns_proxy.py 3128 $HOSTNET > $W/proxy.log 2>&1 &
PROXY=\$!
t=\$(date +%s.%N)
dockerd --data-root=$W/d/data --exec-root=$W/d/exec --pidfile=$W/d/docker.pid --host=unix://$W/d/docker.sock \
    --bridge=none --iptables=false --ip-masq=false --config-file=$W/d/daemon.json > $W/dockerd.log 2>&1 &
until docker -H unix://$W/d/docker.sock info > /dev/null 2>&1; do sleep 0.2; done
echo "dockerd start: \$(python3 -c "import time; print(f'{time.time() - \$t:.1f}')") s"
t=\$(date +%s.%N)
cd $W/repo && DOCKER_HOST=unix://$W/d/docker.sock BUILDER_CACHE=$W/cache HTTPS_PROXY=http://127.0.0.1:3128 \
    NO_PROXY=127.0.0.1,localhost PATH=$W/shims:\$PATH make --no-print-directory demo > $W/demo.log 2>&1
echo "make demo: exit \$?, \$(python3 -c "import time; print(f'{time.time() - \$t:.1f}')") s"
sed -n '/phase timings/,\$p' $W/demo.log
grep -E '<== (base|setup|start|apt)' $W/demo.log
git status --short | head -5
[ -f $W/cache/registry/registry.pid ] && kill \$(cat $W/cache/registry/registry.pid)
kill \$PROXY \$(cat $W/d/docker.pid); while [ -e $W/d/docker.pid ]; do sleep 0.5; done
EOF
echo '{"deprecated-key-path": "'"$W"'/d/key.json"}' > "$W/d/daemon.json"
unshare --net bash "$W/inner.sh"
grep -o " $W/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l
[ -n "${KEEP:-}" ] || rm -rf "$W"
