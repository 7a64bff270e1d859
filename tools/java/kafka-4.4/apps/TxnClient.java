// The Java transactional producer and a read_committed consumer (Kafka 4.4 clients), driven
// one command per stdin line, for tests/test_transactions_java.py. Compiled by
// scripts/fetch-jars.sh into .cache/jars/classes-4.4/; run as
//   java -cp '.cache/jars/classes-4.4:.cache/jars/kafka-4.4/*' TxnClient --bootstrap HOST:PORT
//
// Several named producers live in one process, so that a test can hold a zombie and the
// producer that fences it side by side. Commands (one reply line each, "ok ..." or
// "error <ExceptionClass>[<-CauseClass...] <message>"):
//   new NAME TRANSACTIONAL_ID TIMEOUT_MS   a producer; initTransactions()
//   NAME begin | NAME flush | NAME commit | NAME abort | NAME close
//   NAME send TOPIC PARTITION PREFIX COUNT  COUNT records PREFIX-0 .. PREFIX-(COUNT-1)
//                                          (key = the value), not waited for
//   read TOPIC ISOLATION                   every record of every partition from the start
//                                          to the end offsets the isolation level sees
//                                          (the LSO for read_committed): "ok v1 v2 ..."
// Prints "ready" once it reads commands. EOF on stdin closes everything and exits 0.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnClient {
    static String bootstrap;
    static final Map<String, KafkaProducer<String, String>> producers = new HashMap<>();

    static void reply(String line) {
        System.out.println(line.replace('\n', ' '));
        System.out.flush();
    }

    static String describe(Throwable e) {
        StringBuilder names = new StringBuilder(e.getClass().getSimpleName());
        for (Throwable c = e.getCause(); c != null && c != c.getCause(); c = c.getCause()) {
            names.append("<-").append(c.getClass().getSimpleName());
        }
        return names + " " + e.getMessage();
    }

    static KafkaProducer<String, String> producer(String tid, String timeoutMs) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", tid);
        p.put("transaction.timeout.ms", timeoutMs);
        p.put("linger.ms", "5");
        p.put("max.block.ms", "60000");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        KafkaProducer<String, String> producer = new KafkaProducer<>(p);
        producer.initTransactions();
        return producer;
    }

    static List<String> read(String topic, String isolation) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("isolation.level", isolation);
        p.put("enable.auto.commit", "false");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        List<String> out = new ArrayList<>();
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo info : c.partitionsFor(topic, Duration.ofSeconds(30))) {
                tps.add(new TopicPartition(topic, info.partition()));
            }
            c.assign(tps);
            c.seekToBeginning(tps);
            // endOffsets follows the consumer's isolation level: the LSO for read_committed
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(30));
            long deadline = System.currentTimeMillis() + 60_000;
            while (true) {
                boolean done = true;
                for (TopicPartition tp : tps) {
                    if (c.position(tp, Duration.ofSeconds(30)) < end.get(tp)) {
                        done = false;
                    }
                }
                if (done) {
                    return out;
                }
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("did not reach " + end + " in 60 s");
                }
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(200))) {
                    out.add(r.value());
                }
            }
        }
    }

    static String run(String[] w) throws Exception {
        if (w[0].equals("new")) {
            producers.put(w[1], producer(w[2], w[3]));
            return "ok";
        }
        if (w[0].equals("read")) {
            return "ok " + String.join(" ", read(w[1], w[2]));
        }
        KafkaProducer<String, String> p = producers.get(w[0]);
        if (p == null) {
            return "error NoSuchProducer " + w[0];
        }
        switch (w[1]) {
            case "begin":
                p.beginTransaction();
                break;
            case "send":
                for (int i = 0; i < Integer.parseInt(w[5]); i++) {
                    String v = w[4] + "-" + i;
                    p.send(new ProducerRecord<>(w[2], Integer.parseInt(w[3]), v, v));
                }
                break;
            case "flush":
                p.flush();
                break;
            case "commit":
                p.commitTransaction();
                break;
            case "abort":
                p.abortTransaction();
                break;
            case "close":
                producers.remove(w[0]);
                p.close(Duration.ofSeconds(10));
                break;
            default:
                return "error BadCommand " + w[1];
        }
        return "ok";
    }

    public static void main(String[] args) throws Exception {
        for (int i = 0; i < args.length; i++) {
            if (args[i].equals("--bootstrap")) {
                bootstrap = args[++i];
            }
        }
        if (bootstrap == null) {
            System.err.println("missing --bootstrap");
            System.exit(2);
        }
        reply("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            try {
                reply(run(line.trim().split("\\s+")));
            } catch (Exception e) {
                reply("error " + describe(e));
            }
        }
        for (KafkaProducer<String, String> p : producers.values()) {
            p.close(Duration.ofSeconds(5));
        }
    }
}
