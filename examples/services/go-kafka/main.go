// Command orders-go consumes order operations from a Kafka topic, records each
// one as an effect row in Postgres and announces it on an output topic.
//
// Two variants share one loop: "naive" inserts the effect every time a record
// is delivered, so a redelivery after a crash applies it twice; "fixed" also
// records the record's (topic, partition, offset) in an inbox in the same
// transaction and applies the effect only when that inbox row is new.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

type config struct {
	variant   string
	dbURL     string
	bootstrap string
	group     string
	input     string
	output    string
	effects   string // already quoted SQL identifier
	inbox     string // already quoted SQL identifier
}

type order struct {
	Op     string `json:"op"`
	N      int64  `json:"n"`
	Amount int64  `json:"amount"`
}

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// stepTimeout bounds one database or Kafka step of one record, so a stalled
// connection ends the process (and its restart) instead of hanging it forever.
const stepTimeout = 60 * time.Second

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetOutput(os.Stderr)
	cfg, err := loadConfig()
	if err != nil {
		log.Printf("config: %v", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		log.Printf("fatal: %v", err)
		os.Exit(1)
	}
}

func loadConfig() (config, error) {
	variant := flag.String("variant", os.Getenv("VARIANT"), "naive or fixed (default $VARIANT)")
	flag.Parse()
	cfg := config{
		variant:   *variant,
		dbURL:     os.Getenv("DATABASE_URL"),
		bootstrap: os.Getenv("KAFKA_BOOTSTRAP"),
		group:     os.Getenv("GROUP"),
		input:     os.Getenv("INPUT"),
		output:    os.Getenv("OUTPUT"),
	}
	if cfg.variant != "naive" && cfg.variant != "fixed" {
		return cfg, fmt.Errorf("variant %q is neither naive nor fixed: set VARIANT or pass --variant", cfg.variant)
	}
	for _, e := range [][2]string{{"DATABASE_URL", cfg.dbURL}, {"KAFKA_BOOTSTRAP", cfg.bootstrap},
		{"GROUP", cfg.group}, {"INPUT", cfg.input}, {"OUTPUT", cfg.output}} {
		if e[1] == "" {
			return cfg, fmt.Errorf("%s is not set", e[0])
		}
	}
	// Table names are spliced into SQL text, so only plain identifiers pass.
	for _, t := range []struct {
		env, def string
		dst      *string
	}{{"EFFECTS_TABLE", "go_effects", &cfg.effects}, {"INBOX_TABLE", "go_inbox", &cfg.inbox}} {
		name := os.Getenv(t.env)
		if name == "" {
			name = t.def
		}
		if !identRe.MatchString(name) {
			return cfg, fmt.Errorf("%s=%q is not a plain SQL identifier (letters, digits, _)", t.env, name)
		}
		*t.dst = pgx.Identifier{name}.Sanitize()
	}
	return cfg, nil
}

func run(cfg config) error {
	// SIGTERM only stops the loop between records: a record in progress
	// finishes (DB commit, output, offset commit) on its own context.
	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()

	dbCtx, dbCancel := context.WithTimeout(context.Background(), stepTimeout)
	db, err := pgx.Connect(dbCtx, cfg.dbURL)
	dbCancel()
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer db.Close(context.Background())

	var ready sync.Once
	opts := []kgo.Opt{}
	// Static membership: a restarted instance with the same INSTANCE_ID takes its partitions
	// back at once instead of waiting for the killed one's session to expire.
	if id := os.Getenv("INSTANCE_ID"); id != "" {
		opts = append(opts, kgo.InstanceID(id))
	}
	cl, err := kgo.NewClient(append(opts,
		kgo.SeedBrokers(cfg.bootstrap),
		kgo.ConsumerGroup(cfg.group),
		kgo.ConsumeTopics(cfg.input),
		kgo.DisableAutoCommit(),
		// A killed instance's partitions move to its restart once its session
		// expires; the default 45 s would stall every crash test that long.
		kgo.SessionTimeout(6*time.Second),
		kgo.HeartbeatInterval(time.Second),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, parts map[string][]int32) {
			log.Printf("assigned %v", parts)
			ready.Do(func() {
				fmt.Println("READY")
				_ = os.Stdout.Sync()
			})
		}),
		kgo.DefaultProduceTopic(cfg.output),
		kgo.RequiredAcks(kgo.AllISRAcks()),
	)...)
	if err != nil {
		return fmt.Errorf("kafka client for %s: %w", cfg.bootstrap, err)
	}
	// Close leaves the group, so a restarted instance gets the partitions
	// at once instead of after the session timeout.
	defer cl.Close()
	log.Printf("variant=%s group=%s input=%s output=%s", cfg.variant, cfg.group, cfg.input, cfg.output)

	for {
		fetches := cl.PollRecords(stop, 1)
		if stop.Err() != nil {
			log.Printf("stopping on signal")
			return nil
		}
		if fetches.IsClientClosed() {
			return errors.New("kafka client closed")
		}
		fetches.EachError(func(topic string, part int32, err error) {
			log.Printf("fetch %s[%d]: %v", topic, part, err)
		})
		for _, rec := range fetches.Records() {
			if err := handle(cfg, db, cl, rec); err != nil {
				return err
			}
		}
	}
}

// handle processes one record: DB transaction, output, then offset commit.
// Any failure returns an error; the process exits and the record, whose
// offset is not committed, is delivered again after the restart.
func handle(cfg config, db *pgx.Conn, cl *kgo.Client, rec *kgo.Record) error {
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	var o order
	if err := json.Unmarshal(rec.Value, &o); err != nil || o.Op == "" {
		// A poison record would stop the partition forever; skip it loudly.
		log.Printf("skip %s[%d]@%d: body %q is not an order", rec.Topic, rec.Partition, rec.Offset, rec.Value)
		return commit(ctx, cl, rec)
	}

	applied, err := apply(ctx, cfg, db, rec, o)
	if err != nil {
		return fmt.Errorf("op %s: postgres: %w (connection closed: %v)", o.Op, err, db.IsClosed())
	}

	out, _ := json.Marshal(map[string]string{"op": o.Op})
	if err := cl.ProduceSync(ctx, &kgo.Record{Key: []byte(o.Op), Value: out}).FirstErr(); err != nil {
		return fmt.Errorf("op %s: produce to %s: %w", o.Op, cfg.output, err)
	}
	if err := commit(ctx, cl, rec); err != nil {
		return err
	}
	log.Printf("op %s %s[%d]@%d effect=%v", o.Op, rec.Topic, rec.Partition, rec.Offset, applied)
	return nil
}

// apply runs the record's one DB transaction and reports whether the effect
// row was inserted.
func apply(ctx context.Context, cfg config, db *pgx.Conn, rec *kgo.Record, o order) (bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()

	if cfg.variant == "fixed" {
		tag, err := tx.Exec(ctx, "INSERT INTO "+cfg.inbox+" (topic, part, off, op_id) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
			rec.Topic, rec.Partition, rec.Offset, o.Op)
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() == 0 {
			// Seen before: the effect is already there; only the output and
			// the offset commit may still be missing, so the caller redoes them.
			return false, tx.Commit(ctx)
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+cfg.effects+" (op_id, amount) VALUES ($1, $2)", o.Op, o.Amount); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// commit commits the offset after rec synchronously.
func commit(ctx context.Context, cl *kgo.Client, rec *kgo.Record) error {
	if err := cl.CommitRecords(ctx, rec); err != nil {
		return fmt.Errorf("commit offset %s[%d]@%d: %w", rec.Topic, rec.Partition, rec.Offset, err)
	}
	return nil
}
