#!/usr/bin/env bash
# Run a command in the image `make image` built, as the chart runs it: as the image's own
# non-root user, on a read-only root filesystem with a writable /tmp, on the host's network.
#
#   platform/image/run.sh [COMMAND ...]      default: python manage.py demo
#
# No container daemon: a buildah working container whose root is bind-mounted read-only, run
# with buildah's chroot isolation (as root on the host). The container's /tmp is the host folder
# $SCRATCH (default build/image/tmp-$EXTRA), so the demo's build/image/tmp-cpu/roundhouse/demo.env
# is readable from the host. Ctrl-C (or SIGTERM) stops the command, then the container goes.
set -euo pipefail
cd "$(dirname "$0")/../.."

EXTRA=${EXTRA:-cpu}
IMAGE=${IMAGE:-localhost/roundhouse:$EXTRA}
SCRATCH=${SCRATCH:-build/image/tmp-$EXTRA}
export STORAGE_DRIVER=${STORAGE_DRIVER:-vfs} BUILDAH_ISOLATION=${BUILDAH_ISOLATION:-chroot}
[ $# -gt 0 ] || set -- python manage.py demo

user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$IMAGE")
container=$(buildah from --quiet --pull-never "$IMAGE")
root=$(buildah mount "$container")
# Whatever still runs inside when the command is done (a daemon it left behind) goes with it:
# every process in the container's mount namespace.
namespace=""
leftovers_kill() {
  local proc
  [ -n "$namespace" ] || return 0
  for proc in /proc/[0-9]*; do
    [ "$(readlink "$proc/ns/mnt" 2>/dev/null)" = "$namespace" ] && kill -KILL "${proc#/proc/}" 2>/dev/null
  done
  return 0
}
cleanup() {
  leftovers_kill
  umount "$root/run" 2>/dev/null || true
  umount "$root" 2>/dev/null || true
  buildah rm "$container" >/dev/null || true
}
trap cleanup EXIT
# The files buildah binds its own over (as a kubelet does /etc/hosts) must exist first: this
# container's copy of the root gets them, the image does not.
touch "$root/etc/hosts" "$root/etc/resolv.conf" "$root/etc/hostname"
# The root read-only for the command: a read-only bind mount of the container's root over itself,
# with a tmpfs on /run, where buildah keeps its own marker file (a pod's /run is the runtime's).
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o size=1m,mode=0755 tmpfs "$root/run"
mkdir -p "$SCRATCH"
chown "$user" "$SCRATCH"
chmod 1777 "$SCRATCH"
# The caller's ROUNDHOUSE_* settings go in (ROUNDHOUSE_PORT and such), but for the two that
# name paths of this host: inside, the image's own hold.
env_args=()
while IFS='=' read -r name _; do env_args+=(--env "$name=${!name}"); done \
  < <(env | grep -E '^ROUNDHOUSE_[A-Z_]+=' | grep -vE '^ROUNDHOUSE_(DATA_DIR|STATIC_ROOT)=' || true)
# buildah run answers a signal by killing the command outright, leaving what it started (the
# demo's database, its engines) running. So it runs in a session of its own (a terminal's
# Ctrl-C does not reach it), and a signal goes to the command itself, which stops its own
# processes and exits. The command is three levels down: buildah run, its chroot runtime, its
# exec helper, the command.
setsid buildah run --volume "$(realpath "$SCRATCH")":/tmp:rw "${env_args[@]}" "$container" -- "$@" &
child=$!
command_pid() {
  local pid=$child
  for _ in 1 2 3; do pid=$(pgrep -P "$pid" | head -1) || return 1; done
  echo "$pid"
}
stop() {
  local pid
  pid=$(command_pid) && kill -TERM "$pid" 2>/dev/null
  return 0
}
trap stop INT TERM
for _ in $(seq 100); do
  if pid=$(command_pid); then
    namespace=$(readlink "/proc/$pid/ns/mnt" 2>/dev/null || true)
    # Only a namespace of the container's own: never this host's.
    [ "$namespace" = "$(readlink /proc/$$/ns/mnt)" ] && namespace=""
    break
  fi
  kill -0 $child 2>/dev/null || break
  sleep 0.1
done
status=0
wait $child || status=$?
# A signal interrupts the first wait; the second waits for the command to finish stopping.
wait $child 2>/dev/null || true
exit $status
