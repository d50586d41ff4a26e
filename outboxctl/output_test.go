package outboxctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxmill/outboxmill/adapters/outbox"
	"github.com/outboxmill/outboxmill/adapters/rabbitmq"
	"github.com/outboxmill/outboxmill/internal/cli/clitest"
	"github.com/outboxmill/outboxmill/internal/testdb"
	"github.com/outboxmill/outboxmill/internal/testenv"
	"github.com/outboxmill/outboxmill/module"
	"github.com/outboxmill/outboxmill/modules"
	"github.com/outboxmill/outboxmill/outboxctl"
)

// Hostile text, as an attacker would store it in a message: escape
// sequences that set the window title, clear the screen and colour the
// rest, a carriage return and a newline that forge an "OK" line, a C1
// control (8-bit CSI) and a bidi override.
const (
	hostile = "\x1b]0;owned\x07\x1b[2J\x1b[31m\rOK: forged\nOK: forged line\u009b31m\u202eevil"
	// hostileEscaped is how a table cell or field shows hostile.
	hostileEscaped = `\x1b]0;owned\x07\x1b[2J\x1b[31m\rOK: forged\nOK: forged line\u009b31m\u202eevil`
	// hostileLine is how a one-line cell shows it: white space runs are
	// one space.
	hostileLine = `\x1b]0;owned\x07\x1b[2J\x1b[31m OK: forged OK: forged line\u009b31m\u202eevil`
	// hostileBlock is how a payload shows it: lines indented, newlines
	// kept.
	hostileBlock = "  \\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\rOK: forged\n  OK: forged line\\u009b31m\\u202eevil"
	// payloadEnd ends the hostile payload: a bounded output never shows
	// it.
	payloadEnd = "END-OF-PAYLOAD"
)

// hostilePayload is a payload of 1 MiB that starts with hostile text, a
// NUL byte and invalid UTF-8.
func hostilePayload() []byte {
	start := hostile + "\x00\xff\xfe"
	return []byte(start + strings.Repeat("x", 1<<20-len(start)-len(payloadEnd)) + payloadEnd)
}

// terminalControls returns what out holds that a terminal would act on:
// control characters but newline and tab, C1 and bidi controls, line and
// paragraph separators, and bytes of invalid UTF-8, each quoted with its
// offset.
func terminalControls(out string) []string {
	var found []string
	for i, r := range out {
		bad := r == utf8.RuneError && !strings.HasPrefix(out[i:], "\uFFFD") ||
			r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f ||
			r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r)
		if bad && len(found) < 5 {
			found = append(found, fmt.Sprintf("%q at %d", r, i))
		}
	}
	return found
}

// checkSafe fails t if out holds anything a terminal would act on.
func checkSafe(t *testing.T, what, out string) {
	t.Helper()
	if bad := terminalControls(out); len(bad) > 0 {
		t.Errorf("%s writes raw control characters: %v", what, bad)
	}
}

// forgedLine matches a line an attacker forged.
var forgedLine = regexp.MustCompile(`(?m)^OK: forged`)

