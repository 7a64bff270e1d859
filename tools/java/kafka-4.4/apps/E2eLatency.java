// End-to-end latency, one message at a time, the way Kafka's EndToEndLatency measures it
// (a synchronous send, then a poll with fetch.max.wait.ms=0 until the message is back),
// with a warm-up: the first WARMUP messages go through the same JVM and connections but
// are not counted, so the JIT and class loading of a new JVM stay out of the tail (the
// Kafka tool has no such option). For bench/latency.py. Compiled by scripts/fetch-jars.sh
// into .cache/jars/classes-4.4/; run as
//   java -cp '.cache/jars/classes-4.4:.cache/jars/kafka-4.4/*' E2eLatency \
//       BOOTSTRAP TOPIC WARMUP MESSAGES ACKS SIZE
// Prints EndToEndLatency's summary lines ("Avg latency: X ms", "Percentiles: 50th = ...,
// 99th = ..., 99.9th = ...", whole milliseconds as it does) and one more with
// microseconds: "Percentiles us: 50th = ..., 99th = ..., 99.9th = ..., max = ...".
// The topic must exist. Exits 1 if a message does not come back within 60 s or comes back
// changed.
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class E2eLatency {
    static final Duration POLL_TIMEOUT = Duration.ofSeconds(60);

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: E2eLatency BOOTSTRAP TOPIC WARMUP MESSAGES ACKS SIZE");
            System.exit(2);
        }
        String bootstrap = args[0];
        String topic = args[1];
        int warmup = Integer.parseInt(args[2]);
        int messages = Integer.parseInt(args[3]);
        String acks = args[4];
        int size = Integer.parseInt(args[5]);

        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("linger.ms", "0");
        pp.put("acks", acks);
        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("group.id", "e2e-" + System.nanoTime());
        cp.put("enable.auto.commit", "false");
        cp.put("auto.offset.reset", "latest");
        cp.put("fetch.max.wait.ms", "0");
        long[] lat = new long[messages];
        double total = 0;
        try (KafkaProducer<byte[], byte[]> producer =
                     new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer());
             KafkaConsumer<byte[], byte[]> consumer =
                     new KafkaConsumer<>(cp, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> parts = consumer.partitionsFor(topic).stream()
                    .map(p -> new TopicPartition(p.topic(), p.partition()))
                    .collect(Collectors.toList());
            consumer.assign(parts);
            consumer.seekToEnd(parts);
            parts.forEach(consumer::position);
            byte[] value = new byte[size];
            for (int i = 0; i < warmup + messages; i++) {
                Arrays.fill(value, (byte) ('A' + i % 26));
                long begin = System.nanoTime();
                producer.send(new ProducerRecord<>(topic, value)).get();
                ConsumerRecords<byte[], byte[]> got = consumer.poll(POLL_TIMEOUT);
                long elapsed = System.nanoTime() - begin;
                if (got.count() != 1 || !Arrays.equals(got.iterator().next().value(), value)) {
                    System.err.println("message " + i + ": expected it back alone, got "
                            + got.count() + " record(s)");
                    System.exit(1);
                }
                if (i >= warmup) {
                    lat[i - warmup] = elapsed / 1000;
                    total += elapsed;
                }
            }
        }
        Arrays.sort(lat);
        long p50 = lat[(int) (messages * 0.5)];
        long p99 = lat[(int) (messages * 0.99)];
        long p999 = lat[(int) (messages * 0.999)];
        System.out.printf("Avg latency: %.4f ms%n", total / messages / 1e6);
        System.out.printf("Percentiles: 50th = %d, 99th = %d, 99.9th = %d%n",
                p50 / 1000, p99 / 1000, p999 / 1000);
        System.out.printf("Percentiles us: 50th = %d, 99th = %d, 99.9th = %d, max = %d%n",
                p50, p99, p999, lat[messages - 1]);
    }
}
