#!/usr/bin/env bash
# Installs the Debian packages the test suite runs for real: PostgreSQL (the real Airflow
# deployment test), etcd (the agent's etcd rendezvous test), and for the one-machine cluster
# of tests/cluster: bubblewrap (each pod's UTS, PID and mount namespaces), dnsmasq (the
# cluster DNS) and iproute2 (network namespaces, veths, bridges); chromium and chromium-driver
# for tests/browser (the Airflow and Prefect pages in headless Chromium). Idempotent and quick when
# they are present; prints what it did. Without root or apt it says so and the tests that
# need the package skip with that reason.
set -u
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: cannot install ${need[*]} (needs root and apt-get); tests that need them will skip" >&2
  exit 0
fi
echo "system-deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
  || echo "system-deps: apt-get install ${need[*]} failed; tests that need them will skip" >&2
# Debian starts services on install; the tests start their own on free loopback ports.
for svc in etcd postgresql; do
  command -v service >/dev/null 2>&1 && service "$svc" stop >/dev/null 2>&1 || true
done
exit 0