// TestMain_HostileStoredText stores hostile text and 1 MiB payloads in
// set-aside messages, outbox rows a relay set aside and outbox rows, and
// checks what every command that shows them prints: nothing a terminal
// acts on, a bounded payload unless -full, and valid JSON that decodes to
// what was stored.
func TestMain_HostileStoredText(t *testing.T) {
	clearEnv(t)
	ctx := context.Background()
	db := testdb.NewServices(t)
	set := modules.Samples()
	flags := []string{"--database-url", db.URL, "--amqp-url", clitest.UnreachableBroker, "--namespace", "obm-hostile"}
	run := func(want int, args ...string) string {
		t.Helper()
		stdout, stderr, code := ctl(set, append(args, flags...)...)
		if code != want {
			t.Fatalf("outboxctl %v: exit %d, want %d\nstdout:\n%.2000s\nstderr:\n%s", args, code, want, stdout, stderr)
		}
		checkSafe(t, fmt.Sprintf("outboxctl %v (stdout)", args), stdout)
		checkSafe(t, fmt.Sprintf("outboxctl %v (stderr)", args), stderr)
		if forgedLine.MatchString(stdout) {
			t.Errorf("outboxctl %v prints a forged line:\n%.2000s", args, stdout)
		}
		return stdout
	}
	payload := hostilePayload()
	rawID := []byte("id-\x00\xff-" + hostile)
	metadata, err := json.Marshal(map[string]string{"event_type": hostile, "k" + hostile: "v" + hostile})
	if err != nil {
		t.Fatal(err)
	}
	var consumerIDs [2]int64
	for i := range consumerIDs {
		if err := db.GetContext(ctx, &consumerIDs[i], `INSERT INTO set_aside_messages
				(handler, message_id, topic, payload, metadata, reason, attempts, message_id_raw)
			VALUES ('settlement.ledger', $1, $2, $3, $4, $5, 1, $6) RETURNING id`,
			"m-"+hostile, "q"+hostile, payload, string(metadata), "reason "+hostile, rawID); err != nil {
			t.Fatal(err)
		}
	}
	var outboxID int64
	if err := db.GetContext(ctx, &outboxID, `INSERT INTO outbox_set_aside (outbox, message_id, payload, reason)
		VALUES ('orders_outbox', $1, $2, $3) RETURNING id`, "o-"+hostile, payload, "reason "+hostile); err != nil {
		t.Fatal(err)
	}
	// Two events in the orders outbox: one whose envelope holds a hostile
	// event id, one a hostile event type.
	events := db.WriteEvents(t, 2)
	for i, path := range []string{"{uuid}", "{metadata,event_type}"} {
		if _, err := db.ExecContext(ctx, `UPDATE `+testdb.Outbox.Table()+`
			SET payload = jsonb_set(payload::jsonb, $1::text[], to_jsonb($2::text))::json
			WHERE payload::jsonb ->> 'uuid' = $3`, path, hostile, events[i].ID); err != nil {
			t.Fatal(err)
		}
	}
	consumer := fmt.Sprintf("c%d@settlement", consumerIDs[0])
	outboxRow := fmt.Sprintf("o%d@orders", outboxID)

	t.Run("set-aside list", func(t *testing.T) {
		out := run(outboxctl.ExitOK, "set-aside", "list")
		if !strings.Contains(out, `m-\x1b]0;owned\x07`) || !strings.Contains(out, `reason \x1b]0;owned\x07`) {
			t.Errorf("list does not show the hostile id and reason escaped:\n%s", out)
		}
	})
	for _, id := range []string{consumer, outboxRow} {
		t.Run("set-aside show "+id, func(t *testing.T) {
			out := run(outboxctl.ExitOK, "set-aside", "show", id)
			if len(out) > 64<<10 || strings.Contains(out, payloadEnd) {
				t.Errorf("show prints %d bytes, the payload's end included: %v", len(out), strings.Contains(out, payloadEnd))
			}
			for _, want := range []string{
				"reason " + hostileEscaped,
				fmt.Sprintf("payload (%d bytes, not UTF-8", len(payload)),
				hostileBlock + `\x00\xff\xfexxx`,
				fmt.Sprintf("... %d more bytes not shown", len(payload)-4096),
			} {
				if !strings.Contains(out, want) {
					t.Errorf("show lacks %q:\n%.3000s", want, out)
				}
			}
			if id == consumer {
				for _, want := range []string{"message id", "m-" + hostileEscaped, fmt.Sprint(len(rawID)) + ` bytes, not text an index holds: id-\x00\xff-` + hostileEscaped,
					"metadata k" + hostileEscaped, "v" + hostileEscaped} {
					if !strings.Contains(out, want) {
						t.Errorf("show lacks %q:\n%.3000s", want, out)
					}
				}
			}

			full := run(outboxctl.ExitOK, "set-aside", "show", "-full", id)
			if len(full) < len(payload) || !strings.Contains(full, strings.Repeat("x", 1000)+payloadEnd+"\n") || strings.Contains(full, "not shown") {
				t.Errorf("show -full prints %d bytes, the payload's end included: %v", len(full), strings.Contains(full, payloadEnd))
			}

			// JSON: valid, and what was stored, byte for byte.
			js := run(outboxctl.ExitOK, "set-aside", "show", id, "--json")
			var e outboxctl.SetAsideJSON
			if err := json.Unmarshal([]byte(js), &e); err != nil {
				t.Fatalf("show --json: %v\n%.2000s", err, js)
			}
			if string(e.Payload) != string(payload) || e.Reason != "reason "+hostile || e.PayloadText != "" {
				t.Errorf("show --json: payload of %d bytes (equal: %v), reason %q, payload text of %d bytes",
					len(e.Payload), string(e.Payload) == string(payload), e.Reason, len(e.PayloadText))
			}
			if id == consumer && (e.MessageID != "m-"+hostile || string(e.RawMessageID) != string(rawID) || e.Metadata["k"+hostile] != "v"+hostile) {
				t.Errorf("show --json: message id %q, raw %q, metadata %q", e.MessageID, e.RawMessageID, e.Metadata)
			}
		})
	}
	t.Run("set-aside list --json", func(t *testing.T) {
		var list []outboxctl.SetAsideJSON
		if err := json.Unmarshal([]byte(run(outboxctl.ExitOK, "set-aside", "list", "--json")), &list); err != nil {
			t.Fatal(err)
		}
		if len(list) != 3 || list[0].MessageID != "m-"+hostile || list[2].Reason != "reason "+hostile {
			t.Errorf("list --json: %+v", list)
		}
	})
	t.Run("status", func(t *testing.T) {
		out := run(outboxctl.ExitAttention, "status", "--stuck-after", "0s")
		if !strings.Contains(out, hostileLine) || !strings.Contains(out, events[1].ID) {
			t.Errorf("status does not show the stuck events' hostile id and type escaped:\n%s", out)
		}
	})
	t.Run("set-aside discard", func(t *testing.T) {
		out := run(outboxctl.ExitOK, "set-aside", "discard", consumer)
		if !strings.Contains(out, "discarded "+consumer) || !strings.Contains(out, `m-\x1b]0;owned\x07`) {
			t.Errorf("discard:\n%s", out)
		}
	})
	t.Run("reconcile", func(t *testing.T) {
		out := run(outboxctl.ExitAttention, "reconcile", "--older-than", "0s")
		for _, want := range []string{"MISSING: 1 events", "UNKNOWN: 1 events", "DISCARDED: 1 events", hostileLine[:40], "reason " + hostileLine[:40]} {
			if !strings.Contains(out, want) {
				t.Errorf("reconcile lacks %q:\n%s", want, out)
			}
		}
	})
}

