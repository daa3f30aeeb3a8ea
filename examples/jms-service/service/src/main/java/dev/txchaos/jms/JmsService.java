package dev.txchaos.jms;

import jakarta.jms.BytesMessage;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageProducer;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.activemq.ActiveMQConnectionFactory;
import org.apache.activemq.RedeliveryPolicy;
import org.postgresql.Driver;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.SimpleDriverDataSource;
import org.springframework.jms.listener.DefaultMessageListenerContainer;
import org.springframework.jms.listener.SessionAwareMessageListener;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * A two-stage order flow on JMS with best-effort 1PC: each stage is a transacted
 * DefaultMessageListenerContainer whose listener runs its SQL transaction to the end (commit), then
 * sends to the next queue on the listener's JMS session, which the container commits second. A
 * crash between the two commits redelivers a message whose effect is already committed.
 *
 * <p>Variants: {@code naive} applies every delivery; {@code check} looks for the op's effect first
 * and skips it when present (still forwarding the message); {@code naive-unique} applies every
 * delivery into a table whose op_id is unique, so a second apply fails and the message goes to the
 * dead-letter queue after the client's redeliveries. A message whose body says
 * {@code "poison": true} fails on every delivery: the client's RedeliveryPolicy
 * (MAX_REDELIVERIES) then has the broker dead-letter it (DLQ.&lt;queue&gt;).
 *
 * <p>Configuration (environment): OPENWIRE_URL, JDBC_URL, DB_USER, DB_PASSWORD,
 * INPUT, OUTPUT; MAX_REDELIVERIES (default 2). Prints READY once both stages consume.
 */
public final class JmsService {
    private static final Pattern OP = Pattern.compile("\"op\"\\s*:\\s*\"([^\"]+)\"");
    private static final Pattern AMOUNT = Pattern.compile("\"amount\"\\s*:\\s*(-?\\d+)");
    private static final Pattern POISON = Pattern.compile("\"poison\"\\s*:\\s*true");

    private JmsService() {}

    /** One stage: its input queue, the queue it forwards to, its effect table. */
    record Stage(String name, String input, String next, String table) {}

