package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outboxmill/outboxmill/internal/testdb"
)

// A relay that stops renewing its lease (as a frozen process does) loses it
// to the server, not to a guess: the server ends its session once it has
// been idle for LeaseTimeout, and only then can another relay take the
// lock. By then the old lease no longer lets its holder publish, and its
// session can no longer move the position.
func TestLease_AFrozenHolderIsReplacedAndFenced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, first, second, old, pos := holderAndStandby(t)
	if err := old.check(); err != nil {
		t.Fatalf("fresh lease: %v", err)
	}

	// Freeze the holder: it stops renewing.
	close(old.stop)
	<-old.done
	lastUse := old.validUntil.Load().Add(-cfg.LeaseTimeout * 9 / 10)

	acquireCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	next, err := second.acquireLease(acquireCtx)
	if err != nil {
		t.Fatalf("standby never took over: %v", err)
	}
	defer next.release()
	took := time.Since(lastUse)
	t.Logf("taken over %s after the frozen holder's last use (lease timeout %s, standby interval %s)",
		took, cfg.LeaseTimeout, cfg.StandbyInterval)
	if took < cfg.LeaseTimeout {
		t.Fatalf("taken over %s after the holder's last use, before its lease timeout %s", took, cfg.LeaseTimeout)
	}
	if err := old.check(); !errors.Is(err, errLeaseExpired) {
		t.Fatalf("old lease once replaced: %v, want errLeaseExpired", err)
	}
	moved := position{txID: pos.txID, offset: pos.offset + 1}
	if err := first.storePosition(ctx, old, pos, moved, nil); err == nil {
		t.Fatal("the replaced holder moved the position")
	}
	if err := second.storePosition(ctx, next, pos, moved, nil); err != nil {
		t.Fatalf("the new holder cannot move the position: %v", err)
	}
	_ = old.conn.Close()
}

// A holder frozen in the middle of a position update leaves its session
// idle inside a transaction: the server ends that session too after
// LeaseTimeout, rolling the update back, and a standby takes over.
func TestLease_AHolderFrozenInsideAnUpdateIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, _, second, old, pos := holderAndStandby(t)
	close(old.stop)
	<-old.done
	// Frozen after the UPDATE, before the COMMIT.
	tx, err := old.conn.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE `+cfg.Outbox.OffsetsTable()+` SET offset_acked = offset_acked + 1 WHERE consumer_group = $1`,
		DefaultConsumerGroup); err != nil {
		t.Fatal(err)
	}
	acquireCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	next, err := second.acquireLease(acquireCtx)
	if err != nil {
		t.Fatalf("standby never took over: %v", err)
	}
	defer next.release()
	if err := tx.Commit(); err == nil {
		t.Fatal("the frozen holder's update committed after it was replaced")
	}
	after, err := second.loadPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after != pos {
		t.Fatalf("position %+v, want %+v: the frozen update must roll back", after, pos)
	}
	_ = old.conn.Close()
}

// holderAndStandby returns two relays on one outbox with a lease timeout of
// 1 s, the first holding the lease, and the position it loaded.
func holderAndStandby(t *testing.T) (Config, *Outboxmill, *Outboxmill, *lease, position) {
	t.Helper()
	ctx := context.Background()
	db := testdb.NewOrders(t).DB
	cfg := Config{Outbox: testdb.Outbox, AMQPURL: "amqp://127.0.0.1:1/", Exchange: "unused",
		LeaseTimeout: time.Second, StandbyInterval: 50 * time.Millisecond}
	first, err := NewOutboxmill(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, err := NewOutboxmill(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	old, err := first.acquireLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pos, err := first.loadPosition(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, first, second, old, pos
}
