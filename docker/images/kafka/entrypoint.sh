#!/bin/sh
# A KRaft node (broker and controller). The client listener is KAFKA_PORT (default 9092) inside
# the container and is advertised as KAFKA_ADVERTISED_HOST:KAFKA_PORT (default 127.0.0.1): publish
# the container's port on the same host port (-p 127.0.0.1:P:P -e KAFKA_PORT=P) so the address
# the broker gives clients is the one they reach it by.
#
# Alone by default. A cluster of N nodes on one Docker network, each started with
#   KAFKA_NODE_ID      its id (1..N)
#   KAFKA_VOTERS       every controller, e.g. 1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093
#   KAFKA_INTERNAL_HOST  the name the others reach it by on the network (brokers replicate
#                      through port 9094 there, controllers talk on 9093; both listen on that
#                      name's address only, so nodes reach each other on that network alone)
#   KAFKA_CLUSTER_ID   one id for them all (`kafka-storage random-uuid` makes one)
#   KAFKA_REPLICATION  replicas of every topic, the offsets and the transaction log (default 1;
#                      more than 2 requires two in sync for a write)
# KAFKA_PROPERTIES (lines of server.properties) is appended last.
set -eu
port=${KAFKA_PORT:-9092}
host=${KAFKA_ADVERTISED_HOST:-127.0.0.1}
node=${KAFKA_NODE_ID:-1}
replicas=${KAFKA_REPLICATION:-1}
min_isr=1
[ "$replicas" -gt 2 ] && min_isr=2
data=/var/lib/kafka/data
props=/var/lib/kafka/server.properties
if [ -n "${KAFKA_INTERNAL_HOST:-}" ]; then
  internal=$KAFKA_INTERNAL_HOST
  cat > "$props" <<PROPS
controller.quorum.voters=${KAFKA_VOTERS:?KAFKA_INTERNAL_HOST needs KAFKA_VOTERS}
listeners=PLAINTEXT://0.0.0.0:$port,INTERNAL://$internal:9094,CONTROLLER://$internal:9093
advertised.listeners=PLAINTEXT://$host:$port,INTERNAL://$internal:9094,CONTROLLER://$internal:9093
inter.broker.listener.name=INTERNAL
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
PROPS
else
  cat > "$props" <<PROPS
controller.quorum.voters=${KAFKA_VOTERS:-$node@127.0.0.1:9093}
listeners=PLAINTEXT://0.0.0.0:$port,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://$host:$port
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
PROPS
fi
cat >> "$props" <<PROPS
process.roles=broker,controller
node.id=$node
controller.listener.names=CONTROLLER
log.dirs=$data
num.partitions=1
default.replication.factor=$replicas
min.insync.replicas=$min_isr
offsets.topic.replication.factor=$replicas
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$min_isr
share.coordinator.state.topic.replication.factor=$replicas
share.coordinator.state.topic.min.isr=$min_isr
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
${KAFKA_PROPERTIES:-}
PROPS
cp=/opt/kafka/libs/*
log="-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties"
if [ ! -f "$data/meta.properties" ]; then
  id=${KAFKA_CLUSTER_ID:-$(java $log -cp "$cp" kafka.tools.StorageTool random-uuid | tail -n 1)}
  java $log -cp "$cp" kafka.tools.StorageTool format -t "$id" -c "$props" >/dev/null
fi
exec java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true $log -cp "$cp" kafka.Kafka "$props"
