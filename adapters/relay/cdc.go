package relay

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/internal/trace"
)

// KindCDC is the relay that reads the outbox through PostgreSQL's logical
// replication (see NewCDC).
const KindCDC = "cdc"

// HeartbeatPrefix is the prefix of the logical decoding messages a CDC relay
// emits in its database (pg_logical_emit_message) so that its slot moves on
// while the outbox is idle.
const HeartbeatPrefix = "outboxmill.heartbeat"

// NewCDC returns a relay of kind KindCDC over the outbox in db, which must
// be opened with pgx's stdlib driver: the relay opens its replication
// connection with the same settings. It is the Outboxmill relay (the same
// stream, window, lease, set-aside rows and position table) reading the
// outbox's inserts from a replication slot with pgoutput instead of polling
// the table:
//
//   - a publication of the outbox table (inserts only; Config.Publication)
//     and a slot per outbox and consumer group (Config.Slot), created by the
//     relay when missing;
//   - transactions come in commit order, as they commit, whatever runs on
//     the server: no wait for older open transactions, and no polling;
//   - the slot's confirmed position, and the position recorded in
//     outbox_cdc_positions, move only past transactions whose every event the
//     broker confirmed; a restart resumes there;
//   - the offsets table's position is kept in step (see feed.store), so that
//     a polling relay can take over; a CDC relay that finds it moved by
//     another kind reads the outbox from it into a new slot, through the
//     slot's exported snapshot, and streams from there;
//   - a slot that is lost or dropped is recreated the same way, and when no
//     slot can be had (wal_level is not logical, no free slot, no
//     REPLICATION privilege) the relay polls, loudly, for
//     Config.FallbackInterval before it tries again.
func NewCDC(db *sqlx.DB, config Config) (*Outboxmill, error) {
	r, err := NewOutboxmill(db, config)
	if err != nil {
		return nil, err
	}
	r.logical = true
	r.logger = r.logger.With("relay_kind", KindCDC)
	return r, nil
}

// errFallbackOver ends a stream that polled while no replication slot could
// be had: the relay tries the slot again at once.
var errFallbackOver = errors.New("relay: polling fallback over; trying the replication slot again")

// SlotMetrics receives a CDC relay's slot health. A Config.Metrics that
// implements it gets it; adapters/metrics.Relay does.
type SlotMetrics interface {
	// Slot reports the slot's WAL status (pg_replication_slots.wal_status:
	// reserved, extended, unreserved or lost), the WAL it retains in bytes
	// (from its restart_lsn) and how far its confirmed position is behind
	// the server's WAL in bytes.
	Slot(walStatus string, retainedBytes, confirmedLagBytes int64)
	// Fallback reports whether the relay polls because no replication slot
	// could be had.
	Fallback(polling bool)
	// SlotRecreated reports a slot the relay created again: it was lost,
	// dropped, or left behind by another relay kind.
	SlotRecreated()
}

// ErrSlotNotStreamed is wrapped by a cdc relay's Health while its slot
// cannot be streamed.
var ErrSlotNotStreamed = errors.New("cdc relay cannot stream its replication slot")

// unstreamedAttempts is how many attempts in a row must fail to stream the
// slot before Health says so: one failure may be a session ended under the
// stream, which the next attempt mends.
const unstreamedAttempts = 2

// slotHealth is whether a cdc relay's slot can be streamed: how many
// attempts in a row failed before the stream marked anything (the slot or
// its publication missing, no slot to be had, the stream failing), the
// last one's error, and the slot whose stream lacks its publication (it is
// recreated at the next attempt).
type slotHealth struct {
	mu       sync.Mutex
	failures int
	err      error
	broken   string
}

// failed records an attempt that did not stream.
func (h *slotHealth) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	h.err = err
}

// streamed records a stream that marked what it read.
func (h *slotHealth) streamed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures, h.err = 0, nil
}

// health returns an error wrapping ErrSlotNotStreamed after
// unstreamedAttempts failed attempts in a row.
func (h *slotHealth) health() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failures < unstreamedAttempts {
		return nil
	}
	return fmt.Errorf("%w (%d attempts in a row): %w", ErrSlotNotStreamed, h.failures, h.err)
}

// markBroken records that slot's stream lacks its publication.
func (h *slotHealth) markBroken(slot string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.broken = slot
}

// takeBroken reports whether slot was marked broken, and forgets it.
func (h *slotHealth) takeBroken(slot string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.broken != slot {
		return false
	}
	h.broken = ""
	return true
}

// codeUndefinedObject is SQLSTATE undefined_object: in a replication
// stream, pgoutput's "publication does not exist".
const codeUndefinedObject = "42704"

