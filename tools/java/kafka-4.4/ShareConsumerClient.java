// A KafkaShareConsumer (kafka-clients 4.4, KIP-932 share groups) for
// tests/test_share_groups.py. Run from source with the 4.4 jars:
//   java -cp '.cache/jars/kafka-4.4/*' tools/java/kafka-4.4/ShareConsumerClient.java \
//       BOOTSTRAP GROUP TOPIC NAME MODE [key=value ...]
// MODE "accept": every record polled is acknowledged (explicit mode, commitSync): RELEASE
// if its value starts with "release", REJECT if with "reject", else ACCEPT.
// MODE "implicit": share.acknowledgement.mode=implicit, the client's default: each poll
// accepts the records of the previous one.
// MODE "hold": the records of the first non-empty poll are printed and never
// acknowledged; the process then only sleeps (the test kills it).
// Prints one JSON object a line on stdout: "started", "records" (partition, offset,
// delivery count, value) per poll, "committed", "closed". A line "stop" (or end of
// input) on stdin closes the consumer.
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ShareConsumerClient {
    static synchronized void emit(String json) {
        System.out.println(json);
        System.out.flush();
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], name = args[3], mode = args[4];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("client.id", name);
        // "implicit" (Kafka's default): the records of a poll are accepted by the next poll.
        props.put("share.acknowledgement.mode", mode.equals("implicit") ? "implicit" : "explicit");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        for (int i = 5; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        KafkaShareConsumer<byte[], byte[]> consumer = new KafkaShareConsumer<>(props);
        Thread stdin = new Thread(() -> {
            try {
                java.io.BufferedReader r = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
                String line;
                while ((line = r.readLine()) != null && !line.trim().equals("stop")) { }
            } catch (java.io.IOException e) { }
            stop.set(true);
            consumer.wakeup();
        });
        stdin.setDaemon(true);
        stdin.start();
        consumer.subscribe(List.of(topic));
        emit("{\"ev\":\"started\"}");
        try {
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> records;
                try {
                    records = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                if (records.isEmpty()) continue;
                StringBuilder recs = new StringBuilder();
                for (ConsumerRecord<byte[], byte[]> rec : records) {
                    if (recs.length() > 0) recs.append(',');
                    recs.append('[').append(rec.partition()).append(',').append(rec.offset()).append(',')
                        .append(rec.deliveryCount().orElse((short) -1)).append(',')
                        .append(quote(new String(rec.value()))).append(']');
                }
                emit("{\"ev\":\"records\",\"ts\":" + System.currentTimeMillis() + ",\"recs\":[" + recs + "]}");
                if (mode.equals("implicit")) continue;
                if (mode.equals("hold")) {
                    while (!stop.get()) Thread.sleep(100);
                    break;
                }
                for (ConsumerRecord<byte[], byte[]> rec : records) {
                    String v = new String(rec.value());
                    AcknowledgeType type = v.startsWith("release") ? AcknowledgeType.RELEASE
                        : v.startsWith("reject") ? AcknowledgeType.REJECT : AcknowledgeType.ACCEPT;
                    consumer.acknowledge(rec, type);
                }
                try {
                    Map<TopicIdPartition, Optional<KafkaException>> result = consumer.commitSync();
                    StringBuilder errs = new StringBuilder();
                    for (Map.Entry<TopicIdPartition, Optional<KafkaException>> e : result.entrySet()) {
                        if (e.getValue().isPresent()) {
                            if (errs.length() > 0) errs.append(',');
                            errs.append(quote(e.getKey().partition() + ": " + e.getValue().get()));
                        }
                    }
                    emit("{\"ev\":\"committed\",\"ts\":" + System.currentTimeMillis() + ",\"errors\":[" + errs + "]}");
                } catch (WakeupException e) {
                    break;
                }
            }
        } finally {
            consumer.close();
            emit("{\"ev\":\"closed\",\"ts\":" + System.currentTimeMillis() + "}");
        }
    }
}
