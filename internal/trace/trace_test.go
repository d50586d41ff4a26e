package trace

import (
	"sync"
	"testing"
	"time"
)

type recorder struct {
	mu    sync.Mutex
	marks []string
}

func (r *recorder) Mark(stage Stage, eventID string, _ time.Time) {
	r.mu.Lock()
	r.marks = append(r.marks, stage.String()+":"+eventID)
	r.mu.Unlock()
}

func TestMark(t *testing.T) {
	Mark(Read, "before") // nothing installed: dropped
	if On() {
		t.Fatal("On with no recorder installed")
	}
	r := &recorder{}
	remove := Install(r)
	if !On() {
		t.Fatal("not On with a recorder installed")
	}
	Mark(Read, "a")
	Mark(Started, "a")
	remove()
	Mark(Published, "after")
	if len(r.marks) != 2 || r.marks[0] != "read:a" || r.marks[1] != "started:a" {
		t.Fatalf("marks %v, want read:a and started:a only", r.marks)
	}
	// A recorder installed after another stays when the first is removed.
	first := Install(&recorder{})
	second := &recorder{}
	removeSecond := Install(second)
	defer removeSecond()
	first()
	Mark(Received, "b")
	if len(second.marks) != 1 {
		t.Fatalf("second recorder got %v", second.marks)
	}
}
