// A KafkaConsumer (kafka-clients 4.4) in a group with group.protocol=consumer (KIP-848),
// for tests/test_consumer_protocol.py. Run from source with the 4.4 jars:
//   java -cp '.cache/jars/kafka-4.4/*' tools/java/kafka-4.4/ConsumerProtocolClient.java \
//       BOOTSTRAP GROUP TOPIC NAME [key=value ...]
// Prints one JSON object a line on stdout: "assigned"/"revoked"/"lost" from the rebalance
// listener (with the wall-clock time, to check that no partition has two owners at once),
// "records" (partition, offset, value) for each poll before its offsets are committed
// (commitSync), "committed" or "commit_failed". A commit refused while the member's epoch
// moves on (STALE_MEMBER_EPOCH, which the 4.4 client does not retry) is tried again on the
// next poll for the partitions the member still owns, as an application would; otherwise
// the last batch before the producer stops would stay uncommitted. A line "stop" (or end
// of input) on stdin ends the loop at its next poll (within 200 ms, never inside a
// commit): what it processed is committed, then the consumer closes and leaves the group.
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ConsumerProtocolClient {
    static final Object OUT = new Object();

    static void emit(String json) {
        synchronized (OUT) {
            System.out.println(json);
            System.out.flush();
        }
    }

    static String parts(Collection<TopicPartition> tps) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : tps) out.add(Integer.toString(tp.partition()));
        return "[" + String.join(",", out) + "]";
    }

    static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", " ") + "\"";
    }

    static boolean commit(KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, OffsetAndMetadata> offsets) {
        try {
            consumer.commitSync(offsets);
        } catch (Exception e) {
            emit("{\"ev\":\"commit_failed\",\"error\":" + quote(e.getClass().getSimpleName() + ": " + e.getMessage()) + "}");
            return false;
        }
        StringBuilder c = new StringBuilder();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            if (c.length() > 0) c.append(',');
            c.append('[').append(e.getKey().partition()).append(',').append(e.getValue().offset()).append(']');
        }
        emit("{\"ev\":\"committed\",\"ts\":" + System.currentTimeMillis() + ",\"offsets\":[" + c + "]}");
        return true;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], name = args[3];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("group.id", group);
        props.put("group.protocol", "consumer");
        props.put("client.id", name);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        AtomicBoolean stop = new AtomicBoolean(false);
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        Thread stdin = new Thread(() -> {
            try {
                java.io.BufferedReader r = new java.io.BufferedReader(new java.io.InputStreamReader(System.in));
                String line;
                while ((line = r.readLine()) != null && !line.trim().equals("stop")) { }
            } catch (java.io.IOException e) { }
            // No wakeup(): it would abort a commit in flight, and a member stopped right
            // after its first batch would leave having committed nothing.
            stop.set(true);
        });
        stdin.setDaemon(true);
        stdin.start();
        // Offsets whose commit was refused; dropped when the partition is revoked or lost
        // (the next owner reads from the last commit and commits on its own).
        Map<TopicPartition, OffsetAndMetadata> pending = new HashMap<>();
        consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
            public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                pending.keySet().removeAll(tps);
                emit("{\"ev\":\"revoked\",\"ts\":" + System.currentTimeMillis() + ",\"parts\":" + parts(tps) + "}");
            }
            public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                emit("{\"ev\":\"assigned\",\"ts\":" + System.currentTimeMillis() + ",\"parts\":" + parts(tps) + "}");
            }
            public void onPartitionsLost(Collection<TopicPartition> tps) {
                pending.keySet().removeAll(tps);
                emit("{\"ev\":\"lost\",\"ts\":" + System.currentTimeMillis() + ",\"parts\":" + parts(tps) + "}");
            }
        });
        emit("{\"ev\":\"started\"}");
        try {
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                pending.keySet().retainAll(consumer.assignment());
                if (records.isEmpty() && pending.isEmpty()) continue;
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>(pending);
                StringBuilder recs = new StringBuilder();
                for (ConsumerRecord<byte[], byte[]> rec : records) {
                    if (recs.length() > 0) recs.append(',');
                    recs.append('[').append(rec.partition()).append(',').append(rec.offset()).append(',')
                        .append(quote(new String(rec.value()))).append(']');
                    next.put(new TopicPartition(rec.topic(), rec.partition()), new OffsetAndMetadata(rec.offset() + 1));
                }
                if (!records.isEmpty())
                    emit("{\"ev\":\"records\",\"ts\":" + System.currentTimeMillis() + ",\"recs\":[" + recs + "]}");
                pending.clear();
                // A commit refused during a rebalance or after fencing (STALE_MEMBER_EPOCH,
                // UNKNOWN_MEMBER_ID) is tried again next poll while the partition is ours,
                // else the next owner processes the records again.
                if (!commit(consumer, next)) pending.putAll(next);
            }
            // A graceful shutdown commits what is still pending for partitions it owns.
            pending.keySet().retainAll(consumer.assignment());
            if (!pending.isEmpty()) commit(consumer, pending);
        } finally {
            consumer.close();
            emit("{\"ev\":\"closed\",\"ts\":" + System.currentTimeMillis() + "}");
        }
    }
}
