/*
 * StraitClient: a small CLI around the official Apache Kafka Java client (kafka-clients 3.9),
 * used by StraitMQ's tests and benchmarks to drive a broker the way a real Java application does.
 *
 * Compiled by scripts/fetch-jars.sh into .cache/jars/classes/ (plain javac, Java 17).
 * Run through bench/javatools.py (straitclient([...])) or by hand:
 *   java -cp ".cache/jars/classes:.cache/jars/kafka-3.9/*" StraitClient <command> [options]
 *
 * stdout carries JSON only, one object per line; diagnostics and client logs go to stderr.
 *
 * Commands
 *   produce --bootstrap H:P --topic T [--count N] [--compression none|gzip|snappy|lz4|zstd]
 *           [--acks all|1|0] [--key-prefix k] [--value-prefix v] [--value-size BYTES] [--no-keys]
 *           [--headers] [--idempotent true|false] [--partition P] [--linger-ms MS] [--batch-size B]
 *           [--transactional-id ID [--abort]] [--timeout-ms MS] [--prop k=v]...
 *       sends N records, key "<key-prefix><i>", value "<value-prefix><i>" (padded with 'x' up to
 *       --value-size), header h=<i> with --headers; waits for every ack, then prints
 *       {"acked":N,"errors":E,"offsets":{"<partition>":[first,last],...}}
 *       (+ "error_types":{...} when E>0, + "transaction":"committed"|"aborted").
 *       Exit 0 when E == 0, else 1.
 *
 *   consume --bootstrap H:P --topic T[,T2] [--group G] [--count N] [--timeout-ms M]
 *           [--assignor range|roundrobin|sticky|cooperative-sticky] [--commit sync|async|auto|none]
 *           [--offset-reset earliest|latest|none] [--isolation read_committed|read_uncommitted]
 *           [--group-protocol classic|consumer] [--partition P [--from-offset O]]
 *           [--max-poll-records R] [--quiet] [--full] [--prop k=v]...
 *       consumes until N records (or until timeout when --count is absent), commits the offsets
 *       of exactly the records it printed (default --commit sync when --group is given), prints
 *       one line per record {"p":..,"o":..,"k":..,"v":..,"h":{..}} (with --full also "t" topic,
 *       "ts" timestamp, "tt" timestamp type, "le" leader epoch) and a final summary
 *       {"done":count,"assignment":[..],"committed":{"<p>":next_offset}}.
 *       Without --group: manual assign() of all partitions (or --partition), no commits.
 *       With --group, a member has --timeout-ms from the end of its first rebalance and
 *       again from its first partitions (a join on a busy machine may take most of the
 *       first), so one handed nothing in a cooperative rebalance's first round waits for the
 *       second, and one that gets none stops then; one whose time ends in a rebalance
 *       (assigned nothing for now) waits for its new assignment, at most one more
 *       --timeout-ms.
 *       Exit 0 when count reached (or no --count), 2 on timeout before count.
 *
 *   admin --bootstrap H:P <sub> [...] [--timeout-ms MS] [--prop k=v]...
 *       create-topic T [partitions [rf]] [--config k=v]... [--if-not-exists]
 *       list-topics [--internal]
 *       describe-topic T [--configs]
 *       delete-topic T
 *       create-partitions T total_count
 *       describe-configs T
 *       describe-cluster
 *       list-groups
 *       describe-group G
 *       group-offsets G
 *       delete-group G
 *       list-offsets T
 *     Errors: {"error":"<ExceptionSimpleName>","message":".."} and exit 1.
 */

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class StraitClient {

    // ------------------------------------------------------------------ options

    static final Set<String> FLAGS = Set.of("headers", "abort", "quiet", "full", "no-keys",
            "if-not-exists", "internal", "configs");
    static final Set<String> MULTI = Set.of("prop", "config");

    static final class Opts {
        final Map<String, String> single = new HashMap<>();
        final Map<String, List<String>> multi = new HashMap<>();
        final List<String> positional = new ArrayList<>();

        static Opts parse(String[] args, int from) {
            Opts o = new Opts();
            for (int i = from; i < args.length; i++) {
                String a = args[i];
                if (a.startsWith("--") && a.length() > 2) {
                    String name = a.substring(2);
                    String value = null;
                    int eq = name.indexOf('=');
                    if (eq > 0 && !MULTI.contains(name.substring(0, eq))) {
                        value = name.substring(eq + 1);
                        name = name.substring(0, eq);
                    }
                    if (FLAGS.contains(name)) {
                        o.single.put(name, value == null ? "true" : value);
                        continue;
                    }
                    if (value == null) {
                        if (i + 1 >= args.length) throw new IllegalArgumentException("option --" + name + " needs a value");
                        value = args[++i];
                    }
                    if (MULTI.contains(name)) o.multi.computeIfAbsent(name, k -> new ArrayList<>()).add(value);
                    else o.single.put(name, value);
                } else {
                    o.positional.add(a);
                }
            }
            return o;
        }

        String get(String k, String def) { return single.getOrDefault(k, def); }
        String req(String k) {
            String v = single.get(k);
            if (v == null) throw new IllegalArgumentException("missing --" + k);
            return v;
        }
        boolean has(String k) { return single.containsKey(k); }
        boolean flag(String k) { return Boolean.parseBoolean(single.getOrDefault(k, "false")); }
        long getLong(String k, long def) { return single.containsKey(k) ? Long.parseLong(single.get(k)) : def; }
        List<String> all(String k) { return multi.getOrDefault(k, List.of()); }

        void applyProps(Properties p) {
            for (String kv : all("prop")) {
                int eq = kv.indexOf('=');
                if (eq <= 0) throw new IllegalArgumentException("--prop expects key=value, got " + kv);
                p.put(kv.substring(0, eq), kv.substring(eq + 1));
            }
        }
    }

    // ------------------------------------------------------------------ tiny JSON writer

    static String json(Object o) {
        StringBuilder sb = new StringBuilder();
        writeJson(sb, o);
        return sb.toString();
    }

    @SuppressWarnings("unchecked")
    static void writeJson(StringBuilder sb, Object o) {
        if (o == null) {
            sb.append("null");
        } else if (o instanceof String) {
            quote(sb, (String) o);
        } else if (o instanceof Boolean || o instanceof Integer || o instanceof Long || o instanceof Short) {
            sb.append(o);
        } else if (o instanceof Number) {
            double d = ((Number) o).doubleValue();
            if (Double.isFinite(d)) sb.append(o); else sb.append("null");
        } else if (o instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<Object, Object> e : ((Map<Object, Object>) o).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                quote(sb, String.valueOf(e.getKey()));
                sb.append(':');
                writeJson(sb, e.getValue());
            }
            sb.append('}');
        } else if (o instanceof Collection) {
            sb.append('[');
            boolean first = true;
            for (Object e : (Collection<Object>) o) {
                if (!first) sb.append(',');
                first = false;
                writeJson(sb, e);
            }
            sb.append(']');
        } else if (o instanceof long[]) {
            List<Long> l = new ArrayList<>();
            for (long v : (long[]) o) l.add(v);
            writeJson(sb, l);
        } else {
            quote(sb, o.toString());
        }
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
                    else sb.append(c);
            }
        }
        sb.append('"');
    }

    static void out(Object o) {
        System.out.println(json(o));
    }

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i + 1 < kv.length; i += 2) m.put(String.valueOf(kv[i]), kv[i + 1]);
        return m;
    }

    static String str(byte[] b) {
        return b == null ? null : new String(b, StandardCharsets.UTF_8);
    }

    static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof ExecutionException || t instanceof java.util.concurrent.CompletionException)
                && t.getCause() != null)
            t = t.getCause();
        return t;
    }

    static void log(String msg) {
        System.err.println("StraitClient: " + msg);
    }

    // ------------------------------------------------------------------ produce

    static int produce(Opts o) throws Exception {
        String bootstrap = o.req("bootstrap");
        String topic = o.req("topic");
        long count = o.getLong("count", 1);
        String compression = o.get("compression", "none");
        String acks = o.get("acks", "all");
        String keyPrefix = o.get("key-prefix", "k");
        String valuePrefix = o.get("value-prefix", "v");
        int valueSize = (int) o.getLong("value-size", 0);
        boolean withHeaders = o.flag("headers");
        boolean noKeys = o.flag("no-keys");
        Integer partition = o.has("partition") ? Integer.valueOf(o.req("partition")) : null;
        long timeoutMs = o.getLong("timeout-ms", 30000);
        long lingerMs = o.getLong("linger-ms", -1);
        String txId = o.get("transactional-id", null);

        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, o.get("client-id", "straitclient-producer"));
        p.put(ProducerConfig.ACKS_CONFIG, acks);
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        if (lingerMs >= 0) p.put(ProducerConfig.LINGER_MS_CONFIG, Long.toString(lingerMs));
        if (o.has("batch-size")) p.put(ProducerConfig.BATCH_SIZE_CONFIG, o.req("batch-size"));
        if (o.has("idempotent")) p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, o.req("idempotent"));
        long reqTimeout = Math.min(30000, timeoutMs);
        p.put(ProducerConfig.REQUEST_TIMEOUT_MS_CONFIG, Long.toString(reqTimeout));
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, Long.toString(timeoutMs + Math.max(lingerMs, 0) + 1));
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, Long.toString(timeoutMs));
        if (txId != null) {
            p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txId);
            p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "60000");
        }
        o.applyProps(p);

        final Map<Integer, long[]> offsets = new TreeMap<>();
        final Map<String, Integer> errorTypes = new TreeMap<>();
        final AtomicLong acked = new AtomicLong();
        final AtomicLong errors = new AtomicLong();
        final AtomicLong printedErrors = new AtomicLong();

        Callback cb = (md, ex) -> {
            if (ex != null) {
                errors.incrementAndGet();
                synchronized (errorTypes) { errorTypes.merge(ex.getClass().getSimpleName(), 1, Integer::sum); }
                if (printedErrors.incrementAndGet() <= 5) log("send failed: " + ex);
            } else {
                acked.incrementAndGet();
                synchronized (offsets) {
                    long[] r = offsets.get(md.partition());
                    long off = md.hasOffset() ? md.offset() : -1;
                    if (r == null) offsets.put(md.partition(), new long[]{off, off});
                    else { r[0] = Math.min(r[0], off); r[1] = Math.max(r[1], off); }
                }
            }
        };

        String txOutcome = null;
        try (KafkaProducer<byte[], byte[]> producer =
                     new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            if (txId != null) {
                producer.initTransactions();
                producer.beginTransaction();
            }
            long first = 0;
            try {
                // fetch metadata once (bounded by max.block.ms = --timeout-ms) instead of
                // letting every send() block that long when the topic or broker is missing
                producer.partitionsFor(topic);
            } catch (KafkaException e) {
                log("no metadata for topic " + topic + ": " + e);
                errors.addAndGet(count);
                errorTypes.merge(e.getClass().getSimpleName(), (int) Math.min(count, Integer.MAX_VALUE), Integer::sum);
                first = count;
            }
            for (long i = first; i < count; i++) {
                byte[] key = noKeys ? null : bytes(keyPrefix + i);
                String v = valuePrefix + i;
                if (valueSize > v.length()) {
                    StringBuilder sb = new StringBuilder(valueSize).append(v);
                    while (sb.length() < valueSize) sb.append('x');
                    v = sb.toString();
                }
                RecordHeaders headers = new RecordHeaders();
                if (withHeaders) headers.add("h", bytes(Long.toString(i)));
                ProducerRecord<byte[], byte[]> rec =
                        new ProducerRecord<>(topic, partition, null, key, bytes(v), headers);
                try {
                    producer.send(rec, cb);
                } catch (KafkaException e) {
                    cb.onCompletion(null, e);
                    if (txId != null) break;
                }
            }
            producer.flush();
            if (txId != null) {
                try {
                    if (o.flag("abort") || errors.get() > 0) {
                        producer.abortTransaction();
                        txOutcome = "aborted";
                    } else {
                        producer.commitTransaction();
                        txOutcome = "committed";
                    }
                } catch (KafkaException e) {
                    log("transaction end failed: " + e);
                    errors.incrementAndGet();
                    errorTypes.merge(e.getClass().getSimpleName(), 1, Integer::sum);
                    txOutcome = "failed";
                }
            }
            producer.close(Duration.ofSeconds(10));
        } catch (KafkaException e) {
            // construction / initTransactions failures
            log("producer failed: " + e);
            errors.incrementAndGet();
            errorTypes.merge(unwrap(e).getClass().getSimpleName(), 1, Integer::sum);
        }

        Map<String, Object> offs = new LinkedHashMap<>();
        synchronized (offsets) {
            for (Map.Entry<Integer, long[]> e : offsets.entrySet())
                offs.put(Integer.toString(e.getKey()), List.of(e.getValue()[0], e.getValue()[1]));
        }
        Map<String, Object> res = obj("acked", acked.get(), "errors", errors.get(), "offsets", offs);
        if (errors.get() > 0) res.put("error_types", errorTypes);
        if (txOutcome != null) res.put("transaction", txOutcome);
        out(res);
        return errors.get() == 0 ? 0 : 1;
    }

    // ------------------------------------------------------------------ consume

    static String assignorClass(String name) {
        switch (name) {
            case "range": return RangeAssignor.class.getName();
            case "roundrobin": return RoundRobinAssignor.class.getName();
            case "sticky": return StickyAssignor.class.getName();
            case "cooperative-sticky": return CooperativeStickyAssignor.class.getName();
            default: return name; // a class name
        }
    }

    static int consume(Opts o) throws Exception {
        String bootstrap = o.req("bootstrap");
        List<String> topics = Arrays.asList(o.req("topic").split(","));
        boolean multiTopic = topics.size() > 1;
        String group = o.get("group", null);
        long count = o.getLong("count", Long.MAX_VALUE);
        long timeoutMs = o.getLong("timeout-ms", 10000);
        String commit = o.get("commit", group == null ? "none" : "sync");
        boolean quiet = o.flag("quiet");
        boolean full = o.flag("full");

        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.CLIENT_ID_CONFIG, o.get("client-id", "straitclient-consumer"));
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, o.get("offset-reset", "earliest"));
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, commit.equals("auto") ? "true" : "false");
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        if (o.has("isolation")) p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, o.req("isolation"));
        if (o.has("max-poll-records")) p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, o.req("max-poll-records"));
        String protocol = o.get("group-protocol", "classic");
        p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
        if (o.has("assignor")) {
            if (protocol.equals("consumer")) p.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, o.req("assignor"));
            else p.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, assignorClass(o.req("assignor")));
        }
        o.applyProps(p);

        long done = 0;
        Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
        Map<String, Object> committed = null;
        List<String> assignment = new ArrayList<>();
        // Set by the rebalance listener, which runs inside poll() on this thread.
        boolean[] rebalanced = {false};
        int rc = 0;
        try (KafkaConsumer<byte[], byte[]> consumer =
                     new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            if (group != null && !o.has("partition")) {
                consumer.subscribe(topics, new ConsumerRebalanceListener() {
                    @Override public void onPartitionsRevoked(Collection<TopicPartition> ps) {
                        log("revoked " + ps);
                    }
                    @Override public void onPartitionsAssigned(Collection<TopicPartition> ps) {
                        // Called after every rebalance, even with nothing assigned.
                        rebalanced[0] = true;
                        log("assigned " + ps);
                    }
                });
            } else {
                List<TopicPartition> tps = new ArrayList<>();
                long deadline = System.currentTimeMillis() + timeoutMs;
                for (String t : topics) {
                    if (o.has("partition")) {
                        tps.add(new TopicPartition(t, Integer.parseInt(o.req("partition"))));
                        continue;
                    }
                    List<PartitionInfo> infos = null;
                    while (System.currentTimeMillis() < deadline) {
                        infos = consumer.partitionsFor(t, Duration.ofMillis(Math.max(1, deadline - System.currentTimeMillis())));
                        if (infos != null && !infos.isEmpty()) break;
                        Thread.sleep(100);
                    }
                    if (infos == null || infos.isEmpty()) throw new IllegalStateException("no partitions for topic " + t);
                    for (PartitionInfo pi : infos) tps.add(new TopicPartition(t, pi.partition()));
                }
                consumer.assign(tps);
                if (o.has("from-offset")) {
                    long from = Long.parseLong(o.req("from-offset"));
                    for (TopicPartition tp : tps) consumer.seek(tp, from);
                }
            }

            long deadline = System.currentTimeMillis() + timeoutMs;
            boolean assigned = false, joined = false;
            outer:
            while (done < count) {
                if (!joined && rebalanced[0]) {
                    joined = true;  // the timeout counts from the first rebalance's end
                    deadline = Math.max(deadline, System.currentTimeMillis() + timeoutMs);
                }
                if (!assigned && !consumer.assignment().isEmpty()) {
                    assigned = true;  // and again from the first partitions
                    deadline = Math.max(deadline, System.currentTimeMillis() + timeoutMs);
                }
                long remaining = deadline - System.currentTimeMillis();
                // A member caught by its timeout in the middle of a rebalance (an eager one
                // revokes everything first) polls on until its new assignment arrives, so
                // what it reports and commits is the group's answer, not the gap: for at
                // most one more timeout.
                if (remaining <= 0 && (!assigned || !consumer.assignment().isEmpty()
                        || remaining <= -timeoutMs)) break;
                ConsumerRecords<byte[], byte[]> recs = consumer.poll(Duration.ofMillis(Math.max(1, Math.min(remaining > 0 ? remaining : 500, 500))));
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    if (!quiet) {
                        Map<String, Object> h = new LinkedHashMap<>();
                        for (Header hd : r.headers()) h.put(hd.key(), str(hd.value()));
                        Map<String, Object> line = new LinkedHashMap<>();
                        if (multiTopic || full) line.put("t", r.topic());
                        line.put("p", r.partition());
                        line.put("o", r.offset());
                        line.put("k", str(r.key()));
                        line.put("v", str(r.value()));
                        line.put("h", h);
                        if (full) {
                            line.put("ts", r.timestamp());
                            line.put("tt", r.timestampType().toString());
                            line.put("le", r.leaderEpoch().orElse(null));
                        }
                        out(line);
                    }
                    next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                    if (++done >= count) break outer;
                }
                // --commit sync: commit after every poll, so a rebalance hands the next
                // owner exactly what this member printed (at-least-once without repeats).
                if (group != null && commit.equals("sync") && !recs.isEmpty() && !next.isEmpty()) {
                    Map<TopicPartition, OffsetAndMetadata> owned = new HashMap<>();
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : next.entrySet())
                        if (consumer.assignment().contains(e.getKey())) owned.put(e.getKey(), e.getValue());
                    if (!owned.isEmpty()) consumer.commitSync(owned, Duration.ofMillis(Math.max(timeoutMs, 10000)));
                }
            }
            for (TopicPartition tp : consumer.assignment()) assignment.add(tpName(tp, multiTopic));
            Collections.sort(assignment);

            if (group != null && !o.has("partition")) {
                // Only what this member still owns: after a rebalance the rest is another's.
                next.keySet().retainAll(consumer.assignment());
            }
            if (group != null && !next.isEmpty()) {
                if (commit.equals("sync")) {
                    consumer.commitSync(next, Duration.ofMillis(Math.max(timeoutMs, 10000)));
                } else if (commit.equals("async")) {
                    consumer.commitAsync(next, (offs, ex) -> {
                        if (ex != null) log("async commit failed: " + ex);
                    });
                }
                if (!commit.equals("none")) {
                    committed = new TreeMap<>();
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : next.entrySet())
                        committed.put(tpName(e.getKey(), multiTopic), e.getValue().offset());
                }
            }
            consumer.close(Duration.ofSeconds(10));
        }
        if (count != Long.MAX_VALUE && done < count) rc = 2;
        Map<String, Object> res = obj("done", done, "assignment", assignment);
        if (committed != null) res.put("committed", committed);
        out(res);
        return rc;
    }

    static String tpName(TopicPartition tp, boolean withTopic) {
        return withTopic ? tp.topic() + ":" + tp.partition() : Integer.toString(tp.partition());
    }

    // ------------------------------------------------------------------ admin

    static int admin(Opts o) throws Exception {
        if (o.positional.isEmpty()) throw new IllegalArgumentException("admin needs a sub-command");
        String sub = o.positional.get(0);
        List<String> a = o.positional.subList(1, o.positional.size());
        long timeoutMs = o.getLong("timeout-ms", 30000);
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, o.req("bootstrap"));
        p.put(AdminClientConfig.CLIENT_ID_CONFIG, o.get("client-id", "straitclient-admin"));
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, Long.toString(timeoutMs));
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, Long.toString(Math.min(timeoutMs, 30000)));
        o.applyProps(p);
        try (Admin admin = Admin.create(p)) {
            try {
                out(adminOp(admin, sub, a, o, timeoutMs));
                return 0;
            } catch (ExecutionException e) {
                Throwable c = unwrap(e);
                if (c instanceof TopicExistsException && o.flag("if-not-exists")) {
                    out(obj("created", a.get(0), "exists", true));
                    return 0;
                }
                out(obj("error", c.getClass().getSimpleName(), "message", String.valueOf(c.getMessage())));
                return 1;
            } finally {
                admin.close(Duration.ofSeconds(5));
            }
        }
    }

    static String arg(List<String> a, int i, String what) {
        if (a.size() <= i) throw new IllegalArgumentException("missing argument: " + what);
        return a.get(i);
    }

    static Object adminOp(Admin admin, String sub, List<String> a, Opts o, long timeoutMs) throws Exception {
        long t = timeoutMs;
        TimeUnit ms = TimeUnit.MILLISECONDS;
        switch (sub) {
            case "create-topic": {
                String topic = arg(a, 0, "topic");
                int parts = a.size() > 1 ? Integer.parseInt(a.get(1)) : 1;
                short rf = a.size() > 2 ? Short.parseShort(a.get(2)) : 1;
                NewTopic nt = new NewTopic(topic, parts, rf);
                Map<String, String> cfg = new LinkedHashMap<>();
                for (String kv : o.all("config")) {
                    int eq = kv.indexOf('=');
                    if (eq <= 0) throw new IllegalArgumentException("--config expects key=value");
                    cfg.put(kv.substring(0, eq), kv.substring(eq + 1));
                }
                if (!cfg.isEmpty()) nt.configs(cfg);
                CreateTopicsResult r = admin.createTopics(List.of(nt));
                r.all().get(t, ms);
                Object id = null;
                try { id = r.topicId(topic).get(t, ms).toString(); } catch (ExecutionException ignored) { }
                return obj("created", topic, "partitions", parts, "rf", (int) rf, "topic_id", id);
            }
            case "list-topics": {
                ListTopicsOptions lo = new ListTopicsOptions().listInternal(o.flag("internal"));
                List<String> names = new ArrayList<>(admin.listTopics(lo).names().get(t, ms));
                Collections.sort(names);
                return obj("topics", names);
            }
            case "describe-topic": {
                String topic = arg(a, 0, "topic");
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(t, ms).get(topic);
                List<Object> parts = new ArrayList<>();
                for (TopicPartitionInfo pi : d.partitions()) {
                    List<Integer> reps = new ArrayList<>(), isr = new ArrayList<>();
                    for (Node n : pi.replicas()) reps.add(n.id());
                    for (Node n : pi.isr()) isr.add(n.id());
                    parts.add(obj("partition", pi.partition(),
                            "leader", pi.leader() == null ? null : pi.leader().id(),
                            "replicas", reps, "isr", isr));
                }
                Map<String, Object> res = obj("topic", d.name(), "topic_id", String.valueOf(d.topicId()),
                        "internal", d.isInternal(), "partitions", parts);
                if (o.flag("configs")) res.put("configs", describeConfigs(admin, topic, t, true));
                return res;
            }
            case "delete-topic": {
                String topic = arg(a, 0, "topic");
                admin.deleteTopics(List.of(topic)).all().get(t, ms);
                return obj("deleted", topic);
            }
            case "create-partitions": {
                String topic = arg(a, 0, "topic");
                int total = Integer.parseInt(arg(a, 1, "total partition count"));
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(total))).all().get(t, ms);
                return obj("topic", topic, "partitions", total);
            }
            case "describe-configs": {
                String topic = arg(a, 0, "topic");
                return obj("topic", topic, "configs", describeConfigs(admin, topic, t, false));
            }
            case "describe-cluster": {
                DescribeClusterResult r = admin.describeCluster();
                List<Object> nodes = new ArrayList<>();
                for (Node n : r.nodes().get(t, ms))
                    nodes.add(obj("id", n.id(), "host", n.host(), "port", n.port(), "rack", n.rack()));
                Node c = r.controller().get(t, ms);
                return obj("cluster_id", r.clusterId().get(t, ms),
                        "controller", c == null ? null : c.id(), "nodes", nodes);
            }
            case "list-groups": {
                List<Object> gs = new ArrayList<>();
                for (ConsumerGroupListing g : admin.listConsumerGroups().all().get(t, ms))
                    gs.add(obj("group", g.groupId(), "state", g.state().map(Object::toString).orElse(null),
                            "simple", g.isSimpleConsumerGroup()));
                gs.sort(Comparator.comparing(x -> String.valueOf(((Map<?, ?>) x).get("group"))));
                return obj("groups", gs);
            }
            case "describe-group": {
                String g = arg(a, 0, "group");
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(g)).all().get(t, ms).get(g);
                List<Object> members = new ArrayList<>();
                for (MemberDescription m : d.members()) {
                    List<String> tps = new ArrayList<>();
                    for (TopicPartition tp : m.assignment().topicPartitions()) tps.add(tp.topic() + ":" + tp.partition());
                    Collections.sort(tps);
                    members.add(obj("member_id", m.consumerId(), "client_id", m.clientId(), "host", m.host(),
                            "group_instance_id", m.groupInstanceId().orElse(null), "assignment", tps));
                }
                return obj("group", d.groupId(), "state", String.valueOf(d.state()),
                        "assignor", d.partitionAssignor(), "type", String.valueOf(d.type()),
                        "coordinator", d.coordinator() == null ? null : d.coordinator().id(),
                        "members", members);
            }
            case "group-offsets": {
                String g = arg(a, 0, "group");
                Map<TopicPartition, OffsetAndMetadata> m =
                        admin.listConsumerGroupOffsets(g).partitionsToOffsetAndMetadata().get(t, ms);
                Map<String, Object> offs = new TreeMap<>();
                for (Map.Entry<TopicPartition, OffsetAndMetadata> e : m.entrySet())
                    offs.put(e.getKey().topic() + ":" + e.getKey().partition(),
                            e.getValue() == null ? null : e.getValue().offset());
                return obj("group", g, "offsets", offs);
            }
            case "delete-group": {
                String g = arg(a, 0, "group");
                admin.deleteConsumerGroups(List.of(g)).all().get(t, ms);
                return obj("deleted_group", g);
            }
            case "list-offsets": {
                String topic = arg(a, 0, "topic");
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(t, ms).get(topic);
                Map<TopicPartition, OffsetSpec> early = new HashMap<>(), late = new HashMap<>();
                for (TopicPartitionInfo pi : d.partitions()) {
                    early.put(new TopicPartition(topic, pi.partition()), OffsetSpec.earliest());
                    late.put(new TopicPartition(topic, pi.partition()), OffsetSpec.latest());
                }
                Map<String, Object> e = new TreeMap<>(Comparator.comparingInt(Integer::parseInt));
                Map<String, Object> l = new TreeMap<>(Comparator.comparingInt(Integer::parseInt));
                for (var en : admin.listOffsets(early).all().get(t, ms).entrySet())
                    e.put(Integer.toString(en.getKey().partition()), en.getValue().offset());
                for (var en : admin.listOffsets(late).all().get(t, ms).entrySet())
                    l.put(Integer.toString(en.getKey().partition()), en.getValue().offset());
                return obj("topic", topic, "earliest", e, "latest", l);
            }
            default:
                throw new IllegalArgumentException("unknown admin sub-command: " + sub);
        }
    }

    static Map<String, Object> describeConfigs(Admin admin, String topic, long t, boolean nonDefaultOnly) throws Exception {
        ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        Config c = admin.describeConfigs(List.of(res)).all().get(t, TimeUnit.MILLISECONDS).get(res);
        Map<String, Object> m = new TreeMap<>();
        for (ConfigEntry e : c.entries()) {
            if (nonDefaultOnly && e.source() == ConfigEntry.ConfigSource.DEFAULT_CONFIG) continue;
            m.put(e.name(), e.value());
        }
        return m;
    }

    // ------------------------------------------------------------------ main

    static void usage() {
        System.err.println(
                "usage: StraitClient produce --bootstrap H:P --topic T --count N [--compression none|gzip|snappy|lz4|zstd]\n"
              + "                            [--acks all|1|0] [--key-prefix k] [--headers] [--idempotent true|false] ...\n"
              + "       StraitClient consume --bootstrap H:P --topic T [--group G] --count N [--assignor A]\n"
              + "                            [--timeout-ms M] [--commit sync|async|auto|none] ...\n"
              + "       StraitClient admin --bootstrap H:P create-topic T [partitions [rf]] | list-topics |\n"
              + "                          describe-topic T | delete-topic T | create-partitions T N | describe-configs T |\n"
              + "                          describe-cluster | list-groups | describe-group G | group-offsets G |\n"
              + "                          delete-group G | list-offsets T\n"
              + "(see the header of tools/java/StraitClient.java)");
    }

    public static void main(String[] args) {
        if (args.length == 0 || args[0].equals("-h") || args[0].equals("--help")) {
            usage();
            System.exit(args.length == 0 ? 64 : 0);
        }
        int rc;
        try {
            Opts o = Opts.parse(args, 1);
            switch (args[0]) {
                case "produce": rc = produce(o); break;
                case "consume": rc = consume(o); break;
                case "admin": rc = admin(o); break;
                default:
                    usage();
                    rc = 64;
            }
        } catch (IllegalArgumentException e) {
            log("bad arguments: " + e.getMessage());
            usage();
            rc = 64;
        } catch (Throwable e) {
            Throwable c = unwrap(e);
            log("failed: " + c);
            c.printStackTrace(System.err);
            out(obj("error", c.getClass().getSimpleName(), "message", String.valueOf(c.getMessage())));
            rc = 1;
        }
        System.out.flush();
        // the Kafka clients leave no non-daemon threads once closed, but be sure we exit
        System.exit(rc);
    }
}