// TestMain_HostileUnroutable publishes messages no queue is bound to, with
// hostile headers and routing key and a 1 MiB body, and checks that
// "unroutable list" shows them escaped, in text and in JSON.
func TestMain_HostileUnroutable(t *testing.T) {
	clearEnv(t)
	ctx := context.Background()
	set := modules.Samples()
	names := module.Names{Namespace: testenv.UniqueName("obm-hostile-")}
	amqpURL := testenv.FromEnvironment().AMQPURL
	topology, err := set.Topology(names, rabbitmq.QueueClassic)
	if err != nil {
		t.Fatal(err)
	}
	if err := rabbitmq.Declare(ctx, amqpURL, topology); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rabbitmq.Delete(context.Background(), amqpURL, topology); err != nil {
			t.Errorf("delete topology: %v", err)
		}
	})
	conn, err := rabbitmq.Dial(ctx, amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := hostilePayload()
	const sent = 2
	for i := range sent {
		conf, err := ch.PublishWithDeferredConfirmWithContext(ctx, names.Exchange("orders"), "Nobody"+hostile+"."+fmt.Sprint(i), false, false, amqp.Publishing{
			Headers: amqp.Table{
				wmamqp.DefaultMessageUUIDHeaderKey: "m-" + hostile,
				outbox.MetaEventType:               "T" + hostile,
				outbox.MetaAggregateID:             "a-\x00\xff" + hostile,
				outbox.MetaOccurredAt:              "\x1b[2J",
			},
			Body: body,
		})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := conf.WaitContext(ctx); err != nil || !ok {
			t.Fatalf("publish: confirmed %v, %v", ok, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		q, err := ch.QueueDeclarePassive(names.Unroutable(), true, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages == sent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages in %s, want %d", q.Messages, names.Unroutable(), sent)
		}
		time.Sleep(20 * time.Millisecond)
	}

	flags := []string{"--database-url", clitest.UnreachableDatabase, "--amqp-url", amqpURL, "--namespace", names.Namespace}
	stdout, stderr, code := ctl(set, append([]string{"unroutable", "list"}, flags...)...)
	if code != outboxctl.ExitOK {
		t.Fatalf("unroutable list: exit %d\n%s", code, stderr)
	}
	checkSafe(t, "unroutable list", stdout)
	if forgedLine.MatchString(stdout) || len(stdout) > 8<<10 || !strings.Contains(stdout, `m-\x1b]0;owned\x07`) || !strings.Contains(stdout, `a-\x00\xff\x1b]0;owned`) {
		t.Errorf("unroutable list:\n%s", stdout)
	}

	stdout, stderr, code = ctl(set, append([]string{"unroutable", "list", "--json"}, flags...)...)
	if code != outboxctl.ExitOK {
		t.Fatalf("unroutable list --json: exit %d\n%s", code, stderr)
	}
	checkSafe(t, "unroutable list --json", stdout)
	var list outboxctl.UnroutableJSON
	if err := json.Unmarshal([]byte(stdout), &list); err != nil {
		t.Fatalf("unroutable list --json: %v\n%s", err, stdout)
	}
	if len(list.Shown) != sent || list.Shown[0].MessageID != "m-"+hostile || list.Shown[0].EventType != "T"+hostile ||
		list.Shown[1].RoutingKey != "Nobody"+hostile+".1" || list.Shown[0].Bytes != len(body) {
		t.Errorf("unroutable list --json: %+v", list.Shown)
	}
}
