package dev.exactly.peers;

import java.nio.file.Files;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Produced;

/**
 * Copies every record of the input topic to the output topic (key, value, timestamp, headers)
 * with processing.guarantee=exactly_once_v2, committing every INTERVAL_MS. Runs until killed;
 * `exactly bench peers` times it from outside.
 *
 * <p>Arguments: BOOTSTRAP INPUT OUTPUT INTERVAL_MS THREADS APPLICATION_ID
 */
public final class PassThrough {
    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: PassThrough BOOTSTRAP INPUT OUTPUT INTERVAL_MS THREADS APPLICATION_ID");
            System.exit(2);
        }
        Properties p = new Properties();
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, args[5]);
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(args[3]));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, Integer.parseInt(args[4]));
        p.put(StreamsConfig.STATE_DIR_CONFIG, Files.createTempDirectory("peer-kafka-streams").toString());
        p.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        // A single-node broker: internal topics (none here) and transactions with replication 1.
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);

        StreamsBuilder b = new StreamsBuilder();
        b.stream(args[1], Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()))
                .to(args[2], Produced.with(Serdes.ByteArray(), Serdes.ByteArray()));
        KafkaStreams streams = new KafkaStreams(b.build(), p);
        CountDownLatch done = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.start();
        System.out.println("started");
        done.await();
    }
}
