package relay

import "testing"

func TestSnapshot_Sees(t *testing.T) {
	snap, err := parseSnapshot("100:110:100,104")
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint64]bool{99: true, 100: false, 101: true, 104: false, 109: true, 110: false, 200: false} {
		if got := snap.sees(id); got != want {
			t.Errorf("snapshot 100:110:100,104 sees %d: %v, want %v", id, got, want)
		}
	}
	for _, bad := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x", "1:2:3:4"} {
		if _, err := parseSnapshot(bad); err == nil {
			t.Errorf("parseSnapshot(%q) accepted", bad)
		}
	}
}
