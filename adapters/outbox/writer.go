package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/domain"
)

// Config names an outbox. The zero value is not valid; use DefaultConfig.
type Config struct {
	// Topic is the watermill-sql topic the outbox is stored under, which is
	// also the forwarder topic. Its table is "watermill_<Topic>" and the
	// relay's offsets table "watermill_offsets_<Topic>".
	Topic string
}

// ForModule returns the outbox of the module named name: topic
// "<name>_outbox" (a name made of a-z, 0-9 and _).
func ForModule(name string) Config { return Config{Topic: name + "_outbox"} }

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Topic == "" {
		return fmt.Errorf("outbox: empty topic")
	}
	for _, r := range c.Topic {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return fmt.Errorf("outbox: topic %q may hold only a-z, 0-9 and _", c.Topic)
		}
	}
	return nil
}

// Table returns the quoted name of the outbox table.
func (c Config) Table() string { return Schema().MessagesTable(c.Topic) }

// OffsetsTable returns the quoted name of the relay offsets table.
func (c Config) OffsetsTable() string { return OffsetsAdapter().MessagesOffsetsTable(c.Topic) }

// Schema is the watermill-sql schema adapter of every outbox: the default
// PostgreSQL schema, whose rows are read in (transaction_id, offset) order
// and only once no older transaction can still add rows before them.
func Schema() wmsql.DefaultPostgreSQLSchema {
	return wmsql.DefaultPostgreSQLSchema{}
}

// OffsetsAdapter is the watermill-sql offsets adapter of every outbox.
func OffsetsAdapter() wmsql.DefaultPostgreSQLOffsetsAdapter {
	return wmsql.DefaultPostgreSQLOffsetsAdapter{}
}

// Writer appends events to the outbox inside a caller's transaction, after
// checking each against the event registry.
type Writer struct {
	config   Config
	registry *domain.Registry
	logger   watermill.LoggerAdapter
}

// NewWriter returns a Writer for the outbox described by config. Every
// event it writes must pass registry.Check: an unregistered type, an old
// schema version or an invalid payload fails the write, and so the
// caller's transaction.
func NewWriter(config Config, registry *domain.Registry, logger watermill.LoggerAdapter) (*Writer, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if registry == nil {
		return nil, fmt.Errorf("outbox %s: no event registry", config.Topic)
	}
	return &Writer{config: config, registry: registry, logger: logger}, nil
}

// Config returns the writer's outbox.
func (w *Writer) Config() Config { return w.config }

// Write inserts events into the outbox through tx. They become visible to the
// relay when tx commits and vanish if it rolls back.
func (w *Writer) Write(ctx context.Context, tx *sqlx.Tx, events []domain.Event) error {
	return w.WriteTo(ctx, wmsql.TxFromStdSQL(tx.Tx), events)
}

// WriteTo inserts events into the outbox through exec, watermill-sql's
// publisher's handle on the caller's transaction: a *sql.Tx wrapped by
// wmsql.TxFromStdSQL, or a *pgbatch.Tx, which queues the inserts and sends
// them with the transaction's other statements in one round trip.
//
// When ctx carries a valid span context, each event's message metadata
// gets its W3C trace context (InjectTrace), which the relay carries as AMQP
// headers to the handlers; otherwise the rows are as without tracing.
func (w *Writer) WriteTo(ctx context.Context, exec wmsql.ContextExecutor, events []domain.Event) error {
	if len(events) == 0 {
		return nil
	}
	pub, err := wmsql.NewPublisher(exec, wmsql.PublisherConfig{
		SchemaAdapter: Schema(),
	}, w.logger)
	if err != nil {
		return fmt.Errorf("outbox publisher: %w", err)
	}
	enveloped := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: w.config.Topic})
	for _, ev := range events {
		if err := w.registry.Check(ev); err != nil {
			return fmt.Errorf("write to outbox %s: %w", w.config.Topic, err)
		}
	}
	for _, ev := range events {
		msg, err := Encode(ev)
		if err != nil {
			return err
		}
		InjectTrace(ctx, msg.Metadata)
		msg.SetContext(ctx)
		if err := enveloped.Publish(RoutingKey(ev.Type, ev.AggregateID), msg); err != nil {
			return fmt.Errorf("write event %s to outbox: %w", ev.ID, err)
		}
	}
	return nil
}

// Initialize creates the outbox table and the relay offsets table if they do
// not exist, with watermill-sql's own statements, so the tables are exactly
// those Watermill's subscriber and forwarder expect. Concurrent callers are
// serialised by the advisory lock those statements take.
func Initialize(ctx context.Context, db *sqlx.DB, config Config) error {
	if err := config.Validate(); err != nil {
		return err
	}
	schemaQueries, err := Schema().SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: config.Topic})
	if err != nil {
		return fmt.Errorf("outbox schema: %w", err)
	}
	offsetQueries, err := OffsetsAdapter().SchemaInitializingQueries(wmsql.OffsetsSchemaInitializingQueriesParams{Topic: config.Topic})
	if err != nil {
		return fmt.Errorf("outbox offsets schema: %w", err)
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("initialize outbox: %w", err)
	}
	defer tx.Rollback()
	for _, q := range append(schemaQueries, offsetQueries...) {
		if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("initialize outbox %s: %w", config.Topic, err)
		}
	}
	if err := createPublication(ctx, tx, config); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("initialize outbox %s: commit: %w", config.Topic, err)
	}
	return nil
}

// Publication is the name of the outbox's publication (inserts into its
// table only), which a relay of kind cdc streams through its replication
// slot: "outboxmill_" and the topic.
func (c Config) Publication() string { return "outboxmill_" + c.Topic }

// createPublication creates the outbox's publication unless it exists. A
// role that may not create it (it needs CREATE on the database and to own
// the table) leaves it to a role that may: the relay of kind cdc creates it
// when it starts, or polls, loudly, until it exists.
func createPublication(ctx context.Context, tx *sqlx.Tx, config Config) error {
	var exists bool
	if err := tx.GetContext(ctx, &exists, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, config.Publication()); err != nil {
		return fmt.Errorf("initialize outbox %s: look up its publication: %w", config.Topic, err)
	}
	if exists {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `SAVEPOINT outbox_publication`); err != nil {
		return fmt.Errorf("initialize outbox %s: %w", config.Topic, err)
	}
	_, err := tx.ExecContext(ctx, `CREATE PUBLICATION `+pgx.Identifier{config.Publication()}.Sanitize()+
		` FOR TABLE `+config.Table()+` WITH (publish = 'insert')`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		_, err = tx.ExecContext(ctx, `ROLLBACK TO SAVEPOINT outbox_publication`)
	}
	if err != nil {
		return fmt.Errorf("initialize outbox %s: create its publication: %w", config.Topic, err)
	}
	return nil
}

// Tables returns the outbox's tables, as Initialize creates them: the
// messages and the consumer groups' offsets.
func (c Config) Tables() []string { return []string{c.Table(), c.OffsetsTable()} }

// Initialized reports whether Initialize has created the outbox's tables in
// db. It only reads.
func Initialized(ctx context.Context, db *sqlx.DB, config Config) (bool, error) {
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(to_regclass(t)) FROM unnest($1::text[]) t`, config.Tables()).Scan(&n); err != nil {
		return false, fmt.Errorf("check outbox %s: %w", config.Topic, err)
	}
	return n == len(config.Tables()), nil
}
