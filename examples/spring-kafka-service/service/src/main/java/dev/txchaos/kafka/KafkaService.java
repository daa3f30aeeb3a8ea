package dev.txchaos.kafka;

import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.kafka.clients.consumer.Consumer;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.postgresql.Driver;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.SimpleDriverDataSource;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaProducerFactory;
import org.springframework.kafka.core.KafkaTemplate;
import org.springframework.kafka.listener.BatchListenerFailedException;
import org.springframework.kafka.listener.BatchMessageListener;
import org.springframework.kafka.listener.ConsumerAwareRebalanceListener;
import org.springframework.kafka.listener.ContainerProperties;
import org.springframework.kafka.listener.DeadLetterPublishingRecoverer;
import org.springframework.kafka.listener.DefaultErrorHandler;
import org.springframework.kafka.listener.KafkaMessageListenerContainer;
import org.springframework.kafka.support.ExponentialBackOffWithMaxRetries;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * A Spring Kafka batch listener with a Postgres effect: for each record of a batch, one JDBC
 * transaction inserts the order's effect, then the output is produced (and acknowledged); the
 * container commits the batch's offsets after the listener returns. Errors go to a
 * DefaultErrorHandler with exponential backoff and a DeadLetterPublishingRecoverer to
 * {@code <topic>-dlt} (same partition).
 *
 * <p>Variants: {@code naive} has no inbox and throws a plain exception on a bad record, so the
 * whole batch is retried (the records before it applied again) and then dead-lettered whole;
 * {@code indexed} (the seed's) claims each record in an inbox in the effect's transaction and
 * throws {@code BatchListenerFailedException} with the failed record's index, so only that record
 * is retried and dead-lettered. A record whose body says {@code "poison": true} fails every time.
 *
 * <p>Configuration (environment): KAFKA_BOOTSTRAP, GROUP, INPUT, OUTPUT, JDBC_URL, DB_USER,
 * DB_PASSWORD, and optionally INSTANCE_ID (static membership). Prints READY once partitions are assigned.
 */
public final class KafkaService {
    private static final Pattern OP = Pattern.compile("\"op\"\\s*:\\s*\"([^\"]+)\"");
    private static final Pattern AMOUNT = Pattern.compile("\"amount\"\\s*:\\s*(-?\\d+)");
    private static final Pattern POISON = Pattern.compile("\"poison\"\\s*:\\s*true");

    private KafkaService() {}

    public static void main(String[] args) throws Exception {
        String variant = "naive";
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--variant")) {
                variant = args[i + 1];
            }
        }
        if (!List.of("naive", "indexed").contains(variant)) {
            fail("--variant " + variant + ": use naive or indexed");
        }
        Map<String, String> env = System.getenv();
        for (String key : List.of("KAFKA_BOOTSTRAP", "GROUP", "INPUT", "OUTPUT", "JDBC_URL", "DB_USER")) {
            if (env.getOrDefault(key, "").isEmpty()) {
                fail(key + " is not set");
            }
        }
        String bootstrap = env.get("KAFKA_BOOTSTRAP");
        Map<String, Object> consumer = new java.util.HashMap<>(Map.of(
                ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                ConsumerConfig.GROUP_ID_CONFIG, env.get("GROUP"),
                ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class,
                ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class,
                ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
                ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 6000,
                ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 1000,
                // Batches of what arrived within half a second: several records per batch.
                ConsumerConfig.FETCH_MIN_BYTES_CONFIG, 1 << 20,
                ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 500));
        if (!env.getOrDefault("INSTANCE_ID", "").isEmpty()) {
            consumer.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, env.get("INSTANCE_ID"));
        }
        KafkaTemplate<String, String> template = new KafkaTemplate<>(new DefaultKafkaProducerFactory<>(Map.of(
                ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap,
                ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class,
                ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class,
                ProducerConfig.ACKS_CONFIG, "all")));

        // The harness fills in the JDBC URL and the credentials: no libpq URI to translate here.
        SimpleDriverDataSource ds = new SimpleDriverDataSource(
                new Driver(), env.get("JDBC_URL"), env.get("DB_USER"), env.getOrDefault("DB_PASSWORD", ""));
        TransactionTemplate tx = new TransactionTemplate(new DataSourceTransactionManager(ds));
        JdbcTemplate jdbc = new JdbcTemplate(ds);
        boolean indexed = variant.equals("indexed");
        String output = env.get("OUTPUT");

        ContainerProperties props = new ContainerProperties(env.get("INPUT"));
        props.setMessageListener((BatchMessageListener<String, String>) records -> {
            for (int i = 0; i < records.size(); i++) {
                ConsumerRecord<String, String> record = records.get(i);
                try {
                    handle(record, indexed, tx, jdbc, template, output);
                } catch (RuntimeException e) {
                    if (indexed) {
                        throw new BatchListenerFailedException("record " + i + " failed", e, i);
                    }
                    throw e;
                }
            }
        });
        AtomicBoolean ready = new AtomicBoolean();
        props.setConsumerRebalanceListener(new ConsumerAwareRebalanceListener() {
            @Override
            public void onPartitionsAssigned(Consumer<?, ?> c, java.util.Collection<TopicPartition> partitions) {
                if (!partitions.isEmpty() && ready.compareAndSet(false, true)) {
                    System.out.println("READY variant " + (indexed ? "indexed" : "naive") + ": " + partitions);
                    System.out.flush();
                }
            }
        });
        ExponentialBackOffWithMaxRetries backOff = new ExponentialBackOffWithMaxRetries(2);
        backOff.setInitialInterval(100);
        backOff.setMultiplier(2.0);
        DeadLetterPublishingRecoverer recoverer = new DeadLetterPublishingRecoverer(
                template, (record, e) -> new TopicPartition(record.topic() + "-dlt", record.partition()));
        KafkaMessageListenerContainer<String, String> container =
                new KafkaMessageListenerContainer<>(new DefaultKafkaConsumerFactory<>(consumer), props);
        container.setCommonErrorHandler(new DefaultErrorHandler(recoverer, backOff));

        CountDownLatch stop = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            container.stop();
            stop.countDown();
        }));
        container.start();
        stop.await();
    }

    static void handle(ConsumerRecord<String, String> record, boolean indexed, TransactionTemplate tx, JdbcTemplate jdbc,
            KafkaTemplate<String, String> template, String output) {
        String body = record.value() == null ? "" : record.value();
        Matcher op = OP.matcher(body);
        if (!op.find()) {
            throw new IllegalArgumentException("no op in " + body);
        }
        String id = op.group(1);
        if (POISON.matcher(body).find()) {
            throw new IllegalStateException("poison record " + id);
        }
        Matcher amount = AMOUNT.matcher(body);
        int value = amount.find() ? Integer.parseInt(amount.group(1)) : 0;
        boolean applied = Boolean.TRUE.equals(tx.execute(status -> {
            if (indexed && jdbc.update("INSERT INTO sk_inbox (op_id) VALUES (?) ON CONFLICT DO NOTHING", id) == 0) {
                return false;
            }
            jdbc.update("INSERT INTO sk_effects (op_id, amount) VALUES (?, ?)", id, value);
            return true;
        }));
        try {
            template.send(output, id, "{\"op\": \"" + id + "\"}").get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        } catch (java.util.concurrent.ExecutionException e) {
            throw new IllegalStateException("produce failed for " + id, e);
        }
        System.out.println("op " + id + " " + record.topic() + "-" + record.partition() + "@" + record.offset()
                + (applied ? " applied" : " seen before, skipped"));
    }

    static void fail(String why) {
        System.err.println("spring-kafka-service: bad configuration: " + why);
        System.exit(2);
    }
}
