package bench

import (
	"bytes"
	"context"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	t.Run("command with spaces and parentheses", func(t *testing.T) {
		line := "1234 (postgres: a (b) c) S 77 1234 1234 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 1 0 5 0 0"
		st, err := parseProcStat(line)
		if err != nil {
			t.Fatal(err)
		}
		if st.comm != "postgres: a (b) c" || st.ppid != 77 || st.cpu != 3.8 {
			t.Errorf("got %+v, want comm %q, ppid 77, cpu 3.8 s", st, "postgres: a (b) c")
		}
	})
	t.Run("malformed", func(t *testing.T) {
		for _, line := range []string{"", "12 no parens", "12 (x) S 1 2"} {
			if _, err := parseProcStat(line); err == nil {
				t.Errorf("parseProcStat(%q): no error", line)
			}
		}
	})
}

func TestParseSS(t *testing.T) {
	out := "0      0      127.0.0.1:43848 127.0.0.1:5672\n" +
		"\t cubic wscale:10,10 rto:204 bytes_sent:8 bytes_acked:9 bytes_received:504 segs_out:4\n" +
		"0      0      127.0.0.1:43850 127.0.0.1:5672\n" +
		"\t cubic bytes_sent:1000 bytes_received:20\n"
	got := parseSS(out)
	want := map[string][2]float64{"127.0.0.1:43848": {8, 504}, "127.0.0.1:43850": {1000, 20}}
	if len(got) != len(want) {
		t.Fatalf("parseSS = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("socket %s = %v, want %v", k, got[k], v)
		}
	}
}

func TestParseLSN(t *testing.T) {
	got, err := parseLSN("16/B374D848")
	if err != nil || got != 0x16<<32|0xB374D848 {
		t.Errorf("parseLSN = %x, %v", got, err)
	}
	for _, bad := range []string{"", "16", "x/1", "1/y"} {
		if _, err := parseLSN(bad); err == nil {
			t.Errorf("parseLSN(%q): no error", bad)
		}
	}
}

// TestLabelShares profiles two labelled goroutines spinning for different
// times and checks the shares follow the labels.
func TestLabelShares(t *testing.T) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		t.Skipf("a CPU profile runs already: %v", err)
	}
	spin := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); {
		}
	}
	done := make(chan struct{})
	go labelled(context.Background(), componentRelay, func(context.Context) { spin(300 * time.Millisecond); done <- struct{}{} })
	<-done
	go labelled(context.Background(), componentConsumer, func(context.Context) { spin(100 * time.Millisecond); done <- struct{}{} })
	<-done
	pprof.StopCPUProfile()
	shares, err := labelShares(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !(shares[componentRelay] > shares[componentConsumer] && shares[componentConsumer] > 0) {
		t.Errorf("shares %v: want the relay's above the consumer's, both above zero", shares)
	}
}

func TestReport_costMatrix(t *testing.T) {
	rep := &Report{Variants: []VariantInfo{{Key: BaselineFloor, Label: "floor"}, {Key: "relay/x", Label: "relay x"}}}
	m := &costMeter{ss: true, broker: 1}
	for _, v := range []string{BaselineFloor, "relay/x"} {
		cpu := map[string]float64{termPGProducers: 0.1, termBroker: 0.2}
		if v != BaselineFloor {
			cpu[termRelay] = 0.05
		}
		rep.Figures = append(rep.Figures, m.figures(v, []costSample{{Events: 1000, CPU: cpu, WAL: 1e6, BrokerIn: 5e5, BrokerOut: 5e5, BrokerDisk: 2e6}})...)
	}
	var b strings.Builder
	rep.writeCostMarkdown(&b)
	for _, want := range []string{
		"| per event | floor | relay x |",
		"| CPU µs, postgres: producers' sessions | 100 | 100 |",
		"| CPU µs, relay | - | 50 |",
		"| CPU µs, total | 300 | 350 |",
		"| WAL bytes | 1.00k | 1.00k |",
		"| broker bytes, to and from | 1.00k | 1.00k |",
		"| broker bytes, to disk | 2.00k | 2.00k |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("cost matrix lacks %q:\n%s", want, b.String())
		}
	}
}
