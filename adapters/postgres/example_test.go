package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing/fstest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/postgres"
	"github.com/outboxmill/outboxmill/domain"
	"github.com/outboxmill/outboxmill/internal/exampleenv"
)

// NoteAdded is the payload of the examples' one event type.
type NoteAdded struct {
	Text string `json:"text"`
}

// noteMigrations are a module's migrations; a module embeds its own
// (//go:embed migrations/*.sql) and passes postgres.MigrationsIn(embedded,
// "migrations").
var noteMigrations = fstest.MapFS{
	"001_notes.sql": {Data: []byte(`CREATE TABLE notes (
		id      TEXT PRIMARY KEY,
		text    TEXT NOT NULL,
		version INT  NOT NULL
	);`)},
}

func ExampleOpen() {
	url, drop := exampleenv.Database()
	defer drop()
	ctx := context.Background()

	db, err := postgres.Open(ctx, url, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	var one int
	if err := db.GetContext(ctx, &one, `SELECT 1`); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("connected:", one == 1)

	// An error of Open never repeats the password of the URL.
	_, err = postgres.Open(ctx, "postgres://app:s3cret@127.0.0.1:5432/db?sslmode=bogus", 2)
	fmt.Println("bad URL:", errors.Is(err, postgres.ErrInvalidURL))
	// Output:
	// connected: true
	// bad URL: true
}

func ExampleMigrate() {
	db, drop := exampleenv.EmptyDB()
	defer drop()
	ctx := context.Background()

	pending, err := postgres.Pending(ctx, db, "notes", noteMigrations)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending:", pending)

	// Each file runs once, in its own transaction, under an advisory lock
	// keyed on the owner: a second Migrate finds nothing to do.
	for range 2 {
		if err := postgres.Migrate(ctx, db, "notes", noteMigrations); err != nil {
			fmt.Println(err)
			return
		}
	}
	if pending, err = postgres.Pending(ctx, db, "notes", noteMigrations); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending:", pending)
	// Output:
	// pending: [001_notes.sql]
	// pending: []
}

func ExampleMigrateFramework() {
	db, drop := exampleenv.EmptyDB()
	defer drop()
	ctx := context.Background()

	// The framework's own tables: processed_events, set_aside_messages,
	// outbox_set_aside, aggregate_versions, discarded_events.
	if err := postgres.MigrateFramework(ctx, db); err != nil {
		fmt.Println(err)
		return
	}
	pending, err := postgres.Pending(ctx, db, postgres.FrameworkOwner, postgres.Migrations())
	if err != nil {
		fmt.Println(err)
		return
	}
	counts, err := postgres.ProcessedCounts(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("pending:", len(pending), "processed:", len(counts))
	// Output:
	// pending: 0 processed: 0
}

// A change that only writes: its statements, the outbox row and the commit
// go to the database in one round trip.
func ExampleUnitOfWork_Do() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	uow := exampleUnitOfWork(db)

	noteID := "note-1"
	err := uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO notes (id, text, version) VALUES ($1, $2, 1)`, noteID, "buy milk"); err != nil {
			return nil, fmt.Errorf("insert note %s: %w", noteID, err)
		}
		return []domain.Event{exampleNoteAdded(noteID, 1, "buy milk")}, nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// A change that fails commits nothing, its events included.
	err = uow.Do(ctx, func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO notes (id, text, version) VALUES ($1, $2, 1)`, noteID, "again"); err != nil {
			return nil, fmt.Errorf("insert note %s: %w", noteID, err)
		}
		return []domain.Event{exampleNoteAdded(noteID, 1, "again")}, nil
	})
	fmt.Println("duplicate note refused:", postgres.IsUniqueViolation(err, "notes_pkey"))

	fmt.Println("notes:", exampleCount(db, `SELECT count(*) FROM notes`))
	fmt.Println("outbox rows:", exampleCount(db, `SELECT count(*) FROM `+outbox.ForModule("notes").Table()))
	// Output:
	// duplicate note refused: true
	// notes: 1
	// outbox rows: 1
}

