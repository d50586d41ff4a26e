package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// stallReportEvery is how often a wait for the consumer that sees no event
// handled prints what holds it back.
const stallReportEvery = 5 * time.Second

// stallReportTimeout bounds the queries of one stall report, which also
// runs after the run's context ended.
const stallReportTimeout = 10 * time.Second

// horizonHolder is the session whose transaction holds the server's xmin
// horizon back the most, as pg_stat_activity shows it.
type horizonHolder struct {
	PID      int
	Database string
	State    string
	// Age is how long the session's transaction has been open.
	Age time.Duration
	// XID is the transaction's id (backend_xid), empty when it wrote
	// nothing; XMin is its snapshot's xmin (backend_xmin), empty when it
	// holds no snapshot.
	XID, XMin string
	// Query is the start of the session's current or last statement, on
	// one line.
	Query       string
	Application string
}

// String renders h for a progress line or an error.
func (h horizonHolder) String() string {
	orNone := func(s string) string {
		if s == "" {
			return "none"
		}
		return s
	}
	return fmt.Sprintf("pid %d on database %q (%s, transaction open %.1f s, backend_xid %s, backend_xmin %s, application %q, query %q)",
		h.PID, h.Database, h.State, h.Age.Seconds(), orNone(h.XID), orNone(h.XMin), h.Application, h.Query)
}

// queryPrefix is how much of a holder's query a report shows.
const queryPrefix = 80

// oldestHolder returns the session on conn's server, other than conn's own,
// whose transaction holds the xmin horizon back the most, or nil when none
// does. A transaction holding a transaction id comes first: the outbox's
// visibility rule (rows of transactions older than the oldest one still
// running, pg_snapshot_xmin) waits for the oldest of those. Without one, the
// session with the oldest snapshot xmin (which holds back vacuum) is
// returned.
func oldestHolder(ctx context.Context, conn *pgx.Conn) (*horizonHolder, error) {
	var h horizonHolder
	var ageSeconds float64
	err := conn.QueryRow(ctx, `
		SELECT pid, coalesce(datname, ''), coalesce(state, ''),
		       coalesce(extract(epoch FROM clock_timestamp() - xact_start), 0)::float8,
		       coalesce(backend_xid::text, ''), coalesce(backend_xmin::text, ''),
		       left(coalesce(query, ''), $1), coalesce(application_name, '')
		FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
		ORDER BY backend_xid IS NULL, greatest(age(backend_xid), age(backend_xmin)) DESC, xact_start
		LIMIT 1`, queryPrefix).
		Scan(&h.PID, &h.Database, &h.State, &ageSeconds, &h.XID, &h.XMin, &h.Query, &h.Application)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the xmin horizon's holder from pg_stat_activity: %w", err)
	}
	h.Age = max(0, time.Duration(ageSeconds*float64(time.Second)))
	h.Query = strings.Join(strings.Fields(h.Query), " ")
	return &h, nil
}

// stallReport says what holds a stalled wait back: the backlog (from
// backlog, when not nil) and the oldest transaction holding the server's
// xmin horizon back. It never fails: an error is reported in its text. It
// runs within stallReportTimeout, also after ctx ended.
func (e *env) stallReport(ctx context.Context, backlog func(context.Context) string) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stallReportTimeout)
	defer cancel()
	var parts []string
	if backlog != nil {
		parts = append(parts, backlog(ctx))
	}
	parts = append(parts, e.describeHolder(ctx))
	return strings.Join(parts, "; ")
}

// describeHolder names the oldest transaction holding the xmin horizon back.
func (e *env) describeHolder(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, e.servers.AdminDatabaseURL)
	if err != nil {
		return fmt.Sprintf("xmin horizon not read: connect as admin: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	h, err := oldestHolder(ctx, conn)
	switch {
	case err != nil:
		return "xmin horizon not read: " + err.Error()
	case h == nil:
		return "no transaction holds the xmin horizon back"
	default:
		return "oldest transaction holding the xmin horizon: " + h.String()
	}
}

// waitHandled waits until every event tr saw committed was handled, for at
// most Config.StallTimeout without an event handled (tracker.waitHandled).
// While none is handled it prints, every stallReportEvery, a progress line
// saying what holds the wait back (stallReport with backlog); when the wait
// ends with events not handled, or ctx ends, it returns that diagnosis as
// stall.
func (e *env) waitHandled(ctx context.Context, label string, tr *tracker, backlog func(context.Context) string) (lost int64, stall string, err error) {
	every := e.stallEvery
	if every == 0 {
		every = stallReportEvery
	}
	lost, err = tr.waitHandled(ctx, e.cfg.StallTimeout, every, func(notHandled int64, idle time.Duration) {
		e.progress("wait   %-24s %d events not handled, none for %.1f s (gives up after %s): %s",
			label, notHandled, idle.Seconds(), e.cfg.StallTimeout, e.stallReport(ctx, backlog))
	})
	if lost > 0 || err != nil {
		stall = e.stallReport(ctx, backlog)
	}
	return lost, stall, err
}

// pipelineBacklog returns the backlog of a stall report on p: the events
// committed and not handled and, with an outbox, the rows past the relay's
// stored position.
func (r *runner) pipelineBacklog(p *pipeline) func(context.Context) string {
	return func(ctx context.Context) string {
		return fmt.Sprintf("backlog: %d committed events not handled%s", p.tr.inFlight(), r.inFlightAt(ctx, p))
	}
}
