package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pw is the password of the connection strings below; none of the
// strings' other parts contains it.
const pw = "Zq7sekrit"

// connStrings are connection strings holding pw, well-formed and not, by
// name.
var connStrings = map[string]string{
	"postgres URL":              "postgres://app:" + pw + "@127.0.0.1:5432/db?sslmode=disable",
	"amqp URL":                  "amqp://app:" + pw + "@127.0.0.1:5672/vhost",
	"escaped password":          "postgres://app:" + pw + "%21%40@127.0.0.1/db",
	"password in the query":     "postgres://app@127.0.0.1/db?password=" + pw + "&sslmode=disable",
	"space in the password":     "amqp://app:" + pw + " x@127.0.0.1/",
	"bad port":                  "amqp://app:" + pw + "@127.0.0.1:port/",
	"bad escape":                "postgres://app:" + pw + "%zz@127.0.0.1/db",
	"slash in the password":     "amqp://app:" + pw + "/x@127.0.0.1/",
	"at sign in the password":   "amqp://app:" + pw + "@x@127.0.0.1/",
	"quote in the password":     `amqp://app:` + pw + `"q@127.0.0.1:port/`,
	"key=value":                 "host=127.0.0.1 user=app password=" + pw + " dbname=db",
	"key = value":               "host=127.0.0.1 user=app password = " + pw + " dbname=db",
	"quoted key=value":          "host=127.0.0.1 password='" + pw + ` it\'s' dbname=db`,
	"unterminated quoted value": "host=127.0.0.1 password='" + pw + " dbname=db",
	"no scheme":                 "app:" + pw + "@127.0.0.1:5432/db",
	"one slash":                 "postgres:/app:" + pw + "@127.0.0.1/db",
	"no slash":                  "postgres:app:" + pw + "@127.0.0.1/db",
	"two hosts":                 "postgres://app:" + pw + "@127.0.0.1:5432,127.0.0.2:5432/db",
	"control character":         "amqp://app:" + pw + "\x01@127.0.0.1/",
}

func TestRedact(t *testing.T) {
	for name, raw := range connStrings {
		t.Run(name, func(t *testing.T) {
			got := Redact(raw)
			if strings.Contains(got, pw) || strings.Contains(got, url.PathEscape(pw)) {
				t.Errorf("Redact(%q) = %q shows the password", raw, got)
			}
			if !strings.Contains(got, Mask) {
				t.Errorf("Redact(%q) = %q has no mask", raw, got)
			}
		})
	}
	for _, tc := range []struct{ raw, want string }{
		{"postgres://app:" + pw + "@127.0.0.1:5432/db?sslmode=disable", "postgres://app:xxxxx@127.0.0.1:5432/db?sslmode=disable"},
		{"amqp://guest@127.0.0.1:5672/", "amqp://guest@127.0.0.1:5672/"},
		{"postgres://127.0.0.1/db?sslmode=verify-full&sslrootcert=/ca.pem", "postgres://127.0.0.1/db?sslmode=verify-full&sslrootcert=/ca.pem"},
		{"host=db user=app password=" + pw + " dbname=x", "host=db user=app password=xxxxx dbname=x"},
		{"amqp://app:" + pw + "@127.0.0.1:port/", "amqp://app:xxxxx@127.0.0.1:port/"},
		{"postgres://127.0.0.1/db?application_name=a@b", "postgres://127.0.0.1/db?application_name=a@b"},
		{"postgres:/app:" + pw + "@127.0.0.1/db", "postgres:/app:xxxxx@127.0.0.1/db"},
	} {
		if got := Redact(tc.raw); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.raw, got, tc.want)
		}
	}
}

func TestPasswords(t *testing.T) {
	for name, raw := range connStrings {
		t.Run(name, func(t *testing.T) {
			got := Passwords(raw)
			if !slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, pw) }) {
				t.Errorf("Passwords(%q) = %q, none holds the password", raw, got)
			}
			for _, s := range got {
				if len(s) < minSecret {
					t.Errorf("Passwords(%q) has %q, shorter than %d", raw, s, minSecret)
				}
			}
		})
	}
	t.Run("decoded", func(t *testing.T) {
		if got := Passwords("postgres://app:" + pw + "%21%40@127.0.0.1/db"); !slices.Contains(got, pw+"!@") {
			t.Errorf("Passwords = %q, want the decoded password among them", got)
		}
	})
	t.Run("none", func(t *testing.T) {
		for _, raw := range []string{"postgres://app@127.0.0.1:5432/db?sslmode=disable", "host=db user=app", "amqp://u:abc@127.0.0.1/", ""} {
			if got := Passwords(raw); len(got) != 0 {
				t.Errorf("Passwords(%q) = %q, want none", raw, got)
			}
		}
	})
}