// streamEnded records how the stream of f ended with err: a stream that
// marked nothing is a failed attempt, and a stream ended because its
// publication is missing from the slot's history marks the slot to be
// recreated. pgoutput reads the publication as the catalog was at each
// change it decodes, so a publication dropped, even if created again
// since, fails every stream from the slot at the same change: only a new
// slot, read from the stored position, gets past it.
func (r *Outboxmill) streamEnded(ctx context.Context, f *feed, err error) {
	if ctx.Err() != nil {
		return
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == codeUndefinedObject {
		r.slot.markBroken(f.slot)
		r.logger.Error("cdc relay: the slot's stream lacks its publication (dropped, perhaps created again); recreating the slot from the stored position",
			"slot", f.slot, "publication", f.publication, "err", err)
	}
	if !f.marked.Load() {
		r.slot.failed(err)
		// The heartbeat reports the slot only while it streams: a slot
		// failing every attempt still has its WAL reported, for the alert
		// on retained WAL.
		f.reportSlot(ctx)
	}
}

// laterThan reports whether position a comes after b in delivery order.
func laterThan(a, b position) bool {
	x, errA := strconv.ParseUint(a.txID, 10, 64)
	y, errB := strconv.ParseUint(b.txID, 10, 64)
	if errA != nil || errB != nil {
		return false
	}
	return x > y || x == y && a.offset > b.offset
}

// lsnOf parses an LSN in PostgreSQL's text form.
func lsnOf(s string) (uint64, error) {
	l, err := pglogrepl.ParseLSN(s)
	return uint64(l), err
}

// sample is a point at which every transaction below xmin had ended and
// its commit record was in the WAL before lsn.
type sample struct {
	xmin string // xid8 in text form
	lsn  uint64
}

// feed streams an outbox's inserts from a replication slot into a stream.
// Its reader goroutine owns the replication connection's reads; status
// updates are written from the same goroutine (a connection can be read
// and written at once, not written from two goroutines).
type feed struct {
	r           *Outboxmill
	conn        *pgconn.PgConn
	slot        string
	publication string
	start       uint64 // where streaming starts

	// Set when the slot is new: the outbox rows after from in the slot's
	// exported snapshot are read first (see catchUp).
	catchup  *snapshotReader
	from     position
	snapXmin uint64 // the snapshot's xmin

	ack      atomic.Uint64 // stored: every transaction committed before it is forwarded and marked
	marked   atomic.Bool   // a store succeeded: the slot streams
	received atomic.Uint64 // the end of what the stream has received

	// The position writer's own: the sample the stream is not past yet.
	pending *sample

	stop     chan struct{}
	stopOnce sync.Once
	reading  bool          // read was started
	done     chan struct{} // closed when read returns
	recvDone chan struct{} // closed when receive returns; nil until it starts
}

// slotName is the default replication slot of an outbox and consumer group
// in database db: slots are named per server, so the name depends on all
// three.
func slotName(db, topic, group string) string {
	h := sha256.Sum256([]byte(db + "\x00" + topic + "\x00" + group))
	return "outboxmill_" + identPart(topic, 24) + "_" + hex.EncodeToString(h[:6])
}

// identPart is s as lowercase letters, digits and underscores, at most n
// bytes: what a slot name may hold.
func identPart(s string, n int) string {
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		if b.Len() == n {
			break
		}
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// slotState is a replication slot as pg_replication_slots shows it.
type slotState struct {
	exists    bool
	database  string
	walStatus string
	activePID sql.NullInt64
}

// cdcRecord is a row of outbox_cdc_positions.
type cdcRecord struct {
	found bool
	slot  string
	lsn   uint64
	pos   position
}

// openFeed opens the replication connection and the slot of the outbox,
// creating what is missing: it resumes the slot where the record says, or,
// when there is no record, the slot is gone or lost, or the offsets position
// moved since the record (another relay kind ran), it creates the slot again
// and reads the outbox after pos from the slot's snapshot first. Call close
// when done with it.
func (r *Outboxmill) openFeed(ctx context.Context, l *lease, pos position) (_ *feed, err error) {
	var dbName string
	if err := r.db.GetContext(ctx, &dbName, `SELECT current_database()`); err != nil {
		return nil, fmt.Errorf("cdc: %w", err)
	}
	f := &feed{r: r, slot: r.config.Slot, publication: r.config.Publication,
		stop: make(chan struct{}), done: make(chan struct{})}
	if f.slot == "" {
		f.slot = slotName(dbName, r.config.Outbox.Topic, r.config.ConsumerGroup)
	}
	if f.publication == "" {
		f.publication = r.config.Outbox.Publication()
	}
	if err := r.ensurePublication(ctx, f.publication); err != nil {
		return nil, err
	}
	if f.conn, err = r.replicationConn(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if f.catchup != nil {
				f.catchup.close()
			}
			f.closeConn()
		}
	}()
	rec, err := r.loadCDCRecord(ctx)
	if err != nil {
		return nil, err
	}
	st, err := r.slotState(ctx, f.slot)
	if err != nil {
		return nil, err
	}
	if st.exists && st.database != dbName {
		return nil, fmt.Errorf("cdc: replication slot %s belongs to database %s, not %s (set Config.Slot)", f.slot, st.database, dbName)
	}
	broken := r.slot.takeBroken(f.slot)
	switch {
	case broken && st.exists:
		// The stream lacks its publication (streamEnded): already said.
	case rec.found && rec.slot == f.slot && st.exists && st.walStatus != "lost" && rec.pos == pos:
		if err := r.endOtherWalsender(ctx, f.slot, st); err != nil {
			return nil, err
		}
		f.start = rec.lsn
		f.ack.Store(rec.lsn)
		r.logger.Info("cdc relay resuming its replication slot", "slot", f.slot, "lsn", pglogrepl.LSN(rec.lsn).String())
		return f, nil
	case !rec.found && !st.exists:
		r.logger.Info("cdc relay creating its replication slot", "slot", f.slot, "publication", f.publication)
	case !rec.found:
		// Created, but its stream never marked anything (the relay stopped
		// before), so nothing says where it stands: start it again.
		r.logger.Info("cdc relay creating its replication slot again: it has no recorded position yet", "slot", f.slot)
	case rec.slot != f.slot:
		// Config.Slot changed: the recorded slot is left behind.
		r.logger.Warn("cdc relay: the slot's name changed; dropping the old slot and reading the outbox from the stored position into the new one",
			"slot", f.slot, "old_slot", rec.slot)
		if old, err := r.slotState(ctx, rec.slot); err != nil {
			return nil, err
		} else if old.exists && old.database == dbName {
			if err := r.endOtherWalsender(ctx, rec.slot, old); err != nil {
				return nil, err
			}
			if err := dropEndedSlot(ctx, f.conn, rec.slot); err != nil {
				return nil, err
			}
		}
	case st.walStatus == "lost":
		r.logger.Error("cdc relay: replication slot lost (its WAL was removed); re-reading the outbox from the stored position into a new slot",
			"slot", f.slot, "position_tx", pos.txID, "position_offset", pos.offset)
	case rec.found && !st.exists:
		r.logger.Error("cdc relay: replication slot dropped; re-reading the outbox from the stored position into a new slot",
			"slot", f.slot, "position_tx", pos.txID, "position_offset", pos.offset)
	default:
		r.logger.Warn("cdc relay: the stored position is not the one this relay kind left (another relay kind ran); reading the outbox from it into a new slot",
			"slot", f.slot, "position_tx", pos.txID, "position_offset", pos.offset)
	}
	if err := r.recreateSlot(ctx, l, f, st, rec.found); err != nil {
		return nil, err
	}
	f.from = pos
	return f, nil
}

// recreateSlot drops f's slot if it exists (recorded: the record named
// one), forgets the record (a crash
// before the new slot's first mark must not resume it from the old
// record), creates the slot and imports its snapshot into f.catchup.
func (r *Outboxmill) recreateSlot(ctx context.Context, l *lease, f *feed, st slotState, recorded bool) error {
	if err := l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
		_, err := conn.ExecContext(ctx, `DELETE FROM outbox_cdc_positions WHERE outbox = $1 AND consumer_group = $2`,
			r.config.Outbox.Topic, r.config.ConsumerGroup)
		return err
	}); err != nil {
		return fmt.Errorf("cdc: forget the slot's record: %w", err)
	}
	if st.exists {
		if err := r.endOtherWalsender(ctx, f.slot, st); err != nil {
			return err
		}
		if err := dropEndedSlot(ctx, f.conn, f.slot); err != nil {
			return err
		}
	}
	if m, ok := r.config.Metrics.(SlotMetrics); ok && (st.exists || recorded) {
		m.SlotRecreated() // dropped, lost or left behind: not a first start
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, f.conn, f.slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		return fmt.Errorf("cdc: create replication slot %s: %w", f.slot, err)
	}
	if f.start, err = lsnOf(res.ConsistentPoint); err != nil {
		return fmt.Errorf("cdc: slot %s: consistent point %q: %w", f.slot, res.ConsistentPoint, err)
	}
	// The snapshot stays valid until the replication connection runs its
	// next command: import it before starting replication. It is read on a
	// connection of its own, not one of the pool's, which the stream needs
	// while the snapshot is read.
	sr, xmin, err := r.importSnapshot(ctx, res.SnapshotName)
	if err != nil {
		return err
	}
	f.catchup = sr
	// Every transaction below the snapshot's xmin committed before the
	// consistent point: once the stream is past it, they are all forwarded.
	f.pending = &sample{xmin: xmin, lsn: f.start}
	if f.snapXmin, err = strconv.ParseUint(xmin, 10, 64); err != nil {
		return fmt.Errorf("cdc: the slot's snapshot xmin %q: %w", xmin, err)
	}
	return nil
}