    public static void main(String[] args) throws Exception {
        String variant = "naive";
        for (int i = 0; i + 1 < args.length; i++) {
            if (args[i].equals("--variant")) {
                variant = args[i + 1];
            }
        }
        if (!List.of("naive", "check", "naive-unique").contains(variant)) {
            fail("--variant " + variant + ": use naive, check or naive-unique");
        }
        Map<String, String> env = System.getenv();
        for (String key : List.of("OPENWIRE_URL", "JDBC_URL", "DB_USER", "INPUT", "OUTPUT")) {
            if (env.getOrDefault(key, "").isEmpty()) {
                fail(key + " is not set");
            }
        }
        int maxRedeliveries = Integer.parseInt(env.getOrDefault("MAX_REDELIVERIES", "2"));

        ActiveMQConnectionFactory cf = new ActiveMQConnectionFactory(env.get("OPENWIRE_URL"));
        RedeliveryPolicy policy = cf.getRedeliveryPolicy();
        policy.setMaximumRedeliveries(maxRedeliveries);
        policy.setInitialRedeliveryDelay(100);
        policy.setRedeliveryDelay(100);
        cf.getPrefetchPolicy().setQueuePrefetch(1);

        // The harness fills in the JDBC URL and the credentials: no libpq URI to translate here.
        SimpleDriverDataSource ds = new SimpleDriverDataSource(
                new Driver(), env.get("JDBC_URL"), env.get("DB_USER"), env.getOrDefault("DB_PASSWORD", ""));
        TransactionTemplate tx = new TransactionTemplate(new DataSourceTransactionManager(ds));
        JdbcTemplate jdbc = new JdbcTemplate(ds);

        String input = env.get("INPUT");
        String first = variant.equals("naive-unique") ? "jms_effects_unique" : "jms_effects";
        List<Stage> stages = List.of(
                new Stage("order", input, input + ".ship", first),
                new Stage("ship", input + ".ship", env.get("OUTPUT"), "jms_shipments"));
        boolean check = variant.equals("check");

        List<DefaultMessageListenerContainer> containers = stages.stream()
                .map(stage -> container(cf, stage, (message, session) -> handle(stage, check, message, session, tx, jdbc)))
                .toList();
        CountDownLatch stop = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            containers.forEach(DefaultMessageListenerContainer::shutdown);
            stop.countDown();
        }));
        for (DefaultMessageListenerContainer c : containers) {
            c.afterPropertiesSet();
            c.start();
        }
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (!containers.stream().allMatch(DefaultMessageListenerContainer::isRegisteredWithDestination)) {
            if (System.nanoTime() > deadline) {
                fail("the stages did not register with their queues within 60 s: is the broker reachable?");
            }
            Thread.sleep(20);
        }
        System.out.println("READY variant " + variant + ": " + input + " -> " + input + ".ship -> " + env.get("OUTPUT"));
        System.out.flush();
        stop.await();
    }

    static DefaultMessageListenerContainer container(
            ActiveMQConnectionFactory cf, Stage stage, SessionAwareMessageListener<Message> listener) {
        DefaultMessageListenerContainer c = new DefaultMessageListenerContainer();
        c.setConnectionFactory(cf);
        c.setDestinationName(stage.input());
        c.setSessionTransacted(true); // the container commits (or rolls back) the JMS session after the listener
        c.setCacheLevel(DefaultMessageListenerContainer.CACHE_CONSUMER);
        c.setConcurrentConsumers(1);
        c.setReceiveTimeout(200);
        c.setRecoveryInterval(500);
        c.setBeanName(stage.name());
        c.setMessageListener(listener);
        return c;
    }

    static void handle(Stage stage, boolean check, Message message, Session session, TransactionTemplate tx, JdbcTemplate jdbc)
            throws JMSException {
        String body = text(message);
        Matcher op = OP.matcher(body);
        if (!op.find()) {
            throw new IllegalArgumentException("no op in " + body);
        }
        String id = op.group(1);
        // Which delivery this is, as the broker counts it: what the redelivery policy is held to.
        System.out.println(stage.name() + " op " + id + " delivery " + message.getIntProperty("JMSXDeliveryCount"));
        if (POISON.matcher(body).find()) {
            throw new IllegalStateException("poison message " + id + " (delivery " + message.getIntProperty("JMSXDeliveryCount") + ")");
        }
        Matcher amount = AMOUNT.matcher(body);
        int value = amount.find() ? Integer.parseInt(amount.group(1)) : 0;
        // First commit: the stage's effect in Postgres (the template commits when the callback returns).
        boolean applied = Boolean.TRUE.equals(tx.execute(status -> {
            if (check && !jdbc.queryForList("SELECT 1 FROM " + stage.table() + " WHERE op_id = ?", id).isEmpty()) {
                return false;
            }
            if (stage.table().equals("jms_shipments")) {
                jdbc.update("INSERT INTO jms_shipments (op_id) VALUES (?)", id);
            } else {
                jdbc.update("INSERT INTO " + stage.table() + " (op_id, amount) VALUES (?, ?)", id, value);
            }
            return true;
        }));
        // Second commit: the container commits this session (the send and the receive) when we return.
        MessageProducer producer = session.createProducer(session.createQueue(stage.next()));
        try {
            producer.send(session.createTextMessage("{\"op\": \"" + id + "\", \"amount\": " + value + "}"));
        } finally {
            producer.close();
        }
        System.out.println(stage.name() + " op " + id + (applied ? " applied" : " seen before, skipped")
                + (message.getJMSRedelivered() ? " (redelivered)" : ""));
    }

    static String text(Message message) throws JMSException {
        if (message instanceof TextMessage t) {
            return t.getText();
        }
        if (message instanceof BytesMessage b) {
            byte[] data = new byte[(int) b.getBodyLength()];
            b.readBytes(data);
            return new String(data, StandardCharsets.UTF_8);
        }
        throw new IllegalArgumentException("unexpected message type " + message.getClass().getName());
    }

    static void fail(String why) {
        System.err.println("jms-service: bad configuration: " + why);
        System.exit(2);
    }
}