// TestSecrets_Writer checks that what quotes a connection string, as
// parse errors do, is written without its password, in every way the
// standard library quotes it.
func TestSecrets_Writer(t *testing.T) {
	for name, raw := range connStrings {
		t.Run(name, func(t *testing.T) {
			var secrets Secrets
			var buf bytes.Buffer
			w := secrets.Writer(&buf)
			secrets.Hide(raw)
			logger := slog.New(slog.NewTextHandler(w, nil))
			_, parseErr := url.Parse(raw)
			fmt.Fprintf(w, "plain %s\nquoted %q\nerror %v\n", raw, raw, parseErr)
			logger.Error("open failed", "url", raw, "err", fmt.Errorf("wrapped: %w", parseErr))
			logger.Info("json", slog.Group("g", "url", raw))
			out := buf.String()
			if strings.Contains(out, pw) {
				t.Errorf("the password got through:\n%s", out)
			}
			if !strings.Contains(out, "open failed") || !strings.Contains(out, Mask) {
				t.Errorf("the text is not there, masked:\n%s", out)
			}
		})
	}
	t.Run("added later", func(t *testing.T) {
		var secrets Secrets
		var buf bytes.Buffer
		w := secrets.Writer(&buf)
		fmt.Fprint(w, "before ")
		secrets.Hide(connStrings["amqp URL"])
		fmt.Fprint(w, "after "+pw)
		if got := buf.String(); got != "before after xxxxx" {
			t.Errorf("wrote %q", got)
		}
	})
	t.Run("defaults are not secrets", func(t *testing.T) {
		var secrets Secrets
		secrets.Hide(DefaultAMQPURL, DefaultDatabaseURL)
		if got := secrets.Scrub("user guest"); got != "user guest" {
			t.Errorf("Scrub = %q", got)
		}
	})
	t.Run("longest first", func(t *testing.T) {
		var secrets Secrets
		secrets.Hide("amqp://a:abcd@h/", "amqp://b:abcdefgh@h/")
		if got := secrets.Scrub("abcdefgh abcd"); got != "xxxxx xxxxx" {
			t.Errorf("Scrub = %q", got)
		}
	})
	t.Run("write length", func(t *testing.T) {
		var secrets Secrets
		secrets.Hide(connStrings["amqp URL"])
		var buf bytes.Buffer
		n, err := secrets.Writer(&buf).Write([]byte("x " + pw))
		if err != nil || n != len("x "+pw) {
			t.Errorf("Write = (%d, %v), want all of p written", n, err)
		}
	})
}

func TestSecretEnv(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	const secretURL = "postgres://app:" + pw + "@127.0.0.1/db"
	withNewline := write("newline", secretURL+"\n", 0o600)
	withCRLF := write("crlf", secretURL+"\r\n", 0o600)
	bare := write("bare", secretURL, 0o600)
	empty := write("empty", "\n", 0o600)
	large := write("large", strings.Repeat("x", MaxSecretFile+1), 0o600)
	for _, tc := range []struct {
		name        string
		value, file string
		want        string
		wantErr     []string
	}{
		{name: "default", want: "def"},
		{name: "variable", value: secretURL, want: secretURL},
		{name: "file with a newline", file: withNewline, want: secretURL},
		{name: "file with CRLF", file: withCRLF, want: secretURL},
		{name: "file without a newline", file: bare, want: secretURL},
		{name: "both", value: secretURL, file: bare, wantErr: []string{"OBM_TEST_URL and OBM_TEST_URL_FILE are both set"}},
		{name: "missing file", file: filepath.Join(dir, "missing"), wantErr: []string{"OBM_TEST_URL_FILE", "missing", "no such file"}},
		{name: "directory", file: dir, wantErr: []string{"OBM_TEST_URL_FILE", "not a regular file"}},
		{name: "empty file", file: empty, wantErr: []string{"OBM_TEST_URL_FILE", "empty"}},
		{name: "large file", file: large, wantErr: []string{"OBM_TEST_URL_FILE", "larger than"}},
		{name: "path through a file", file: filepath.Join(bare, "x"), wantErr: []string{"OBM_TEST_URL_FILE", "not a directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OBM_TEST_URL", tc.value)
			t.Setenv("OBM_TEST_URL_FILE", tc.file)
			got, err := SecretEnv("OBM_TEST_URL", "def")
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Errorf("SecretEnv = (%q, %v), want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("SecretEnv = %q, want an error", got)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), pw) {
				t.Errorf("error %q shows the file's content", err)
			}
			if tc.name == "missing file" && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("error %q does not wrap fs.ErrNotExist", err)
			}
		})
	}
}