// ensurePublication creates the outbox's publication (inserts only) unless
// it exists. outbox.Initialize creates it already, when its role may.
func (r *Outboxmill) ensurePublication(ctx context.Context, name string) error {
	var exists bool
	if err := r.db.GetContext(ctx, &exists, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, name); err != nil {
		return fmt.Errorf("cdc: look up publication %s: %w", name, err)
	}
	if exists {
		return nil
	}
	_, err := r.db.ExecContext(ctx, `CREATE PUBLICATION `+pgx.Identifier{name}.Sanitize()+` FOR TABLE `+
		r.config.Outbox.Table()+` WITH (publish = 'insert')`)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42710" { // duplicate_object: created meanwhile
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc: create publication %s: %w", name, err)
	}
	return nil
}

// connConfig returns the connection settings of the relay's database
// pool.
func (r *Outboxmill) connConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	c, err := r.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("cdc: %w", err)
	}
	defer c.Close()
	var cfg *pgx.ConnConfig
	err = c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("cdc: the relay's database must be opened with pgx's stdlib driver, not %T", dc)
		}
		cfg = sc.Conn().Config()
		return nil
	})
	return cfg, err
}

// replicationConn opens a logical replication connection with the settings
// of the relay's database pool.
func (r *Outboxmill) replicationConn(ctx context.Context) (*pgconn.PgConn, error) {
	base, err := r.connConfig(ctx)
	if err != nil {
		return nil, err
	}
	cfg := base.Config.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cdc: open replication connection: %w", err)
	}
	return conn, nil
}

// snapshotReader is a read-only repeatable-read transaction in a new
// slot's exported snapshot, on a connection of its own.
type snapshotReader struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

