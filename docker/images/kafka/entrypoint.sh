#!/bin/sh
# One KRaft node. The client listener is KAFKA_PORT (default 9092) inside the container and is
# advertised as KAFKA_ADVERTISED_HOST:KAFKA_PORT (default 127.0.0.1): publish the container's
# port on the same host port (-p 127.0.0.1:P:P -e KAFKA_PORT=P) so the address the broker gives
# clients is the one they reach it by.
set -eu
port=${KAFKA_PORT:-9092}
host=${KAFKA_ADVERTISED_HOST:-127.0.0.1}
data=/var/lib/kafka/data
props=/var/lib/kafka/server.properties
cat > "$props" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://0.0.0.0:$port,CONTROLLER://127.0.0.1:9093
advertised.listeners=PLAINTEXT://$host:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$data
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
PROPS
cp=/opt/kafka/libs/*
log="-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties"
if [ ! -f "$data/meta.properties" ]; then
  id=$(java $log -cp "$cp" kafka.tools.StorageTool random-uuid | tail -n 1)
  java $log -cp "$cp" kafka.tools.StorageTool format -t "$id" -c "$props" >/dev/null
fi
exec java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true $log -cp "$cp" kafka.Kafka "$props"