// A change that reads (here an optimistic version check) gets
// ErrNeedsTransaction from its first read on the one-round-trip path, and
// Do runs it again in an ordinary transaction: keep a change's effects in
// tx.
func ExampleUnitOfWork_Do_read() {
	db, drop := exampleDB()
	defer drop()
	ctx := context.Background()
	uow := exampleUnitOfWork(db)
	if _, err := db.ExecContext(ctx, `INSERT INTO notes (id, text, version) VALUES ('note-1', 'buy milk', 1)`); err != nil {
		fmt.Println(err)
		return
	}

	runs := 0
	edit := func(ctx context.Context, tx postgres.Tx) ([]domain.Event, error) {
		runs++
		var version int
		if err := tx.GetContext(ctx, &version, `SELECT version FROM notes WHERE id = $1 FOR UPDATE`, "note-1"); err != nil {
			return nil, fmt.Errorf("load note: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE notes SET text = $2, version = $3 WHERE id = $1`, "note-1", "buy oat milk", version+1); err != nil {
			return nil, fmt.Errorf("update note: %w", err)
		}
		return []domain.Event{exampleNoteAdded("note-1", version+1, "buy oat milk")}, nil
	}
	if err := uow.Do(ctx, edit); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("change ran:", runs)
	fmt.Println("version:", exampleCount(db, `SELECT version FROM notes WHERE id = 'note-1'`))
	fmt.Println("outbox rows:", exampleCount(db, `SELECT count(*) FROM `+outbox.ForModule("notes").Table()))
	// Output:
	// change ran: 2
	// version: 2
	// outbox rows: 1
}

// A consumer handler behind Dedup writes through the transaction Dedup
// opened (HandlerTx), so its effect and the processed_events marker commit
// together; VersionGuard, in the same transaction, applies each aggregate's
// events in version order. Package consumer assembles this chain for typed
// handlers; this is what it does for each message.
func ExampleDedup_Middleware() {
	db, drop := exampleDB()
	defer drop()
	guard := postgres.VersionGuard{Handler: "notes.counter"}
	dedup := postgres.Dedup{DB: db, Handler: "notes.counter"}
	if err := dedup.Validate(); err != nil {
		fmt.Println(err)
		return
	}

	handle := dedup.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, _ := postgres.HandlerTx(ctx)
		env, err := outbox.Decode(msg)
		if err != nil {
			return nil, err
		}
		verdict, err := guard.Check(ctx, tx, postgres.AggregateRef{Type: env.AggregateType, ID: env.AggregateID, Version: env.AggregateVersion})
		if err != nil {
			return nil, err // a *GapError: the previous version is not applied yet
		}
		if verdict == postgres.Stale {
			return nil, nil
		}
		var note NoteAdded
		if err := outbox.DecodePayload(env, &note); err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO notes (id, text, version) VALUES ($1, $2, $3)
			ON CONFLICT (id) DO UPDATE SET text = EXCLUDED.text, version = EXCLUDED.version`,
			env.AggregateID, note.Text, env.AggregateVersion)
		return nil, err
	})

	first, err := outbox.Encode(exampleNoteAdded("note-1", 1, "buy milk"))
	if err != nil {
		fmt.Println(err)
		return
	}
	third, err := outbox.Encode(exampleNoteAdded("note-1", 3, "buy oat milk"))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, msg := range []*message.Message{first, first, third} {
		_, err := handle(msg)
		var gap *postgres.GapError
		switch {
		case errors.As(err, &gap):
			fmt.Printf("version %d held back: expected %d\n", gap.Got, gap.Expected)
		case err != nil:
			fmt.Println(err)
			return
		}
	}
	counts, err := postgres.ProcessedCounts(context.Background(), db)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("processed:", counts["notes.counter"])
	fmt.Println("notes:", exampleCount(db, `SELECT count(*) FROM notes`))
	// Output:
	// version 3 held back: expected 2
	// processed: 1
	// notes: 1
}

// exampleNoteAdded returns version of note id's NoteAdded event.
func exampleNoteAdded(id string, version int, text string) domain.Event {
	return domain.Event{
		ID:               domain.NewEventID(),
		Type:             "NoteAdded",
		SchemaVersion:    1,
		AggregateType:    "Note",
		AggregateID:      id,
		AggregateVersion: version,
		OccurredAt:       time.Now().UTC(),
		Payload:          NoteAdded{Text: text},
	}
}

// exampleUnitOfWork migrates db for the notes module (its table, its outbox)
// and returns a unit of work writing to that outbox.
func exampleUnitOfWork(db *sqlx.DB) *postgres.UnitOfWork {
	ctx := context.Background()
	box := outbox.ForModule("notes")
	if err := outbox.Initialize(ctx, db, box); err != nil {
		panic(err)
	}
	registry, err := domain.NewRegistry(domain.Declare[NoteAdded]("NoteAdded", 1))
	if err != nil {
		panic(err)
	}
	writer, err := outbox.NewWriter(box, registry, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	return postgres.NewUnitOfWork(db, writer, nil)
}

// exampleDB is exampleenv.DB with the notes module's migrations applied.
func exampleDB() (*sqlx.DB, func()) {
	db, drop := exampleenv.DB()
	if err := postgres.Migrate(context.Background(), db, "notes", noteMigrations); err != nil {
		drop()
		panic(err)
	}
	return db, drop
}

// exampleCount runs a query returning one number.
func exampleCount(db *sqlx.DB, query string) int {
	var n int
	if err := db.Get(&n, query); err != nil {
		panic(err)
	}
	return n
}