// importSnapshot opens a snapshotReader in the exported snapshot name and
// returns it with the snapshot's xmin.
func (r *Outboxmill) importSnapshot(ctx context.Context, name string) (*snapshotReader, string, error) {
	cfg, err := r.connConfig(ctx)
	if err != nil {
		return nil, "", err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("cdc: connect to read the slot's snapshot: %w", err)
	}
	sr := &snapshotReader{conn: conn}
	var xmin string
	sr.tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err == nil {
		_, err = sr.tx.Exec(ctx, `SET TRANSACTION SNAPSHOT '`+strings.ReplaceAll(name, "'", "''")+`'`)
	}
	if err == nil {
		err = sr.tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text`).Scan(&xmin)
	}
	if err != nil {
		sr.close()
		return nil, "", fmt.Errorf("cdc: import the slot's snapshot: %w", err)
	}
	return sr, xmin, nil
}

// close ends the transaction and closes the connection.
func (sr *snapshotReader) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if sr.tx != nil {
		_ = sr.tx.Rollback(ctx)
	}
	_ = sr.conn.Close(ctx)
}

func (r *Outboxmill) loadCDCRecord(ctx context.Context) (cdcRecord, error) {
	var rec cdcRecord
	var lsn string
	err := r.db.QueryRowxContext(ctx, `
		SELECT slot_name, lsn::text, position_tx::text, position_offset FROM outbox_cdc_positions
		WHERE outbox = $1 AND consumer_group = $2`, r.config.Outbox.Topic, r.config.ConsumerGroup).
		Scan(&rec.slot, &lsn, &rec.pos.txID, &rec.pos.offset)
	if errors.Is(err, sql.ErrNoRows) {
		return rec, nil
	}
	if err != nil {
		return rec, fmt.Errorf("cdc: load slot record: %w", err)
	}
	rec.found = true
	if rec.lsn, err = lsnOf(lsn); err != nil {
		return rec, fmt.Errorf("cdc: slot record lsn %q: %w", lsn, err)
	}
	return rec, nil
}

func (r *Outboxmill) slotState(ctx context.Context, slot string) (slotState, error) {
	var st slotState
	var walStatus sql.NullString
	err := r.db.QueryRowxContext(ctx, `
		SELECT database, wal_status, active_pid FROM pg_replication_slots WHERE slot_name = $1`, slot).
		Scan(&st.database, &walStatus, &st.activePID)
	if errors.Is(err, sql.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("cdc: look up replication slot %s: %w", slot, err)
	}
	st.exists, st.walStatus = true, walStatus.String
	return st, nil
}

// endOtherWalsender ends the session that still streams from the slot: it
// belongs to a relay that lost its lease (this one holds it), killed or
// frozen without its connection being closed yet. It waits until the slot
// is free.
func (r *Outboxmill) endOtherWalsender(ctx context.Context, slot string, st slotState) error {
	if !st.activePID.Valid {
		return nil
	}
	r.logger.Warn("cdc relay: ending the session of a former relay still on the slot", "slot", slot, "pid", st.activePID.Int64)
	if _, err := r.db.ExecContext(ctx, `SELECT pg_terminate_backend($1)`, st.activePID.Int64); err != nil {
		return fmt.Errorf("cdc: end the former relay's session on slot %s: %w", slot, err)
	}
	deadline := time.Now().Add(r.config.LeaseTimeout)
	for {
		now, err := r.slotState(ctx, slot)
		if err != nil {
			return err
		}
		if !now.activePID.Valid {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cdc: replication slot %s still in use by pid %d", slot, now.activePID.Int64)
		}
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// dropEndedSlot drops slot once endOtherWalsender has ended the session on
// it. A slot that session was still creating (a relay killed while its
// CREATE_REPLICATION_SLOT waited for running transactions) went with the
// session: it is gone already, which is what the drop is for.
func dropEndedSlot(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	err := pglogrepl.DropReplicationSlot(ctx, conn, slot, pglogrepl.DropReplicationSlotOptions{Wait: true})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object
		return nil
	}
	if err != nil {
		return fmt.Errorf("cdc: drop replication slot %s: %w", slot, err)
	}
	return nil
}

// fallBackWorthy reports whether err, from openFeed, means that no slot can
// be had for now, so that the relay should poll meanwhile: the server
// refused what the slot needs. Any other error (a lost connection, a
// terminated session, a server shutting down) is retried as usual.
func fallBackWorthy(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55000", // object_not_in_prerequisite_state: wal_level is not logical
		"42501", // insufficient_privilege: no REPLICATION, or may not create the publication
		"53400", // configuration_limit_exceeded: every replication slot is in use
		"42P01", // undefined_table: outbox_cdc_positions is not migrated
		"42704": // undefined_object: the publication is missing
		return true
	case "53300": // too_many_connections: every walsender is in use, or only every connection for now
		return strings.Contains(pgErr.Message, "max_wal_senders")
	}
	return false
}

// setFallback reports whether the relay polls for want of a slot.
func (r *Outboxmill) setFallback(polling bool) {
	if m, ok := r.config.Metrics.(SlotMetrics); ok {
		m.Fallback(polling)
	}
}

// read feeds the stream: the rows of the slot's snapshot first, when the
// slot is new, then the transactions streamed from the slot, each as rows
// in commit order, the last row of a transaction carrying its end LSN. A
// failure is sent as the last batch.
func (f *feed) read(ctx context.Context, out chan<- batch) {
	defer close(f.done)
	if err := f.readAll(ctx, out); err != nil && ctx.Err() == nil {
		select {
		case out <- batch{err: err}:
		case <-ctx.Done():
		}
	}
}

func (f *feed) readAll(ctx context.Context, out chan<- batch) error {
	if f.catchup != nil {
		if err := f.catchUp(ctx, out); err != nil {
			return err
		}
	}
	if err := pglogrepl.StartReplication(ctx, f.conn, f.slot, pglogrepl.LSN(f.start), pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + strings.ReplaceAll(f.publication, "'", "''") + "'",
			"messages 'true'"},
	}); err != nil {
		return fmt.Errorf("cdc: start replication from slot %s: %w", f.slot, err)
	}
	f.received.Store(f.start)
	msgs := make(chan walMessage, 1024)
	f.recvDone = make(chan struct{})
	go f.receive(msgs)
	return f.stream(ctx, msgs, out)
}

// catchUp sends the outbox rows after f.from that the slot's snapshot
// sees, in (transaction_id, offset) order, then a mark at the slot's
// consistent point: every transaction committed before it is among them.
func (f *feed) catchUp(ctx context.Context, out chan<- batch) error {
	defer func() {
		f.catchup.close()
		f.catchup = nil
	}()
	from := f.from
	n := 0
	for {
		rows, err := f.snapshotBatch(ctx, from)
		if err != nil {
			return err
		}
		n += len(rows)
		if len(rows) > 0 {
			from = rows[len(rows)-1].pos
			if !send(ctx, out, rows) {
				return nil
			}
		}
		if len(rows) < f.r.config.BatchSize {
			break
		}
	}
	f.r.logger.Info("cdc relay read the outbox into its new slot; streaming", "slot", f.slot, "rows", n)
	send(ctx, out, []row{{tick: true, lsn: f.start}})
	return nil
}

func send(ctx context.Context, out chan<- batch, rows []row) bool {
	select {
	case out <- batch{rows: rows}:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *feed) snapshotBatch(ctx context.Context, from position) ([]row, error) {
	rs, err := f.catchup.tx.Query(ctx, `
		SELECT m.transaction_id::text, m."offset", m.uuid, m.payload::text
		FROM `+f.r.config.Outbox.Table()+` m
		WHERE (m.transaction_id, m."offset") > ($1::xid8, $2::bigint)
		ORDER BY m.transaction_id, m."offset"
		LIMIT $3`, from.txID, from.offset, f.r.config.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("cdc: read the outbox in the slot's snapshot: %w", err)
	}
	defer rs.Close()
	var rows []row
	for rs.Next() {
		var (
			pos     position
			uuid    string
			payload *string
		)
		if err := rs.Scan(&pos.txID, &pos.offset, &uuid, &payload); err != nil {
			return nil, fmt.Errorf("cdc: read the outbox in the slot's snapshot: %w", err)
		}
		var body []byte
		if payload != nil {
			body = []byte(*payload)
		}
		x := newRow(pos, uuid, body)
		x.snapshot = true
		rows = append(rows, x)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("cdc: read the outbox in the slot's snapshot: %w", err)
	}
	return rows, nil
}

// walMessage is what the receiving goroutine hands on: the data of one
// CopyData message of the replication stream, or the error that ended it.
type walMessage struct {
	data []byte
	err  error
}

// receive reads the replication stream until the connection fails or is
// closed, and hands each message on to msgs.
func (f *feed) receive(msgs chan<- walMessage) {
	defer close(f.recvDone)
	for {
		m, err := f.conn.ReceiveMessage(context.Background())
		var out walMessage
		switch m := m.(type) {
		case *pgproto3.CopyData:
			out.data = append([]byte(nil), m.Data...)
		case *pgproto3.ErrorResponse:
			out.err = pgconn.ErrorResponseToPgError(m)
		default:
			if err == nil {
				continue // notices, parameter status
			}
			out.err = err
		}
		select {
		case msgs <- out:
		case <-f.stop:
			return
		}
		if out.err != nil {
			return
		}
	}
}

// relation is the columns of the outbox table as the stream names them.
type relation struct {
	tx, offset, uuid, payload int
}

// stream turns the messages received into batches of rows for the stream,
// taking all that has come while the stream was busy into one batch, and
// sends the slot's status: every Config.StatusInterval, and whenever the
// server asks.
func (f *feed) stream(ctx context.Context, msgs <-chan walMessage, out chan<- batch) error {
	status := time.NewTicker(f.r.config.StatusInterval)
	defer status.Stop()
	rels := map[uint32]relation{}
	var (
		pending  []row // to send
		inTx     []row // of the transaction being received
		open     bool  // between a Begin and its Commit
		lastTick time.Time
		// The rows streaming in are handed over at most once a
		// ReadInterval, paced as the polling relay's reads are: a batch
		// handed over holds the next one back until the interval is over,
		// unless either is full.
		pacer = readPacer{interval: f.r.config.ReadInterval}
		held  <-chan time.Time
		// Only the rows at the head of pending that other sessions can
		// see are handed over (visible.go): visible counts them, as of a
		// look at checked rows at checkedAt; while the head is not
		// visible, the next look waits for recheck.
		vis = visibility{current: func(ctx context.Context) (string, error) {
			var s string
			err := f.r.db.GetContext(ctx, &s, `SELECT pg_current_snapshot()::text`)
			return s, err
		}}
		visible, checked int
		checkedAt        time.Time
		recheck          <-chan time.Time
		recheckWait      = firstVisibilityWait
		invisibleSince   time.Time
		warned           string // the transaction the relay said it waits for
	)
	tick := func(lsn uint64) {
		if open || time.Since(lastTick) < f.r.config.StatusInterval {
			return
		}
		lastTick = time.Now()
		if n := len(pending); n > 0 && pending[n-1].tick {
			pending[n-1].lsn = lsn
			return
		}
		pending = append(pending, row{tick: true, lsn: lsn})
	}
	for {
		in, outc := msgs, out
		if len(pending) >= f.r.config.BatchSize {
			in = nil // the stream is behind: let the server wait
		}
		if len(pending) == 0 {
			outc = nil
		} else if wait := pacer.wait(time.Now()); wait > 0 && len(pending) < f.r.config.BatchSize {
			outc = nil
			if held == nil {
				held = time.After(wait)
			}
		}
		if outc != nil {
			// A look finds what became visible since the last one: once
			// the head waits, when recheck fires; otherwise for rows come
			// since, at most once a ReadInterval while a batch is ready.
			if recheck == nil && len(pending) > checked &&
				(visible == 0 || time.Since(checkedAt) >= f.r.config.ReadInterval) {
				n, err := vis.visible(ctx, pending[visible:])
				if err != nil {
					return err
				}
				visible += n
				checked, checkedAt = len(pending), time.Now()
				if visible == 0 {
					recheck = time.After(recheckWait)
					recheckWait = min(2*recheckWait, lastVisibilityWait)
					if invisibleSince.IsZero() {
						invisibleSince = checkedAt
					} else if tx := pending[0].pos.txID; time.Since(invisibleSince) > invisibleWarning && warned != tx {
						warned = tx
						f.r.logger.Warn("cdc relay: a streamed transaction is committed but not yet visible to other sessions; holding it and those after it (a synchronous standby not confirming?)",
							"slot", f.slot, "transaction_id", tx, "waiting", time.Since(invisibleSince).Round(time.Millisecond))
					}
				} else {
					recheckWait, invisibleSince = firstVisibilityWait, time.Time{}
				}
			}
			if visible == 0 {
				outc = nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-held:
			held = nil
		case <-recheck:
			recheck, checked = nil, 0
		case <-status.C:
			if err := f.sendStatus(false); err != nil {
				return err
			}
		case outc <- batch{rows: pending[:visible:visible]}:
			pacer.read(time.Now(), visible, visible >= f.r.config.BatchSize, visible < len(pending))
			pending = pending[visible:]
			if len(pending) == 0 {
				pending = nil
			}
			visible, checked = 0, 0
		case m := <-in:
			if m.err != nil {
				return fmt.Errorf("cdc: replication stream of slot %s: %w", f.slot, m.err)
			}
			if len(m.data) == 0 {
				continue
			}
			switch m.data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				f.noteReceived(uint64(k.ServerWALEnd))
				// Every transaction before the server's end has been sent.
				tick(uint64(k.ServerWALEnd))
				if k.ReplyRequested {
					if err := f.sendStatus(false); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.data[1:])
				if err != nil {
					return fmt.Errorf("cdc: %w", err)
				}
				lm, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("cdc: decode pgoutput message: %w", err)
				}
				switch lm := lm.(type) {
				case *pglogrepl.RelationMessage:
					rel, err := f.relation(lm)
					if err != nil {
						return err
					}
					rels[lm.RelationID] = rel
				case *pglogrepl.BeginMessage:
					open, inTx = true, inTx[:0]
				case *pglogrepl.InsertMessage:
					rel, ok := rels[lm.RelationID]
					if !ok {
						return fmt.Errorf("cdc: insert into relation %d before its description", lm.RelationID)
					}
					x, err := rel.row(lm.Tuple)
					if err != nil {
						return err
					}
					inTx = append(inTx, x)
				case *pglogrepl.CommitMessage:
					open = false
					end := uint64(lm.TransactionEndLSN)
					if n := len(inTx); n > 0 {
						inTx[n-1].lsn, inTx[n-1].txEnd = end, true
						if trace.On() {
							for _, x := range inTx {
								if x.msg != nil {
									trace.Mark(trace.Read, x.msg.UUID)
								}
							}
						}
						pending = append(pending, inTx...)
						inTx = nil
					}
					f.noteReceived(end)
				case *pglogrepl.LogicalDecodingMessage:
					if !lm.Transactional {
						f.noteReceived(uint64(lm.LSN))
						tick(uint64(lm.LSN))
					}
				}
			}
		}
	}
}

// relation maps the outbox table's columns as the stream describes them.
func (f *feed) relation(m *pglogrepl.RelationMessage) (relation, error) {
	rel := relation{tx: -1, offset: -1, uuid: -1, payload: -1}
	for i, c := range m.Columns {
		switch c.Name {
		case "transaction_id":
			rel.tx = i
		case "offset":
			rel.offset = i
		case "uuid":
			rel.uuid = i
		case "payload":
			rel.payload = i
		}
	}
	if rel.tx < 0 || rel.offset < 0 || rel.uuid < 0 || rel.payload < 0 {
		return rel, fmt.Errorf("cdc: relation %s.%s in publication %s is not an outbox table", m.Namespace, m.RelationName, f.publication)
	}
	return rel, nil
}

// row decodes one inserted outbox row.
func (rel relation) row(t *pglogrepl.TupleData) (row, error) {
	col := func(i int) (string, bool) {
		if t == nil || i >= len(t.Columns) || t.Columns[i].DataType != pglogrepl.TupleDataTypeText {
			return "", false
		}
		return string(t.Columns[i].Data), true
	}
	tx, okTx := col(rel.tx)
	off, okOff := col(rel.offset)
	if !okTx || !okOff {
		return row{}, errors.New("cdc: an outbox insert without its transaction_id or offset")
	}
	offset, err := strconv.ParseInt(off, 10, 64)
	if err != nil {
		return row{}, fmt.Errorf("cdc: outbox offset %q: %w", off, err)
	}
	uuid, _ := col(rel.uuid)
	payload, _ := col(rel.payload) // NULL: empty, as the polling relays read it
	return newRow(position{txID: tx, offset: offset}, uuid, []byte(payload)), nil
}

func (f *feed) noteReceived(lsn uint64) {
	if lsn > f.received.Load() {
		f.received.Store(lsn)
	}
}

// sendStatus tells the server what the relay received (write) and what
// it forwarded and marked (flush and apply: the slot's confirmed position
// moves only that far). Both are set: pglogrepl would otherwise take the
// write position for the others.
func (f *feed) sendStatus(reply bool) error {
	ack := f.ack.Load()
	if ack == 0 {
		ack = f.start // a new slot confirms its consistent point already
	}
	if ack == 0 {
		return nil
	}
	write := max(f.received.Load(), ack)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), f.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(write),
		WALFlushPosition: pglogrepl.LSN(ack),
		WALApplyPosition: pglogrepl.LSN(ack),
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("cdc: send status of slot %s: %w", f.slot, err)
	}
	return nil
}

// sampleQuery takes a sample: the oldest transaction id that may still
// write to the outbox, and the WAL's insert position after it was found.
//
// Only transactions of the outbox's own database can write its rows, so
// transactions of other databases do not count: a transaction held open
// there must not hold the offsets position back. Every transaction with an
// id holds the ExclusiveLock on it from its first write to its end, after
// its commit record is in the WAL, and pg_locks shows every session's locks
// to every role. So the sample is the least of the next id to be assigned
// (read first: a transaction that gets its id later has a larger one) and
// the ids locked by sessions not known to be in another database
// (a prepared transaction has none, and counts). The next id is the
// snapshot's xmax, one past the latest completed id: a running transaction
// may have a larger one, so the 32-bit ids of pg_locks are widened to xid8
// as the ids within 2^31 of it (as PostgreSQL compares ids). A transaction
// below the sample had its id before the snapshot and, unless it is among
// those locked, ended before pg_locks was read; the insert position is
// read after.
const sampleQuery = `
	WITH next AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::numeric AS x),
	elsewhere AS (
		SELECT pid FROM pg_stat_activity
		WHERE datid IS NOT NULL AND datid <> (SELECT oid FROM pg_database WHERE datname = current_database())),
	running AS (
		SELECT next.x + ((l.transactionid::text::numeric - next.x % 4294967296) % 4294967296
		                 + 6442450944) % 4294967296 - 2147483648 AS x
		FROM pg_locks l, next
		WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
		  AND (l.pid IS NULL OR l.pid NOT IN (SELECT pid FROM elsewhere)))
	SELECT least((SELECT x FROM next), (SELECT min(x) FROM running))::text, pg_current_wal_insert_lsn()::text`

// store marks rows, settled in stream order, as the position writer does
// for a polling relay (see positionWriter.store), and returns the position
// stored in the offsets table. In one transaction on the lease's session:
//
//   - the rows to set aside are recorded;
//   - once the stream is past the pending sample (every transaction
//     committed before its LSN is marked), the sample gives the offsets
//     position: the last outbox row of a transaction below the sample's
//     xmin. Every row at or before it is forwarded, so a polling relay that
//     takes over from it loses nothing, and re-sends what was forwarded
//     since the sample. A new sample of the oldest transaction that may
//     write to the outbox and of the WAL position (sampleQuery) is taken
//     then: one at a time, as the stream passes each;
//   - the offsets position moves there (compare-and-set from prev);
//   - outbox_cdc_positions records the LSN past every transaction marked,
//     and the offsets position stored with it.
//
// Once committed, the slot's status may confirm that LSN.
func (f *feed) store(ctx context.Context, l *lease, prev position, rows, aside []row) (position, error) {
	r := f.r
	ack := f.ack.Load()
	var caught position // the last row read from the snapshot below its xmin
	for _, x := range rows {
		if (x.txEnd || x.tick) && x.lsn > ack {
			ack = x.lsn
		}
		if x.snapshot {
			if id, err := strconv.ParseUint(x.pos.txID, 10, 64); err == nil && id < f.snapXmin {
				caught = x.pos
			}
		}
	}
	next := prev
	var pending *sample
	err := l.use(ctx, func(ctx context.Context, conn *sqlx.Conn) error {
		return r.mark(ctx, conn, aside, func(tx *sqlx.Tx) error {
			var err error
			next, pending, err = f.move(ctx, tx, prev, ack, caught)
			return err
		})
	})
	if err != nil {
		return prev, err
	}
	f.pending = pending
	f.ack.Store(ack)
	if !f.marked.Swap(true) {
		r.slot.streamed()
	}
	return next, nil
}

// move moves the offsets position from prev past the rows of the pending
// sample once ack is past it, or to caught, whichever is further, takes the
// next sample when none is pending, and records ack, through tx. It returns
// the position and the sample now pending.
//
// caught, when set, is the last row read from a new slot's snapshot whose
// transaction is below the snapshot's xmin: every row before it is in the
// snapshot, read before it, so the position may move there while the
// snapshot is still being read, long before the stream reaches the
// snapshot's sample.
func (f *feed) move(ctx context.Context, tx *sqlx.Tx, prev position, ack uint64, caught position) (position, *sample, error) {
	r := f.r
	next, pending := prev, f.pending
	if pending != nil && pending.lsn <= ack {
		var p position
		err := tx.QueryRowxContext(ctx, `
			SELECT m.transaction_id::text, m."offset" FROM `+r.config.Outbox.Table()+` m
			WHERE m.transaction_id < $1::xid8 AND (m.transaction_id, m."offset") > ($2::xid8, $3::bigint)
			ORDER BY m.transaction_id DESC, m."offset" DESC LIMIT 1`, pending.xmin, prev.txID, prev.offset).
			Scan(&p.txID, &p.offset)
		switch {
		case err == nil:
			next = p
		case !errors.Is(err, sql.ErrNoRows):
			return prev, nil, fmt.Errorf("store relay position: %w", err)
		}
		pending = nil
	}
	if pending == nil {
		var s sample
		var lsn string
		if err := tx.QueryRowxContext(ctx, sampleQuery).Scan(&s.xmin, &lsn); err != nil {
			return prev, nil, fmt.Errorf("store relay position: sample: %w", err)
		}
		var err error
		if s.lsn, err = lsnOf(lsn); err != nil {
			return prev, nil, fmt.Errorf("store relay position: sample: %w", err)
		}
		pending = &s
	}
	if caught.txID != "" && laterThan(caught, next) {
		next = caught
	}
	if next != prev {
		if err := r.movePosition(ctx, tx, prev, next); err != nil {
			return prev, nil, err
		}
	}
	if ack > 0 {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO outbox_cdc_positions (outbox, consumer_group, slot_name, lsn, position_tx, position_offset)
			VALUES ($1, $2, $3, $4::pg_lsn, $5::xid8, $6)
			ON CONFLICT (outbox, consumer_group) DO UPDATE SET slot_name = excluded.slot_name, lsn = excluded.lsn,
				position_tx = excluded.position_tx, position_offset = excluded.position_offset, updated_at = now()`,
			r.config.Outbox.Topic, r.config.ConsumerGroup, f.slot, pglogrepl.LSN(ack).String(), next.txID, next.offset); err != nil {
			return prev, nil, fmt.Errorf("store relay position: record slot position: %w", err)
		}
	}
	return next, pending, nil
}

