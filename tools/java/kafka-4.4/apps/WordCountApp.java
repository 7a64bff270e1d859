// A Kafka Streams (4.4) word count, for tests/test_streams_connect.py. Compiled by
// scripts/fetch-jars.sh against the 4.4 jars into .cache/jars/classes-4.4/; run as
//   java -cp '.cache/jars/classes-4.4:.cache/jars/kafka-4.4/*' WordCountApp \
//       --bootstrap HOST:PORT --application-id ID --state-dir DIR --input T --output T \
//       [key=value ...]   (more StreamsConfig settings)
//
// Topology: lines (input) -> words -> groupBy(word) (a repartition topic,
// ID-words-repartition) -> count() into the persistent (RocksDB) store "word-counts" (its
// changelog, ID-word-counts-changelog, is a compacted topic) -> (word, count) to the output
// topic (String key, Long value). processing.guarantee=at_least_once, the record cache is
// off so that every count update reaches the output, and commits are frequent so that the
// output follows the input within a second; a 6 s consumer session (see below).
//
// Prints one line per event on stdout, flushed, for the test to wait on:
//   state <OLD> <NEW>                      every KafkaStreams state change ("state ... RUNNING")
//   restore-start <store> <topic> <partition> <from> <to>, then
//   restored <store> <topic> <partition> <records>   state rebuilt from a changelog
//   error <exception>                      an uncaught exception: the client shuts down and
//                                          the process exits 1
// SIGTERM closes the application (commits its offsets) and exits 0.
import java.time.Duration;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

public class WordCountApp {
    static final Object OUT = new Object();

    static void emit(String line) {
        synchronized (OUT) {
            System.out.println(line);
            System.out.flush();
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opt = new HashMap<>();
        Properties props = new Properties();
        for (int i = 0; i < args.length; i++) {
            if (args[i].startsWith("--")) {
                opt.put(args[i].substring(2), args[++i]);
            } else {
                String[] kv = args[i].split("=", 2);
                props.put(kv[0], kv[1]);
            }
        }
        for (String k : new String[] {"bootstrap", "application-id", "state-dir", "input", "output"}) {
            if (!opt.containsKey(k)) {
                System.err.println("missing --" + k);
                System.exit(2);
            }
        }
        props.putIfAbsent(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, opt.get("bootstrap"));
        props.putIfAbsent(StreamsConfig.APPLICATION_ID_CONFIG, opt.get("application-id"));
        props.putIfAbsent(StreamsConfig.STATE_DIR_CONFIG, opt.get("state-dir"));
        props.putIfAbsent(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.AT_LEAST_ONCE);
        props.putIfAbsent(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
        props.putIfAbsent(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");
        props.putIfAbsent(StreamsConfig.NUM_STREAM_THREADS_CONFIG, "1");
        // A Streams consumer does not leave its group on close: a restarted instance waits
        // for the old member's session to expire (45 s by default), so keep it short.
        props.putIfAbsent("session.timeout.ms", "6000");
        props.putIfAbsent("heartbeat.interval.ms", "1000");

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(opt.get("input"), Consumed.with(Serdes.String(), Serdes.String()))
            .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\W+")))
            .filter((key, word) -> !word.isEmpty())
            .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
            .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("word-counts")
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long()))
            .toStream()
            .to(opt.get("output"), Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        int[] exit = {0};
        streams.setStateListener((now, old) -> {
            emit("state " + old + " " + now);
            if (now == KafkaStreams.State.NOT_RUNNING || now == KafkaStreams.State.ERROR) {
                done.countDown();
            }
        });
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {
                emit("restore-start " + store + " " + tp.topic() + " " + tp.partition() + " " + start + " " + end);
            }

            public void onBatchRestored(TopicPartition tp, String store, long end, long n) { }

            public void onRestoreEnd(TopicPartition tp, String store, long total) {
                emit("restored " + store + " " + tp.topic() + " " + tp.partition() + " " + total);
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            emit("error " + e.toString().replace('\n', ' '));
            exit[0] = 1;
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close(Duration.ofSeconds(30));
            emit("closed");
        }));
        streams.start();
        done.await();
        if (exit[0] != 0) {
            streams.close(Duration.ofSeconds(10));
            System.exit(exit[0]);
        }
    }
}
