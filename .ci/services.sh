#!/usr/bin/env bash
# Make sure the services the tests talk to are up: Postgres on 127.0.0.1:5432
# (trust auth, user postgres) and Redis on 127.0.0.1:6379 with noeviction.
# Installs them from Debian's packages when missing. Idempotent.
set -uo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi
apt_install() {
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 || {
    $SUDO apt-get update -q >/dev/null 2>&1
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
  }
}

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "installing postgresql from Debian packages"
    apt_install postgresql postgresql-client
  fi
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  conf=/etc/postgresql/$ver/main
  # Trust auth on loopback for the test user, as on the development machines.
  if ! grep -q "rlq-ci" "$conf/pg_hba.conf" 2>/dev/null; then
    $SUDO sh -c "printf '# rlq-ci\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust\n' | cat - $conf/pg_hba.conf > $conf/pg_hba.rlq && mv $conf/pg_hba.rlq $conf/pg_hba.conf"
  fi
  $SUDO pg_ctlcluster --skip-systemctl-redirect "$ver" main start || $SUDO pg_ctlcluster "$ver" main start
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
fi
pg_up || { echo "Postgres is not reachable on 127.0.0.1:5432" >&2; exit 1; }

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
if ! redis_up; then
  command -v redis-server >/dev/null || { echo "installing redis-server from Debian packages"; apt_install redis-server; }
  mkdir -p /tmp/rlq-redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no --dir /tmp/rlq-redis --logfile /tmp/rlq-redis/redis.log
  for _ in $(seq 1 30); do redis_up && break; sleep 0.5; done
fi
redis_up || { echo "Redis is not reachable on 127.0.0.1:6379" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6379 config set maxmemory-policy noeviction >/dev/null
echo "services: Postgres and Redis are up"

# Tools some tests drive (headless browser, network namespaces, certificates). Installed here, before
# the suite, so no test blocks on apt-get; a test whose tool is missing skips with the reason.
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v ip >/dev/null || missing+=(iproute2)
command -v openssl >/dev/null || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} from Debian packages"
  apt_install --no-install-recommends "${missing[@]}" || echo "warning: could not install ${missing[*]}; the tests that need them will skip" >&2
fi