// heartbeat emits a logical decoding message in the outbox's database and
// reports the slot's health, every Config.HeartbeatInterval until ctx
// ends: the message reaches the relay through its slot even while the
// outbox is idle, so the slot's confirmed position follows the server's WAL
// instead of retaining it while other databases write.
func (f *feed) heartbeat(ctx context.Context) {
	t := time.NewTicker(f.r.config.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := f.r.db.ExecContext(ctx, `SELECT pg_logical_emit_message(false, $1, '')`, HeartbeatPrefix); err != nil && ctx.Err() == nil {
			f.r.logger.Warn("cdc relay: heartbeat failed", "err", err)
		}
		f.reportSlot(ctx)
	}
}

// reportSlot reports the slot's health to SlotMetrics.
func (f *feed) reportSlot(ctx context.Context) {
	m, ok := f.r.config.Metrics.(SlotMetrics)
	if !ok {
		return
	}
	var (
		status              sql.NullString
		retained, confirmed sql.NullFloat64
	)
	err := f.r.db.QueryRowxContext(ctx, `
		SELECT wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)
		FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&status, &retained, &confirmed)
	if err != nil {
		if ctx.Err() == nil {
			f.r.logger.Warn("cdc relay: read slot health", "slot", f.slot, "err", err)
		}
		return
	}
	m.Slot(status.String, int64(retained.Float64), int64(confirmed.Float64))
}

// close stops the feed's goroutines, sends the slot's last status and
// closes the replication connection. Call it after the stream's last mark,
// with read's ctx ended.
func (f *feed) close() {
	f.stopOnce.Do(func() { close(f.stop) })
	if f.reading {
		<-f.done
	}
	if f.catchup != nil { // read never ran
		f.catchup.close()
		f.catchup = nil
	}
	if f.recvDone != nil {
		_ = f.sendStatus(false)
		// The receiving goroutine reads the connection: close the socket
		// under it, then the connection.
		_ = f.conn.Conn().Close()
		<-f.recvDone
	}
	f.closeConn()
}

func (f *feed) closeConn() {
	if f.conn == nil {
		return
	}
	pid := f.conn.PID()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = f.conn.Close(ctx)
	f.awaitRelease(pid)
}

// slotReleaseWait bounds how long a closing feed waits for the server to
// release its slot.
const slotReleaseWait = 10 * time.Second

// awaitRelease waits until the server has ended the walsender pid of the
// closed replication connection, which keeps the slot active for a moment
// after the connection closed: so that when the relay's Close returns,
// DropSlot or another relay finds the slot free. It gives up after
// slotReleaseWait or on an error of the relay's pool.
func (f *feed) awaitRelease(pid uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), slotReleaseWait)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		var held bool
		if err := f.r.db.GetContext(ctx, &held, `
			SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2)`,
			f.slot, int64(pid)); err != nil || !held {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// SlotStatus is the replication slot of a cdc relay's outbox and consumer
// group, as the server and the relay's record show it.
type SlotStatus struct {
	Outbox        string `json:"outbox"`
	ConsumerGroup string `json:"consumer_group"`
	Slot          string `json:"slot"`
	// Exists is false for a slot the relay recorded and the server no
	// longer has (dropped); the relay creates it again.
	Exists bool `json:"exists"`
	// ActivePID is the session streaming from the slot; 0: none.
	ActivePID int64 `json:"active_pid"`
	// WALStatus is pg_replication_slots.wal_status; "lost": the server
	// removed WAL the slot needed, and the relay creates it again.
	WALStatus string `json:"wal_status"`
	// RetainedBytes is the WAL the slot keeps, from its restart_lsn.
	RetainedBytes int64 `json:"retained_bytes"`
	// ConfirmedLagBytes is the WAL written since the slot's confirmed
	// position.
	ConfirmedLagBytes int64 `json:"confirmed_lag_bytes"`
	// ConfirmedLSN is the slot's confirmed position, RecordedLSN the
	// relay's record (outbox_cdc_positions), empty when there is none.
	ConfirmedLSN string `json:"confirmed_lsn"`
	RecordedLSN  string `json:"recorded_lsn"`
}

// Slots returns the replication slots of box's cdc relays in db: one per
// consumer group that has a record or a position, whose slot (the
// recorded one, or the default name) exists or is recorded.
func Slots(ctx context.Context, db *sqlx.DB, box outbox.Config) ([]SlotStatus, error) {
	var dbName string
	if err := db.GetContext(ctx, &dbName, `SELECT current_database()`); err != nil {
		return nil, fmt.Errorf("cdc slots: %w", err)
	}
	type candidate struct{ group, slot, recorded string }
	var cands []candidate
	seen := map[string]bool{}
	rows, err := db.QueryxContext(ctx, `
		SELECT consumer_group, slot_name, lsn::text FROM outbox_cdc_positions WHERE outbox = $1 ORDER BY consumer_group`, box.Topic)
	if err != nil {
		return nil, fmt.Errorf("cdc slots: %w", err)
	}
	for rows.Next() {
		var c candidate
		if err := rows.Scan(&c.group, &c.slot, &c.recorded); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cdc slots: %w", err)
		}
		cands, seen[c.group] = append(cands, c), true
	}
	rows.Close()
	var groups []string
	if err := db.SelectContext(ctx, &groups, `SELECT consumer_group FROM `+box.OffsetsTable()+` ORDER BY consumer_group`); err != nil {
		return nil, fmt.Errorf("cdc slots: %w", err)
	}
	for _, g := range groups {
		if !seen[g] {
			cands = append(cands, candidate{group: g, slot: slotName(dbName, box.Topic, g)})
		}
	}
	var out []SlotStatus
	for _, c := range cands {
		s := SlotStatus{Outbox: box.Topic, ConsumerGroup: c.group, Slot: c.slot, RecordedLSN: c.recorded}
		var (
			walStatus, confirmed sql.NullString
			pid                  sql.NullInt64
			retained, lag        sql.NullFloat64
		)
		err := db.QueryRowxContext(ctx, `
			SELECT wal_status, active_pid, confirmed_flush_lsn::text,
			       pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)
			FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, c.slot).
			Scan(&walStatus, &pid, &confirmed, &retained, &lag)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			if c.recorded == "" {
				continue // a polling group, never run as cdc
			}
		case err != nil:
			return nil, fmt.Errorf("cdc slots: %w", err)
		default:
			s.Exists, s.WALStatus, s.ActivePID, s.ConfirmedLSN = true, walStatus.String, pid.Int64, confirmed.String
			s.RetainedBytes, s.ConfirmedLagBytes = int64(retained.Float64), int64(lag.Float64)
		}
		out = append(out, s)
	}
	return out, nil
}

