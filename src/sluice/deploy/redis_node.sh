# One node of sluice's Redis with Sentinel: `sh redis_node.sh redis` or `sh redis_node.sh sentinel`.
#
# Each node runs a Redis and a Sentinel. A node that starts asks the other nodes' Sentinels which
# Redis is the master now and follows it; only when no Sentinel answers (the first start of the
# whole set) does the first node in NODES become the master. So a node that was the master, died
# and came back after a failover rejoins as a replica instead of a second master.
#
# Environment: REDIS_PASSWORD (the Redis and the Sentinels'), NODE (this node's address), NODES
# (every node's address, space-separated, the first is the initial master), DATA (Redis's AOF),
# SENTINEL_DIR (the Sentinel's config, rewritten by it), and optionally MASTER_SET (sluice),
# REDIS_PORT (6379), SENTINEL_PORT (26379), DOWN_AFTER_MS (5000), FAILOVER_TIMEOUT_MS (60000; a
# failover whose vote split is tried again after twice this), REDIS_BIND (every interface).
# The password reaches Redis on stdin and the Sentinel in a 0600 file: it is in no argv. Each
# role execs its server, which becomes the container's process and gets the stop's SIGTERM.
set -eu
MASTER_SET="${MASTER_SET:-sluice}"
REDIS_PORT="${REDIS_PORT:-6379}"
SENTINEL_PORT="${SENTINEL_PORT:-26379}"
DOWN_AFTER_MS="${DOWN_AFTER_MS:-5000}"
FAILOVER_TIMEOUT_MS="${FAILOVER_TIMEOUT_MS:-60000}"
export REDISCLI_AUTH="$REDIS_PASSWORD"

current_master() {
    for node in $NODES; do
        [ "$node" = "$NODE" ] && continue
        host=$(timeout 3 redis-cli --no-auth-warning -h "$node" -p "$SENTINEL_PORT" \
            sentinel get-master-addr-by-name "$MASTER_SET" 2>/dev/null | head -n 1) || continue
        case "$host" in "" | *" "*) continue ;; esac
        echo "$host"
        return
    done
    set -- $NODES
    echo "$1"
}

master=$(current_master)
bind=""
[ -n "${REDIS_BIND:-}" ] && bind="bind $REDIS_BIND"
case "${1:-}" in
redis)
    follow=""
    [ "$master" != "$NODE" ] && follow="replicaof $master $REDIS_PORT"
    echo "sluice-redis: $NODE starts as $([ -n "$follow" ] && echo "a replica of $master" || echo "the master")"
    # a here-document, not a pipe: exec leaves Redis this container's process, the one SIGTERM reaches
    exec redis-server - --port "$REDIS_PORT" --dir "$DATA" --appendonly yes --appendfsync everysec \
        --maxmemory-policy noeviction --replica-announce-ip "$NODE" \
        --min-replicas-to-write 1 --min-replicas-max-lag 1 --repl-diskless-sync-delay 0 <<EOF
requirepass $REDIS_PASSWORD
masterauth $REDIS_PASSWORD
$follow
$bind
EOF
    ;;
sentinel)
    umask 077
    mkdir -p "$SENTINEL_DIR"
    cat > "$SENTINEL_DIR/sentinel.conf" <<EOF
port $SENTINEL_PORT
$bind
requirepass $REDIS_PASSWORD
sentinel resolve-hostnames yes
sentinel announce-hostnames yes
sentinel announce-ip $NODE
sentinel monitor $MASTER_SET $master $REDIS_PORT 2
sentinel auth-pass $MASTER_SET $REDIS_PASSWORD
sentinel down-after-milliseconds $MASTER_SET $DOWN_AFTER_MS
sentinel failover-timeout $MASTER_SET $FAILOVER_TIMEOUT_MS
sentinel parallel-syncs $MASTER_SET 1
EOF
    echo "sluice-redis: $NODE's Sentinel watches $master"
    exec redis-server "$SENTINEL_DIR/sentinel.conf" --sentinel
    ;;
*)
    echo "usage: redis_node.sh redis|sentinel" >&2
    exit 2
    ;;
esac
