package dev.exactly.peers;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.typeinfo.TypeHint;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerRecord;

/**
 * Copies every record of the input topic to the output topic (key, value, timestamp) with
 * Flink's KafkaSource and KafkaSink (DeliveryGuarantee.EXACTLY_ONCE), checkpointing every
 * INTERVAL_MS, in a local (MiniCluster) environment. Runs until killed; `exactly bench peers`
 * times it from outside.
 *
 * <p>Arguments: BOOTSTRAP INPUT OUTPUT INTERVAL_MS PARALLELISM TRANSACTIONAL_ID_PREFIX
 */
public final class PassThrough {
    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: PassThrough BOOTSTRAP INPUT OUTPUT INTERVAL_MS PARALLELISM TRANSACTIONAL_ID_PREFIX");
            System.exit(2);
        }
        String bootstrap = args[0];
        String output = args[2];
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(Integer.parseInt(args[4]));
        env.enableCheckpointing(Long.parseLong(args[3]), CheckpointingMode.EXACTLY_ONCE);

        KafkaSource<Tuple2<byte[], byte[]>> source = KafkaSource.<Tuple2<byte[], byte[]>>builder()
                .setBootstrapServers(bootstrap)
                .setTopics(args[1])
                .setGroupId(args[5])
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setProperty("isolation.level", "read_committed")
                .setDeserializer(new KeyValue())
                .build();
        KafkaSink<Tuple2<byte[], byte[]>> sink = KafkaSink.<Tuple2<byte[], byte[]>>builder()
                .setBootstrapServers(bootstrap)
                .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .setTransactionalIdPrefix(args[5])
                // Below the broker's transaction.max.timeout.ms (15 min); Flink's default is 1 h.
                .setProperty("transaction.timeout.ms", "600000")
                .setRecordSerializer((KafkaRecordSerializationSchema<Tuple2<byte[], byte[]>>) (r, ctx, ts) ->
                        new ProducerRecord<>(output, null, ts, r.f0, r.f1))
                .build();
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "in").sinkTo(sink);
        System.out.println("started");
        env.execute("peer-flink");
    }

    /** The record's key and value as they are. */
    static final class KeyValue implements KafkaRecordDeserializationSchema<Tuple2<byte[], byte[]>> {
        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> r, Collector<Tuple2<byte[], byte[]>> out) {
            out.collect(Tuple2.of(r.key(), r.value()));
        }

        @Override
        public TypeInformation<Tuple2<byte[], byte[]>> getProducedType() {
            return TypeInformation.of(new TypeHint<Tuple2<byte[], byte[]>>() {});
        }
    }
}