// ErrSlotActive is returned by DropSlot for a slot a relay streams from.
var ErrSlotActive = errors.New("replication slot in use by a running cdc relay")

// DropSlot drops the replication slot of box's cdc relay of consumer group
// group in db, and its record, so that the server no longer keeps WAL for
// it: for a relay retired or switched to a polling kind for good. The
// stored position stays: a cdc relay started later creates a new slot and
// reads the outbox from it. It refuses a slot in use (ErrSlotActive) and
// reports whether there was a slot. Once a cdc relay's Close has returned,
// its slot is no longer in use: Close waits (up to 10 s) for the server to
// end the relay's replication session.
func DropSlot(ctx context.Context, db *sqlx.DB, box outbox.Config, group string) (bool, error) {
	slots, err := Slots(ctx, db, box)
	if err != nil {
		return false, err
	}
	for _, s := range slots {
		if s.ConsumerGroup != group {
			continue
		}
		if s.ActivePID != 0 {
			return false, fmt.Errorf("cdc slot %s: %w (pid %d); stop the relay first", s.Slot, ErrSlotActive, s.ActivePID)
		}
		if s.Exists {
			if _, err := db.ExecContext(ctx, `SELECT pg_drop_replication_slot($1)`, s.Slot); err != nil {
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: a relay started meanwhile
					return false, fmt.Errorf("cdc slot %s: %w; stop the relay first", s.Slot, ErrSlotActive)
				}
				return false, fmt.Errorf("drop replication slot %s: %w", s.Slot, err)
			}
		}
		if _, err := db.ExecContext(ctx, `DELETE FROM outbox_cdc_positions WHERE outbox = $1 AND consumer_group = $2`, box.Topic, group); err != nil {
			return false, fmt.Errorf("drop replication slot %s: forget its record: %w", s.Slot, err)
		}
		return s.Exists, nil
	}
	return false, nil
}
